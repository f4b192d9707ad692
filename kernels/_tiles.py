"""Index arithmetic shared by kernels that walk a [rows, K] tensor in fixed-size blocks (or groups)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def block_offsets(block, blocks_per_row, row_stride, per_block, CONTIGUOUS: tl.constexpr):
    """Offset of each block's first item in a [rows, blocks_per_row * per_block] tensor with a row stride;
    no division when the rows are contiguous (the row stride is then blocks_per_row * per_block)."""
    if CONTIGUOUS:
        return block * per_block
    row = block // blocks_per_row
    return row * row_stride + (block - row * blocks_per_row) * per_block
