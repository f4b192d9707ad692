"""Index arithmetic shared by kernels that walk a [rows, K] tensor in fixed-size blocks (or groups), and the
launchers' host-side views that go with it."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._boundary import as_rows


@triton.jit
def mma_lanes(WARPS: tl.constexpr):
    """Thread tensors of a program of WARPS warps (one element a thread): (lane, warp, g, c) of each thread, g =
    lane // 4 and c = lane % 4 the row group and thread-in-group of the `mma.sync` fragment layouts."""
    t = tl.arange(0, 32 * WARPS)
    lane = t % 32
    return lane, t // 32, lane // 4, lane % 4


@triton.jit
def store_partial(at, acc, mask, OUT_FP32: tl.constexpr):
    """A split-K GEMM's fp32 accumulator, stored as it is (OUT_FP32: a split's partial, `kernels.split_k`) or
    rounded once to bf16 (the only split)."""
    if OUT_FP32:
        tl.store(at, acc, mask=mask)
    else:
        tl.store(at, acc.to(tl.bfloat16), mask=mask)


@triton.jit
def split4(v):
    """[T, 4] -> its four columns, each [T] (a thread tensor's four words, for inline PTX operands)."""
    even, odd = tl.split(tl.reshape(v, [v.shape[0], 2, 2]))
    v0, v2 = tl.split(even)
    v1, v3 = tl.split(odd)
    return v0, v1, v2, v3


@triton.jit
def block_offsets(block, blocks_per_row, row_stride, per_block, CONTIGUOUS: tl.constexpr):
    """Offset of each block's first item in a [rows, blocks_per_row * per_block] tensor with a row stride;
    no division when the rows are contiguous (the row stride is then blocks_per_row * per_block)."""
    if CONTIGUOUS:
        return block * per_block
    row = block // blocks_per_row
    return row * row_stride + (block - row * blocks_per_row) * per_block


@triton.jit
def load_block_words(x_ptr, block, n_blocks, blocks_per_row, row_stride, WORDS: tl.constexpr, CONTIGUOUS: tl.constexpr):
    """[blocks, WORDS] words of each block of a quantizer's input, read as words that hold one element pair
    (2i, 2i+1), the pair that shares one output byte: bf16/fp16 pairs in int32 words, fp32 pairs in int64
    words. Blocks past n_blocks read 0."""
    word = block_offsets(block, blocks_per_row, row_stride, WORDS, CONTIGUOUS)[:, None] + tl.arange(0, WORDS)[None, :]
    return tl.load(x_ptr + word, mask=(block < n_blocks)[:, None], other=0)


@triton.jit
def store_block_words(out_ptr, block, in_range, low, high, nan_block, WORDS: tl.constexpr, OUTPUT: tl.constexpr):
    """A dequantizer's output: [blocks, WORDS] words, word j holding element pair (2j, 2j+1) as the bits of
    `low` and `high` (OUTPUT 0 bf16 / 1 fp16 in int32 words, 2 fp32 in int64 words); blocks flagged in
    `nan_block` [blocks, 1] become canonical NaN pairs. Blocks outside `in_range` store nothing."""
    if OUTPUT == 2:
        words = low.to(tl.uint64) | (high.to(tl.uint64) << 32)
        words = tl.where(nan_block, 0x7FC000007FC00000, words).to(tl.int64, bitcast=True)
    else:
        words = low | (high << 16)
        nan = 0x7FC07FC0 if OUTPUT == 0 else 0x7E007E00
        words = tl.where(nan_block, nan, words).to(tl.uint32).to(tl.int32, bitcast=True)
    tl.store(out_ptr + block[:, None] * WORDS + tl.arange(0, WORDS)[None, :], words, mask=in_range[:, None])


def word_rows(rows: torch.Tensor) -> torch.Tensor:
    """[rows, K] of 2-byte or 4-byte elements -> [rows, K/2] words of one element pair each (no copy)."""
    return rows.view(torch.int32 if rows.element_size() == 2 else torch.int64)


def packed_rows(codes: torch.Tensor, scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """Packed-FP4 codes [..., K/2] and scales [..., K/block] as rows (no copy), and whether both are contiguous
    runs of rows (the kernels' CONTIGUOUS: block offsets without a division)."""
    code_rows, scale_rows = as_rows(codes, "codes"), as_rows(scales, "scales")
    contiguous = scale_rows.shape[0] == 1 or (
        code_rows.stride(0) == codes.shape[-1] and scale_rows.stride(0) == scales.shape[-1]
    )
    return code_rows, scale_rows, contiguous


def packed_fp4_outputs(x: torch.Tensor, block_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """x as rows, and the empty packed-FP4 outputs of quantizing it: codes [..., K/2], scale bytes
    [..., K/block_size] (uint8), with the number of blocks."""
    rows = as_rows(x, "x")
    k = x.shape[-1]
    codes = torch.empty(*x.shape[:-1], k // 2, dtype=torch.uint8, device=x.device)
    scales = torch.empty(*x.shape[:-1], k // block_size, dtype=torch.uint8, device=x.device)
    return rows, codes, scales, rows.shape[0] * (k // block_size)
