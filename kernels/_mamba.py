"""Triton helpers shared by the Mamba decode kernels (kernels.mamba_state_update, kernels.mamba_conv1d_update):
the request -> state slot lookup with pad skipping, and the fp32 transcendentals of the references' pinned
formulas (reference.mamba.state_update, reference.mamba.conv1d).

The transcendentals are Triton's `tl.exp`/`tl.log` (ex2.approx / lg2.approx on NVIDIA, numpy's float32 on
the interpreter), not torch's, so they can differ from the references by a few ulps; the suites bound that
with ("mamba_state_update" | "mamba_conv1d_update", dtype) rows of kernels.tolerances. Divisions that the
references do in IEEE are `tl.div_rn` here.
"""

from __future__ import annotations

import triton
import triton.language as tl

# Planted bugs for the suites' negative controls; FAULT is a constexpr, so fault 0 compiles them away.
FAULTS = {
    "none": 0,
    "slot_is_row": 1,  # request i updates slot i, ignoring state_indices: another request's state is clobbered
}


@triton.jit
def request_slot(idx_ptr, row, num_slots, pad_slot_id, HAS_INDICES: tl.constexpr, FAULT: tl.constexpr):
    """(valid, slot as int64) of request `row`; a pad entry or one outside [0, num_slots) is not valid and its
    slot is 0 (a safe address: every access through it is masked off)."""
    if HAS_INDICES:
        slot = tl.load(idx_ptr + row).to(tl.int64)
        if FAULT == 1:
            slot = row.to(tl.int64)
    else:
        slot = row.to(tl.int64)
    valid = (slot != pad_slot_id) & (slot >= 0) & (slot < num_slots)
    return valid, tl.where(valid, slot, 0)


@triton.jit
def silu(v):
    """v * (1 / (1 + exp(-v))) in fp32, the division IEEE (the references' formula)."""
    return v * tl.div_rn(tl.full(v.shape, 1.0, tl.float32), 1.0 + tl.exp(-v))


@triton.jit
def log1p(u):
    """log(1 + u) accurate for small u (Triton has no log1p): with w = 1 + u rounded, log(w) * u / (w - 1)
    cancels w's rounding error (Goldberg, "What every computer scientist should know...", Thm. 4); u where
    w == 1."""
    w = 1.0 + u
    return tl.where(w == 1.0, u, tl.log(w) * tl.div_rn(u, w - 1.0))


@triton.jit
def softplus(v, THRESHOLD: tl.constexpr):
    """torch's softplus (beta 1): v above THRESHOLD, else log1p(exp(v)); NaN stays NaN."""
    return tl.where(v > THRESHOLD, v, log1p(tl.exp(v)))
