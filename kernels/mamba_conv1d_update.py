"""Mamba causal conv1d decode update in Triton: the kernel twin of
`reference.mamba.conv1d.causal_conv1d_update`.

Op: `touchstone::causal_conv1d_update(x, conv_state, weight, bias, activation, state_indices, pad_slot_id) ->
out`, mutating `conv_state`; call it through `causal_conv1d_update`, which has the reference's signature.

Grid (batch, cdiv(dim, BLOCK_C)): a program takes BLOCK_C channels of one request, reads the request's slot
from `state_indices` (pad entries and slots outside [0, num_slots) mask every state access off and write
out = 0; the launcher never reads slot values on the host), walks the width taps in order (WIDTH is a
constexpr, the loop unrolled): tap k < width - 1 is state row k, loaded once, used in the sum and stored back
one row up (the rolling shift); the last tap is the new token, stored as the last state row in the state's
dtype. The state rows are moved as stored (bit copies).

Precision: acc = bias (or 0), then acc + w[c, k] * xpad[k] tap by tap with `enable_fp_fusion=False` (no FMA),
exactly the reference's order: without activation the output matches bit for bit; SiLU uses Triton's exp
(kernels._mamba), so with it the suite compares with the ("mamba_conv1d_update", dtype) rows.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._boundary import check_device, runs_interpreted
from kernels._mamba import FAULTS, request_slot, silu
from reference.mamba.conv1d import check_causal_conv1d_update_args

# GPU launch shape: channels per program and warps. The op moves ~(2 (width - 1) + 2) * dim elements a request;
# 256 channels x 4 warps is a plain elementwise shape (2 elements a thread). NOT TUNED: on the H200 the bench
# (CUDA-graph replays, b7af659) runs it at 14 us for batch 256 x 6144 channels = 0.41x memcpy (0.49x at batch
# 512), but `python -m bench.mamba.conv1d_update_launch_sweep` times eager launches (do_bench), 24-78 us for the
# same work: the host's launch path, not the configs, sets those numbers, so they cannot rank the shapes.
_GPU = {"block_c": 256, "warps": 4}


@triton.jit
def _causal_conv1d_update_kernel(
    x_ptr,
    state_ptr,
    w_ptr,
    bias_ptr,
    idx_ptr,
    out_ptr,
    num_slots,
    pad_slot_id,
    dim,
    x_b,
    x_c,
    s_slot,
    s_row,
    s_c,
    w_c,
    w_k,
    bias_c,
    out_b,
    out_c,
    WIDTH: tl.constexpr,
    BLOCK_C: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SILU: tl.constexpr,
    HAS_INDICES: tl.constexpr,
    FAULT: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    valid, slot = request_slot(idx_ptr, row, num_slots, pad_slot_id, HAS_INDICES, FAULT)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    c_mask = c < dim
    state_mask = c_mask & valid
    state = state_ptr + slot * s_slot + c * s_c
    x = tl.load(x_ptr + row * x_b + c * x_c, mask=c_mask, other=0.0)
    if HAS_BIAS:
        acc = tl.load(bias_ptr + c * bias_c, mask=c_mask, other=0.0).to(tl.float32)
    else:
        acc = tl.zeros([BLOCK_C], dtype=tl.float32)
    for k in tl.static_range(WIDTH):
        if k < WIDTH - 1:
            stored = tl.load(state + k * s_row, mask=state_mask, other=0.0)
            if k > 0:
                tl.store(state + (k - 1) * s_row, stored, mask=state_mask)  # roll: row k moves to k - 1
            tap = stored.to(tl.float32)
        else:
            tl.store(state + (WIDTH - 2) * s_row, x.to(state_ptr.dtype.element_ty), mask=state_mask)
            tap = x.to(tl.float32)
        acc = acc + tl.load(w_ptr + c * w_c + k * w_k, mask=c_mask, other=0.0).to(tl.float32) * tap
    if SILU:
        acc = silu(acc)
    acc = tl.where(valid, acc, 0.0)
    tl.store(out_ptr + row * out_b + c * out_c, acc.to(out_ptr.dtype.element_ty), mask=c_mask)


def launch_causal_conv1d_update(
    x, conv_state, weight, bias=None, activation=None, state_indices=None, pad_slot_id=-1, fault="none", config=None
):
    """Validate and launch; returns out. `fault` plants a named bug (negative controls only); `config`
    overrides the GPU launch shape."""
    num_slots, batch, dim, width = check_causal_conv1d_update_args(
        x, conv_state, weight, bias, activation, state_indices
    )
    optional = {name: t for name, t in (("bias", bias), ("state_indices", state_indices)) if t is not None}
    device = check_device(x=x, conv_state=conv_state, weight=weight, **optional)
    out = torch.empty(x.shape, dtype=x.dtype, device=device)
    if out.numel() == 0:
        return out
    cfg = dict(_GPU, **(config or {}))
    block_c = (
        triton.next_power_of_2(dim) if runs_interpreted(device) else min(cfg["block_c"], triton.next_power_of_2(dim))
    )
    _causal_conv1d_update_kernel[(batch, triton.cdiv(dim, block_c))](
        x,
        conv_state,
        weight,
        x if bias is None else bias,
        x if state_indices is None else state_indices,
        out,
        num_slots,
        pad_slot_id,
        dim,
        *x.stride(),
        *conv_state.stride(),
        *weight.stride(),
        0 if bias is None else bias.stride(0),
        *out.stride(),
        WIDTH=width,
        BLOCK_C=block_c,
        HAS_BIAS=bias is not None,
        SILU=activation == "silu",
        HAS_INDICES=state_indices is not None,
        FAULT=FAULTS[fault],
        num_warps=cfg["warps"],
        enable_fp_fusion=False,
    )
    return out


@torch.library.custom_op("touchstone::causal_conv1d_update", mutates_args=("conv_state",))
def _causal_conv1d_update_op(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    activation: str | None,
    state_indices: torch.Tensor | None,
    pad_slot_id: int,
) -> torch.Tensor:
    return launch_causal_conv1d_update(x, conv_state, weight, bias, activation, state_indices, pad_slot_id)


@_causal_conv1d_update_op.register_fake
def _(x, conv_state, weight, bias, activation, state_indices, pad_slot_id):
    check_causal_conv1d_update_args(x, conv_state, weight, bias, activation, state_indices)
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


def causal_conv1d_update(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str | None = None,
    state_indices: torch.Tensor | None = None,
    pad_slot_id: int = -1,
) -> torch.Tensor:
    """Kernel twin of `reference.mamba.conv1d.causal_conv1d_update` (same arguments; conv_state in place)."""
    return torch.ops.touchstone.causal_conv1d_update(
        x, conv_state, weight, bias, activation, state_indices, pad_slot_id
    )
