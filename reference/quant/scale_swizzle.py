"""The 128x4 swizzled layout of block scales that Blackwell block-scaled GEMMs read (NVFP4, MXFP4/MXFP8).

A row-major scale matrix [M, S] (S = K / block_size) is padded to [Mp, Sp] = [ceil(M/128)*128,
ceil(S/4)*4] and stored as tiles of 128 rows x 4 scale columns, 512 bytes each, tiles in row-major order
(all column tiles of row tile 0 first). Inside a tile, row m and column k sit at
    (m % 32) * 16 + ((m // 32) % 4) * 4 + (k % 4)
so the four 32-row groups of a tile interleave: one 16-byte line holds 4 columns of rows m, m+32, m+64,
m+96. The full offset is (cuBLAS's block-scaling-factor layout; vLLM's `cvt_quant_to_fp4_get_sf_out_offset` in
csrc/quantization/fp4/nvfp4_utils.cuh):
    ((m // 128) * (Sp // 4) + k // 4) * 512 + (m % 32) * 16 + ((m // 32) % 4) * 4 + (k % 4)
The swizzled tensor is returned as [Mp, Sp] (its storage in that order).

Padding: rows M..Mp-1 and columns S..Sp-1 hold PAD_BYTE = 0x00 (E4M3 reads it as zero, E8M0 as its
smallest scale); the inverse drops them, so it needs M and S. Inputs are 2-D (one matrix; loop over experts
for MoE weights) of any 1-byte dtype.
"""

from __future__ import annotations

import torch

ROW_TILE = 128
COL_TILE = 4
PAD_BYTE = 0


def _ceil_to(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def swizzled_shape(m: int, s: int) -> tuple[int, int]:
    """[Mp, Sp] of the swizzled scales of an [m, s] scale matrix."""
    return _ceil_to(m, ROW_TILE), _ceil_to(s, COL_TILE)


def swizzled_offsets(m: int, s: int) -> torch.Tensor:
    """int64 [Mp, Sp]: the storage offset of each padded (row, column), by the formula above."""
    mp, sp = swizzled_shape(m, s)
    row = torch.arange(mp).unsqueeze(1)
    col = torch.arange(sp).unsqueeze(0)
    tile = (row // ROW_TILE) * (sp // COL_TILE) + col // COL_TILE
    return tile * (ROW_TILE * COL_TILE) + (row % 32) * 16 + ((row // 32) % 4) * 4 + (col % COL_TILE)


def _check(scales: torch.Tensor, name: str) -> None:
    if scales.dim() != 2:
        raise ValueError(f"{name}: must be 2-D [rows, scale columns], got shape {tuple(scales.shape)}")
    if scales.element_size() != 1:
        raise TypeError(f"{name}: must hold 1-byte scales (uint8, float8_*), got {scales.dtype}")


def swizzle_scales_128x4(scales: torch.Tensor) -> torch.Tensor:
    """Row-major scales [M, S] -> swizzled [ceil(M/128)*128, ceil(S/4)*4], padding with PAD_BYTE."""
    _check(scales, "scales")
    m, s = scales.shape
    mp, sp = swizzled_shape(m, s)
    padded = torch.full((mp, sp), PAD_BYTE, dtype=torch.uint8, device=scales.device).view(scales.dtype)
    padded[:m, :s] = scales
    flat = torch.empty(mp * sp, dtype=scales.dtype, device=scales.device)
    flat[swizzled_offsets(m, s).to(scales.device).flatten()] = padded.flatten()
    return flat.view(mp, sp)


def unswizzle_scales_128x4(swizzled: torch.Tensor, m: int, s: int) -> torch.Tensor:
    """Inverse of `swizzle_scales_128x4`: swizzled [Mp, Sp] -> row-major [m, s] (padding dropped)."""
    _check(swizzled, "swizzled")
    if tuple(swizzled.shape) != swizzled_shape(m, s):
        raise ValueError(
            f"swizzled: shape {tuple(swizzled.shape)} is not the swizzled shape "
            f"{swizzled_shape(m, s)} of [{m}, {s}] scales"
        )
    flat = swizzled.contiguous().flatten()
    return flat[swizzled_offsets(m, s).to(swizzled.device)][:m, :s]
