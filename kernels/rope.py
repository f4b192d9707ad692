"""Rotary position embedding (NeoX / HF-Llama rotate-half) in Triton, in place on q and k; bit-exact with
`reference.rotary.rope.apply_rope`.

Op: `touchstone::rope(q, k, positions, cos_sin_cache) -> None`, mutating q and k (as vLLM's rotary op: the
runner then hands the same views to the KV store); call it through `rope_`. q [T, Hq, D] and k [T, Hkv, D]
may be strided views (unit last stride), e.g. column slices of the fused qkv projection's output.

One kernel for q and k: a program takes BLOCK_T tokens, loads their positions and table rows (cos, sin: fp32
[BLOCK_T, D/2] each) once, then rotates every head of q and of k, BLOCK_H heads at a time, as [BLOCK_T,
BLOCK_H, D/2] tiles of the two halves: one read and one write of q and k, where the runner's eager sequence
runs ~10 kernels a layer. Precision as the reference: fp32 `x * cos + rotated * sin` (two rounded products,
one rounded sum: the launch sets `enable_fp_fusion=False`, so no FMA), rounded once to x's dtype.
Positions are not range-checked here (that reads them: a host sync inside the decode step's CUDA graph); a
position outside the table reads out of bounds. The reference checks them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._boundary import check_device, runs_interpreted
from kernels._pdl import launch_args, wait_then_release
from reference.rotary.rope import check_rope_args

# Planted bugs for the suite's negative controls; FAULT is a constexpr, so fault 0 compiles them away.
FAULTS = {
    "none": 0,
    "gptj_pairs": 1,  # pairs dims (2i, 2i + 1) (GPT-J interleaved style) instead of (i, i + D/2)
}
# Launch shape: tokens per program, fp32 elements of one half-head tile (BLOCK_T x BLOCK_H x D/2), warps.
# GPU, not swept (`python -m bench.rotary.rope_launch_sweep` sweeps them): 4 tokens a program gives 64 programs
# at a 256-token decode step (the H200 has 132 SMs) and 2048-element tiles are 16 values a thread at 4 warps.
# Interpreter: ~1 ms a program, so one program for up to 256 tokens and all heads in one tile.
_GPU_LAUNCH = {"tokens": 4, "tile_elements": 2048, "warps": 4}
_INTERPRETER_LAUNCH = {"tokens": 256, "tile_elements": 1 << 17, "warps": 1}


@triton.jit
def _rotate_heads(
    x_ptr,
    stride_t,
    stride_h,
    tok,
    tok_mask,
    cos,
    sin,
    H: tl.constexpr,
    BLOCK_H: tl.constexpr,
    HALF: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    FAULT: tl.constexpr,
):
    """Rotate heads [0, H) of the tokens `tok` in place; cos, sin: fp32 [BLOCK_T, BLOCK_HALF]."""
    lane = tl.arange(0, BLOCK_HALF)
    if FAULT == 1:
        first, second = 2 * lane, 2 * lane + 1
    else:
        first, second = lane, lane + HALF
    c = cos[:, None, :]
    s = sin[:, None, :]
    for h0 in tl.static_range(0, H, BLOCK_H):
        head = h0 + tl.arange(0, BLOCK_H)
        mask = tok_mask[:, None, None] & (head < H)[None, :, None] & (lane < HALF)[None, None, :]
        base = x_ptr + tok[:, None, None] * stride_t + head[None, :, None] * stride_h
        x1 = tl.load(base + first[None, None, :], mask=mask, other=0.0)
        x2 = tl.load(base + second[None, None, :], mask=mask, other=0.0)
        w1 = x1.to(tl.float32)
        w2 = x2.to(tl.float32)
        out1 = w1 * c + (-w2) * s  # rotate_half(x)[i] = -x[i + D/2]
        out2 = w2 * c + w1 * s  # rotate_half(x)[i + D/2] = x[i]
        tl.store(base + first[None, None, :], out1.to(x1.dtype), mask=mask)
        tl.store(base + second[None, None, :], out2.to(x2.dtype), mask=mask)


@triton.jit
def _rope_kernel(
    q_ptr,
    k_ptr,
    pos_ptr,
    cache_ptr,
    n_tokens,
    q_stride_t,
    q_stride_h,
    k_stride_t,
    k_stride_h,
    pos_stride,
    HQ: tl.constexpr,
    HKV: tl.constexpr,
    HALF: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_HQ: tl.constexpr,
    BLOCK_HKV: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    FAULT: tl.constexpr,
    PDL: tl.constexpr,
):
    wait_then_release(PDL)  # kernels._pdl: before any read of an earlier kernel's output
    tok = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    tok_mask = tok < n_tokens
    pos = tl.load(pos_ptr + tok * pos_stride, mask=tok_mask, other=0)
    lane = tl.arange(0, BLOCK_HALF)
    row = cache_ptr + pos[:, None] * (2 * HALF) + lane[None, :]  # the table is contiguous [P, D]
    row_mask = tok_mask[:, None] & (lane < HALF)[None, :]
    cos = tl.load(row, mask=row_mask, other=0.0)
    sin = tl.load(row + HALF, mask=row_mask, other=0.0)
    _rotate_heads(q_ptr, q_stride_t, q_stride_h, tok, tok_mask, cos, sin, HQ, BLOCK_HQ, HALF, BLOCK_HALF, FAULT)
    _rotate_heads(k_ptr, k_stride_t, k_stride_h, tok, tok_mask, cos, sin, HKV, BLOCK_HKV, HALF, BLOCK_HALF, FAULT)


def _launch_shape(n_tokens: int, heads: tuple[int, int], block_half: int, device: torch.device):
    """(BLOCK_T, (BLOCK_HQ, BLOCK_HKV), warps) from the launch table."""
    cfg = _INTERPRETER_LAUNCH if runs_interpreted(device) else _GPU_LAUNCH
    block_t = min(cfg["tokens"], triton.next_power_of_2(n_tokens))
    cap = max(1, cfg["tile_elements"] // (block_t * block_half))
    return block_t, tuple(min(triton.next_power_of_2(h), triton.next_power_of_2(cap)) for h in heads), cfg["warps"]


def launch_rope(q, k, positions, cos_sin_cache, fault="none") -> None:
    """Validate and launch (q and k rotated in place); `fault` plants a named bug (negative controls only)."""
    check_rope_args(q, k, positions, cos_sin_cache)
    check_device(q=q, k=k, positions=positions, cos_sin_cache=cos_sin_cache)
    for name, t in (("q", q), ("k", k)):
        if t.stride(2) != 1:
            raise ValueError(f"{name}: last dim must have stride 1, got strides {t.stride()}")
    if not cos_sin_cache.is_contiguous():
        raise ValueError(f"cos_sin_cache: must be contiguous, got strides {cos_sin_cache.stride()}")
    n_tokens, hq, head_dim = q.shape
    hkv = k.shape[1]
    if n_tokens == 0:
        return
    half = head_dim // 2
    block_half = triton.next_power_of_2(half)
    block_t, (block_hq, block_hkv), warps = _launch_shape(n_tokens, (hq, hkv), block_half, q.device)
    _rope_kernel[(triton.cdiv(n_tokens, block_t),)](
        q,
        k,
        positions,
        cos_sin_cache,
        n_tokens,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        positions.stride(0),
        HQ=hq,
        HKV=hkv,
        HALF=half,
        BLOCK_T=block_t,
        BLOCK_HQ=block_hq,
        BLOCK_HKV=block_hkv,
        BLOCK_HALF=block_half,
        FAULT=FAULTS[fault],
        num_warps=warps,
        enable_fp_fusion=False,
        **launch_args(q.device),
    )


@torch.library.custom_op("touchstone::rope", mutates_args=("q", "k"))
def _rope_op(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor) -> None:
    launch_rope(q, k, positions, cos_sin_cache)


@_rope_op.register_fake
def _(q, k, positions, cos_sin_cache):
    check_rope_args(q, k, positions, cos_sin_cache)


def rope_(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor) -> None:
    """In-place kernel twin of `reference.rotary.rope.apply_rope`: afterwards q and k hold its (q_out, k_out)."""
    torch.ops.touchstone.rope(q, k, positions, cos_sin_cache)
