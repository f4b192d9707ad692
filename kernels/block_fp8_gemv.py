"""The block-FP8 W8A8 GEMM at decode (a few rows of A) on tensor cores straight from the E4M3 bytes: the small-M
path of `kernels.block_fp8_gemm`'s op on NVIDIA sm_90+, the same contract
(`reference.gemm.block_fp8.block_fp8_gemm_mirror`).

Program (p, q) takes weight rows 16p .. 16p + 15 and activation rows 8q .. 8q + 7 as the eight columns of
`mma.sync.m16n8k32` E4M3 (`kernels._fp8_fragment_rows.fp8_fragment_tile`: K permuted per lane so every lane
reads 32 contiguous bytes of its rows a 128-wide block, no prepared layout; rows past M read row M - 1 and are
not stored). One pass over the weights serves up to 8 rows of A; each block's fp32 sum is scaled by
a_scale x w_scale and added, as the mirror does; one rounding at the store.

Why (H200, CUDA-graph replays, cold L2): at M = 1 the tiled GEMM (mma.sync tiles of 16 rows of A, split-K) reads
Llama-3.1-8B's 6144 x 4096 weights in 18.1 us and this GEMV in 14.8 us; on the larger projections both are
within 3 % (28672 x 4096: 42.8 us, 0.65x memcpy). `kernels.block_fp8_gemm.GEMV_MAX_M`'s comment has the set.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._fp8_fragment_rows import fp8_fragment_tile
from kernels._pdl import launch_args, wait_then_release
from kernels._tiles import mma_lanes

# `kernels.block_fp8_gemm.FAULTS` as `fp8_fragment_tile`'s fault codes
TILE_FAULTS = {0: 0, 1: 3, 2: 5}
# (U blocks a turn, warps), the block-FP8 MoE decode's (`kernels.moe_gemv.FP8_MMA_LAUNCH`). On the five shapes
# above at M = 1, (1, 8) was up to 5 % faster where N <= 6144 with K >= 4096 and (1, 4) up to 4 % faster on
# 28672 x 4096 and 7168 x 2048; (2, 2) 5-30 % slower.
LAUNCH = (2, 4)


@triton.jit
def _store(out_ptr, v, rows, toks, N, M, out_stride):
    tl.store(
        out_ptr + toks.to(tl.int64) * out_stride + rows, v.to(out_ptr.dtype.element_ty), mask=(rows < N) & (toks < M)
    )


@triton.jit
def _fp8_gemv_kernel(
    a_words, as_ptr, w_words, ws_ptr, out_ptr, M, N, n_blocks, a_stride, stride_asm, stride_ask, stride_wn,
    stride_wsn, out_stride, WARPS: tl.constexpr, U: tl.constexpr, FAULT: tl.constexpr,
    PDL: tl.constexpr,
):  # fmt: skip
    wait_then_release(PDL)  # kernels._pdl: before any read of an earlier kernel's output
    p, q = tl.program_id(0), tl.program_id(1)
    _, _, g, c = mma_lanes(WARPS)
    first_tok = q * 8
    tok_g = tl.minimum(first_tok + g, M - 1)
    tok_0 = tl.minimum(first_tok + 2 * c, M - 1)
    tok_1 = tl.minimum(first_tok + 2 * c + 1, M - 1)
    acc = fp8_fragment_tile(
        a_words, a_stride, tok_g, as_ptr, stride_asm, stride_ask, tok_0, tok_1, w_words, ws_ptr, p * 16, N,
        n_blocks, tl.cdiv(N, 128), stride_wn, stride_wsn, WARPS, U, FAULT,
    )  # fmt: skip
    lanes = tl.arange(0, 32)
    row = p * 16 + lanes // 4
    col = first_tok + 2 * (lanes % 4)
    _store(out_ptr, acc[0], row, col, N, M, out_stride)
    _store(out_ptr, acc[1], row, col + 1, N, M, out_stride)
    _store(out_ptr, acc[2], row + 8, col, N, M, out_stride)
    _store(out_ptr, acc[3], row + 8, col + 1, N, M, out_stride)


def launch_fp8_gemv(a, a_scales, b, b_scales, out: torch.Tensor, fault: int = 0, launch=None) -> torch.Tensor:
    """out = mirror(a, a_scales, b, b_scales) for validated arguments (`kernels.block_fp8_gemm`'s checks) on a
    device that runs the PTX; a and b contiguous in K (a multiple of 128, so rows are whole int32 words), b_scales
    with unit stride along K (a_scales any strides)."""
    m, k = a.shape
    n = b.shape[0]
    u, warps = launch or LAUNCH
    if u not in (1, 2):
        raise ValueError(f"launch: U (blocks a turn) must be 1 or 2, got {u}")
    a_words, w_words = a.view(torch.int32), b.view(torch.int32)
    _fp8_gemv_kernel[(triton.cdiv(n, 16), triton.cdiv(m, 8))](
        a_words, a_scales, w_words, b_scales, out, m, n, k // 128, a_words.stride(0), a_scales.stride(0),
        a_scales.stride(1), w_words.stride(0), b_scales.stride(0), out.stride(0),
        WARPS=warps, U=u, FAULT=TILE_FAULTS[fault], num_warps=warps, num_stages=1, **launch_args(a.device),
    )  # fmt: skip
    return out
