"""Packing two 4-bit codes per byte: element 2i in the low nibble (bits 3:0), element 2i+1 in the high one.

This is the order of torchao's mx_formats `pack_uint4`, triton_kernels' `downcast_to_mxfp`, vLLM's MXFP4 test
reference and `torch.float4_e2m1fn_x2` (PTX `cvt.*.e2m1x2` takes its operands high first, which callers swap).
"""

from __future__ import annotations

import torch


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes [..., 2n] (each < 16) -> bytes [..., n]."""
    if codes.shape[-1] % 2:
        raise ValueError(f"codes: last dim must be even to pack pairs, got {codes.shape[-1]}")
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).to(torch.uint8)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """bytes [..., n] -> uint8 codes [..., 2n]."""
    return torch.stack((packed & 0xF, packed >> 4), dim=-1).flatten(-2).to(torch.uint8)
