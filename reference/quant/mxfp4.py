"""MXFP4 (OCP Microscaling v1.0): blocks of 32 E2M1 elements sharing one E8M0 power-of-two scale.

Layout (triton_kernels', torchao's and vLLM's): `codes` uint8 [..., K // 2], element 2i in the low nibble;
`scales` uint8 E8M0 [..., K // 32].

Quantization of one block (values V_i):
1. The scale byte comes from the block's amax by `scale_mode` (`reference.quant.mx_scale`): "floor" is the
   spec's rule, "rceil", "even" and "ceil" are the variants deployed elsewhere.
2. Each element is V_i / 2**e rounded to nearest E2M1, ties to even, saturating at +-6 (the spec's
   "clamped to the max normal, preserving the sign"), keeping the sign of zero.

Edge-case policy:
- NaN or +-Inf anywhere in a block: the scale byte is 0xFF (NaN) and the block's codes are all 0x0; the
  block dequantizes to NaN. Neighbouring blocks are unaffected.
- All-zero block: scale byte 0x00 (2**-127); codes keep each zero's sign (-0.0 -> 0x8).
- Subnormal inputs are values like any other (no flush to zero).
- Dequantization never produces Inf from a finite code: MX has no infinities, so a product beyond the
  output dtype's range saturates to +-finfo(dtype).max. (triton_kernels' `upcast_from_mxfp` clamps to the same
  bound in its current versions; its first versions let the product overflow to +-Inf.) -0 codes give -0.0.
"""

from __future__ import annotations

import torch

from reference.formats.e2m1 import E2M1_EMAX, E2M1_MAX, decode_e2m1, encode_e2m1
from reference.formats.e8m0 import E8M0_NAN, decode_e8m0
from reference.formats.nibbles import pack_nibbles, unpack_nibbles
from reference.quant.mx_scale import SCALE_MODES, mx_block_scales
from reference.quant.packed_fp4 import check_fp4_input, check_packed_fp4

MX_BLOCK_SIZE = 32
INPUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
OUTPUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def check_quantize_args(x: torch.Tensor, scale_mode: str) -> None:
    """Raise TypeError/ValueError naming the bad argument. Shared with the kernel launchers."""
    check_fp4_input(x, MX_BLOCK_SIZE, INPUT_DTYPES)
    if scale_mode not in SCALE_MODES:
        raise ValueError(f"scale_mode must be one of {SCALE_MODES}, got {scale_mode!r}")


def check_dequantize_args(codes: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> None:
    """Raise TypeError/ValueError naming the bad argument. Shared with the kernel launchers."""
    check_packed_fp4(codes, scales, dtype, MX_BLOCK_SIZE, OUTPUT_DTYPES, "MXFP4")


def quantize_mxfp4(x: torch.Tensor, *, scale_mode: str = "floor") -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize along the last dim. Returns (codes uint8 [..., K//2], scales uint8 [..., K//32])."""
    check_quantize_args(x, scale_mode)
    blocks = x.to(torch.float64).unflatten(-1, (-1, MX_BLOCK_SIZE))
    scales = mx_block_scales(blocks, scale_mode, emax_elem=E2M1_EMAX, elem_max=E2M1_MAX)
    nan_block = (scales == E8M0_NAN).unsqueeze(-1)
    exponent = (scales.to(torch.int32) - 127).unsqueeze(-1)
    scaled = torch.ldexp(torch.where(nan_block, torch.zeros_like(blocks), blocks), -exponent)
    codes = encode_e2m1(scaled).flatten(-2)
    return pack_nibbles(codes), scales


def dequantize_mxfp4(codes: torch.Tensor, scales: torch.Tensor, *, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """Codes uint8 [..., K//2] and scales uint8 [..., K//32] -> values [..., K] of `dtype`."""
    check_dequantize_args(codes, scales, dtype)
    values = decode_e2m1(unpack_nibbles(codes)).unflatten(-1, (-1, MX_BLOCK_SIZE)).to(torch.float64)
    product = values * decode_e8m0(scales).to(torch.float64).unsqueeze(-1)
    limit = torch.finfo(dtype).max
    product = torch.where(product.isnan(), product, product.clamp(-limit, limit))
    return product.flatten(-2).to(torch.float32).to(dtype)
