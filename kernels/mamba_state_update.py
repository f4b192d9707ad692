"""Mamba2 selective state update (decode) in Triton: the kernel twin of
`reference.mamba.state_update.selective_state_update`.

Op: `touchstone::selective_state_update(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, state_indices,
pad_slot_id) -> out`, mutating `state`; call it through `selective_state_update`, which has the reference's
signature.

Grid (batch, nheads, cdiv(head_dim, BLOCK_D)), the whole dstate in each program (vLLM's shape): a program reads
its request's slot from `state_indices`, loads a [BLOCK_D, dstate] tile of that slot's state once, updates it
in fp32 in the reference's pinned order and stores it once. It is a bandwidth kernel: the state is read and
written once; x, dt, B, C, z are a few hundred bytes a request. A pad entry (== pad_slot_id, or outside
[0, num_slots): the launcher never reads slot values on the host, so CUDA graphs can capture it) masks every
state access off, so its slot's bytes are never touched, and writes out = 0.

Precision: the launch sets `enable_fp_fusion=False`, so `state * dA + dB * x` stays two rounded products and a
rounded add, as in the mirror; the dstate sum is a tree (`tl.sum`), the mirror's torch sum another order; exp
and log are Triton's (kernels._mamba). Hence a lossy comparison (kernels.tolerances rows "mamba_state_update").
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._boundary import check_device, runs_interpreted
from kernels._mamba import FAULTS, request_slot, silu, softplus
from reference.mamba.state_update import SOFTPLUS_THRESHOLD, check_selective_state_update_args

# GPU launch shape per state dtype: head_dim rows per program (the whole dstate in each), warps, stages. H200
# (`python -m bench.mamba.state_update_launch_sweep`, batch 256, 64 heads x 64 x d_state 128, 40 configs a
# dtype): fp32 state, 64 rows at 2 warps: 288 us = 0.904x memcpy (32 rows at 1 warp 0.896x; 16 rows at 4 warps
# 0.87x in the bench); bf16 state, 16 rows at 1 warp: 157 us = 0.848x (8 rows 0.839x; 16
# rows at 4 warps 0.755x). More warps than the tile needs only lose (8 warps: 0.18-0.82x). The kernel has no
# loop: stages 1 and 2 measure the same.
_GPU = {
    torch.float32: {"block_d": 64, "warps": 2, "stages": 1},
    torch.bfloat16: {"block_d": 16, "warps": 1, "stages": 1},
}


@triton.jit
def _selective_state_update_kernel(
    state_ptr,
    x_ptr,
    dt_ptr,
    A_ptr,
    B_ptr,
    C_ptr,
    D_ptr,
    z_ptr,
    dt_bias_ptr,
    idx_ptr,
    out_ptr,
    num_slots,
    pad_slot_id,
    head_dim,
    dstate,
    heads_per_group,
    s_slot,
    s_head,
    s_dim,
    s_state,
    x_b,
    x_h,
    x_d,
    dt_b,
    dt_h,
    A_h,
    B_b,
    B_g,
    B_n,
    C_b,
    C_g,
    C_n,
    D_h,
    z_b,
    z_h,
    z_d,
    dt_bias_h,
    out_b,
    out_h,
    out_d,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_D: tl.constexpr,
    HAS_Z: tl.constexpr,
    HAS_DT_BIAS: tl.constexpr,
    DT_SOFTPLUS: tl.constexpr,
    HAS_INDICES: tl.constexpr,
    SOFTPLUS_AT: tl.constexpr,
    FAULT: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    group = head // heads_per_group
    valid, slot = request_slot(idx_ptr, row, num_slots, pad_slot_id, HAS_INDICES, FAULT)
    d = tl.program_id(2) * BLOCK_D + tl.arange(0, BLOCK_D)
    n = tl.arange(0, BLOCK_N)
    d_mask = d < head_dim
    n_mask = n < dstate
    tile_mask = d_mask[:, None] & n_mask[None, :] & valid

    state_tile = state_ptr + slot * s_slot + head * s_head + d[:, None] * s_dim + n[None, :] * s_state
    state = tl.load(state_tile, mask=tile_mask, other=0.0).to(tl.float32)
    x = tl.load(x_ptr + row * x_b + head * x_h + d * x_d, mask=d_mask, other=0.0).to(tl.float32)
    dt = tl.load(dt_ptr + row * dt_b + head * dt_h).to(tl.float32)
    if HAS_DT_BIAS:
        dt = dt + tl.load(dt_bias_ptr + head * dt_bias_h).to(tl.float32)
    if DT_SOFTPLUS:
        dt = softplus(dt, SOFTPLUS_AT)
    dA = tl.exp(dt * tl.load(A_ptr + head * A_h).to(tl.float32))
    B = tl.load(B_ptr + row * B_b + group * B_g + n * B_n, mask=n_mask, other=0.0).to(tl.float32)
    C = tl.load(C_ptr + row * C_b + group * C_g + n * C_n, mask=n_mask, other=0.0).to(tl.float32)
    dB = dt * B
    state = state * dA + dB[None, :] * x[:, None]
    tl.store(state_tile, state.to(state_ptr.dtype.element_ty), mask=tile_mask)

    out = tl.sum(tl.where(n_mask[None, :], state * C[None, :], 0.0), axis=1)
    if HAS_D:
        out = out + tl.load(D_ptr + head * D_h).to(tl.float32) * x
    if HAS_Z:
        z = tl.load(z_ptr + row * z_b + head * z_h + d * z_d, mask=d_mask, other=0.0).to(tl.float32)
        out = out * silu(z)
    out = tl.where(valid, out, 0.0)
    tl.store(out_ptr + row * out_b + head * out_h + d * out_d, out.to(out_ptr.dtype.element_ty), mask=d_mask)


def _strides(t: torch.Tensor | None, dims: int) -> tuple[int, ...]:
    return (0,) * dims if t is None else tuple(t.stride())


def launch_selective_state_update(
    state,
    x,
    dt,
    A,
    B,
    C,
    D=None,
    z=None,
    dt_bias=None,
    dt_softplus=False,
    state_indices=None,
    pad_slot_id=-1,
    fault="none",
    config=None,
):
    """Validate and launch; returns out. `fault` plants a named bug (negative controls only); `config`
    overrides the GPU launch shape (the launch sweep)."""
    num_slots, batch, nheads, head_dim, dstate, ngroups = check_selective_state_update_args(
        state, x, dt, A, B, C, D, z, dt_bias, state_indices
    )
    optional = {
        name: t
        for name, t in (("D", D), ("z", z), ("dt_bias", dt_bias), ("state_indices", state_indices))
        if t is not None
    }
    device = check_device(state=state, x=x, dt=dt, A=A, B=B, C=C, **optional)
    out = torch.empty(x.shape, dtype=x.dtype, device=device)
    if out.numel() == 0:
        return out
    cfg = dict(_GPU[state.dtype], **(config or {}))
    block_d = (
        triton.next_power_of_2(head_dim)
        if runs_interpreted(device)
        else min(cfg["block_d"], triton.next_power_of_2(head_dim))
    )
    never_read = x  # stands in for absent optional tensors: their HAS_* constexpr is False
    _selective_state_update_kernel[(batch, nheads, triton.cdiv(head_dim, block_d))](
        state,
        x,
        dt,
        A,
        B,
        C,
        never_read if D is None else D,
        never_read if z is None else z,
        never_read if dt_bias is None else dt_bias,
        never_read if state_indices is None else state_indices,
        out,
        num_slots,
        pad_slot_id,
        head_dim,
        dstate,
        nheads // ngroups,
        *state.stride(),
        *x.stride(),
        *dt.stride(),
        *A.stride(),
        *B.stride(),
        *C.stride(),
        *_strides(D, 1),
        *_strides(z, 3),
        *_strides(dt_bias, 1),
        *out.stride(),
        BLOCK_D=block_d,
        BLOCK_N=triton.next_power_of_2(dstate),
        HAS_D=D is not None,
        HAS_Z=z is not None,
        HAS_DT_BIAS=dt_bias is not None,
        DT_SOFTPLUS=bool(dt_softplus),
        HAS_INDICES=state_indices is not None,
        SOFTPLUS_AT=SOFTPLUS_THRESHOLD,
        FAULT=FAULTS[fault],
        num_warps=cfg["warps"],
        num_stages=cfg["stages"],
        enable_fp_fusion=False,
    )
    return out


@torch.library.custom_op("touchstone::selective_state_update", mutates_args=("state",))
def _selective_state_update_op(
    state: torch.Tensor,
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None,
    z: torch.Tensor | None,
    dt_bias: torch.Tensor | None,
    dt_softplus: bool,
    state_indices: torch.Tensor | None,
    pad_slot_id: int,
) -> torch.Tensor:
    return launch_selective_state_update(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, state_indices, pad_slot_id)


@_selective_state_update_op.register_fake
def _(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, state_indices, pad_slot_id):
    check_selective_state_update_args(state, x, dt, A, B, C, D, z, dt_bias, state_indices)
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


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
    """Kernel twin of `reference.mamba.state_update.selective_state_update` (same arguments; state in place)."""
    return torch.ops.touchstone.selective_state_update(
        state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, state_indices, pad_slot_id
    )
