"""Mamba2 selective state update: one decode token per request advances its SSM state in place.

Follows mamba_ssm's `selective_state_update_ref` (state-spaces/mamba @ e9594ce1) with Mamba2's per-head
parameters, the shapes vLLM's Mamba2 decode uses:
- state [num_slots, nheads, head_dim, dstate], float32 or bfloat16, updated IN PLACE at the requests' slots
  (reference.mamba.slots: state_indices, pad_slot_id; pad rows skip the state and give out = 0).
- x [B, nheads, head_dim]; dt [B, nheads] (one dt per head); A [nheads]; B, C [B, ngroups, dstate], group g
  serving heads g * nheads / ngroups .. (g + 1) * nheads / ngroups - 1; D [nheads] or None; z like x or None;
  dt_bias [nheads] or None. Every input may be float32, bfloat16 or float16 (read as fp32); out has x's dtype.

`selective_state_update` is the precision mirror of kernels.mamba_state_update. Per request and head, in
fp32 (each operation rounds once to nearest even; no fused multiply-add):

    dt = dt + dt_bias                                   if dt_bias is given
    dt = dt if dt > 20 else log1p(exp(dt))              if dt_softplus (torch's softplus threshold 20)
    dA = exp(dt * A)                                    one scalar per (request, head)
    dB = dt * B[group]                                  [dstate]
    new = state * dA + dB[None, :] * x[:, None]         two rounded products, then one rounded add
    out = sum_n(new * C[group]) + D * x                 the sum runs over the unrounded fp32 new state
    out = out * (z * (1 / (1 + exp(-z))))               if z is given (SiLU gate)

then new is written to the slot in the state's dtype (one rounding, RNE) and out is rounded once to x's
dtype. Where kernel and mirror can differ: the transcendentals (exp, log1p on the interpreter's numpy or the
GPU's libdevice vs torch's) by an ulp or so, and the order of the dstate sum; the suite bounds both with the
("mamba_state_update", dtype) rows of kernels.tolerances. `selective_state_update_ideal` is the same math in
float64 on the same inputs (the state as stored), returning the fp64 new state of every slot and the fp64 out,
for SQNR.

Edge-case policy: IEEE throughout. NaN in a request's inputs reaches only that request's out row and state slot
(a NaN in x[i, h, p] makes row p of head h NaN in slot i and, through the dstate sum, out[i, h, p]; a NaN dt or
A makes the whole head NaN); other slots keep their bytes. dt = 0 (no bias, no softplus) gives dA = 1 and dB = 0:
the state is unchanged (but -0.0 becomes +0.0 when x * 0 is +0.0), out = C . state + D x. A = 0 gives dA = 1.
exp overflow gives Inf (then Inf * 0 = NaN where the state is 0). Subnormals are kept (no flush). The bf16 state
rounds to nearest even once, after the fp32 update; fp32 does not saturate.
"""

from __future__ import annotations

import torch

from reference.mamba.slots import check_state_indices, check_tensor, slot_rows

STATE_DTYPES = (torch.float32, torch.bfloat16)
INPUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
SOFTPLUS_THRESHOLD = 20.0


def _check_input(name: str, t: object, shape: tuple[int, ...], device: torch.device) -> None:
    check_tensor(name, t)
    if t.dtype not in INPUT_DTYPES:
        raise TypeError(f"{name}: dtype must be one of {INPUT_DTYPES}, got {t.dtype}")
    if tuple(t.shape) != shape:
        raise ValueError(f"{name}: shape must be {list(shape)}, got {list(t.shape)}")
    if t.device != device:
        raise ValueError(f"{name}: on {t.device}, the state is on {device}")


def check_selective_state_update_args(
    state, x, dt, A, B, C, D=None, z=None, dt_bias=None, state_indices=None
) -> tuple[int, int, int, int, int, int]:
    """Shapes, dtypes and devices (no tensor values: shared with the kernel launcher); TypeError or ValueError
    naming the argument. Returns (num_slots, batch, nheads, head_dim, dstate, ngroups)."""
    check_tensor("state", state)
    if state.dtype not in STATE_DTYPES:
        raise TypeError(f"state: dtype must be one of {STATE_DTYPES}, got {state.dtype}")
    if state.dim() != 4:
        raise ValueError(f"state: must be [num_slots, nheads, head_dim, dstate], got shape {list(state.shape)}")
    num_slots, nheads, head_dim, dstate = state.shape
    check_tensor("x", x)
    if x.dim() != 3:
        raise ValueError(f"x: must be [batch, nheads, head_dim], got shape {list(x.shape)}")
    batch = x.shape[0]
    _check_input("x", x, (batch, nheads, head_dim), state.device)
    _check_input("dt", dt, (batch, nheads), state.device)
    _check_input("A", A, (nheads,), state.device)
    check_tensor("B", B)
    if B.dim() != 3 or B.shape[0] != batch or B.shape[2] != dstate:
        raise ValueError(f"B: must be [batch {batch}, ngroups, dstate {dstate}], got shape {list(B.shape)}")
    ngroups = B.shape[1]
    if ngroups == 0 or nheads % ngroups:
        raise ValueError(f"B: ngroups {ngroups} must divide nheads {nheads}")
    _check_input("B", B, (batch, ngroups, dstate), state.device)
    _check_input("C", C, (batch, ngroups, dstate), state.device)
    if D is not None:
        _check_input("D", D, (nheads,), state.device)
    if z is not None:
        _check_input("z", z, (batch, nheads, head_dim), state.device)
    if dt_bias is not None:
        _check_input("dt_bias", dt_bias, (nheads,), state.device)
    check_state_indices(state_indices, batch, state.device)
    return num_slots, batch, nheads, head_dim, dstate, ngroups


def _silu_gate(z: torch.Tensor) -> torch.Tensor:
    one = torch.ones_like(z)
    return z * (one / (one + torch.exp(-z)))


def update_rows(state_rows, x, dt, A, B, C, D, z, dt_bias, dt_softplus, heads_per_group):
    """The pinned math on gathered rows (state_rows [n, H, P, N], x/z [n, H, P], dt [n, H], B/C [n, G, N],
    A/D/dt_bias [H]), all already in the compute dtype; no checks, no slots. Returns (new state rows, out)."""
    if dt_bias is not None:
        dt = dt + dt_bias
    if dt_softplus:
        dt = torch.where(dt > SOFTPLUS_THRESHOLD, dt, torch.log1p(torch.exp(dt)))
    dA = torch.exp(dt * A)  # [n, H]
    Bh = B.repeat_interleave(heads_per_group, dim=1)  # [n, H, N]
    Ch = C.repeat_interleave(heads_per_group, dim=1)
    dB = dt[..., None] * Bh
    new = state_rows * dA[..., None, None] + dB[:, :, None, :] * x[..., None]
    out = (new * Ch[:, :, None, :]).sum(-1)
    if D is not None:
        out = out + D[:, None] * x
    if z is not None:
        out = out * _silu_gate(z)
    return new, out


def _run(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, state_indices, pad_slot_id, dtype):
    num_slots, batch, nheads, _, _, ngroups = check_selective_state_update_args(
        state, x, dt, A, B, C, D, z, dt_bias, state_indices
    )
    pairs = slot_rows(state_indices, batch, num_slots, pad_slot_id, state.device)
    if not pairs:
        return None, None, pairs
    req = torch.tensor([i for i, _ in pairs], device=state.device)
    slot = torch.tensor([s for _, s in pairs], device=state.device)

    def rows(t):
        return None if t is None else t[req].to(dtype)

    def param(t):
        return None if t is None else t.to(dtype)

    new, out = update_rows(
        state[slot].to(dtype),
        rows(x),
        rows(dt),
        param(A),
        rows(B),
        rows(C),
        param(D),
        rows(z),
        param(dt_bias),
        dt_softplus,
        nheads // ngroups,
    )
    return new, out, (req, slot)


def selective_state_update(
    state: torch.Tensor,
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    dt_softplus: bool = False,
    state_indices: torch.Tensor | None = None,
    pad_slot_id: int = -1,
) -> torch.Tensor:
    """The fp32 precision mirror: updates `state` in place at the requests' slots, returns out [B, nheads,
    head_dim] in x's dtype (pad rows 0)."""
    new, out_rows, where = _run(
        state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, state_indices, pad_slot_id, torch.float32
    )
    out = torch.zeros(x.shape, dtype=x.dtype, device=x.device)
    if new is None:
        return out
    req, slot = where
    state[slot] = new.to(state.dtype)
    out[req] = out_rows.to(x.dtype)
    return out


def selective_state_update_ideal(
    state: torch.Tensor,
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    dt_softplus: bool = False,
    state_indices: torch.Tensor | None = None,
    pad_slot_id: int = -1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The same math in float64, nothing mutated: returns (the fp64 state after the update, every slot;
    out fp64 [B, nheads, head_dim], pad rows 0)."""
    new, out_rows, where = _run(
        state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, state_indices, pad_slot_id, torch.float64
    )
    new_state = state.to(torch.float64)
    out = torch.zeros(x.shape, dtype=torch.float64, device=x.device)
    if new is not None:
        req, slot = where
        new_state[slot] = new
        out[req] = out_rows
    return new_state, out
