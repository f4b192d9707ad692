"""NVFP4: blocks of 16 E2M1 elements sharing one E4M3 scale, under one fp32 per-tensor global scale.

Layout: `codes` uint8 [..., K // 2] (element 2i in the low nibble, as MXFP4); `scales` uint8 [..., K // 16],
E4M3 bytes in row-major order (`.view(torch.float8_e4m3fn)` gives their values; the 128x4 swizzled
layout the Blackwell GEMMs read is `reference.quant.scale_swizzle`). The global scale is an `EncodeScale`
or a `DecodeScale` (`reference.quant.nvfp4_global_scale`); bare values are refused.

Quantization, every step an IEEE fp32 operation rounded to nearest even, in this order (s = s_enc):
    q   = s / 6                                  once per tensor
    a   = max |x_i| over the block               exact
    sf  = a * q                                  the block's decode scale relative to the global one
    b   = e4m3_rne_satfinite(sf)                 the stored scale byte (clamp to 448 first)
    d   = fp32(b)                                exact
    r   = s / d   if d != 0 else 0               the block's encode multiplier
    v_i = |x_i| * r                              rounded to fp32 ...
    c_i = e2m1_rne_satfinite(v_i) | sign(x_i)    ... then to E2M1: two roundings, as in hardware
This is the NVIDIA recipe (arXiv:2509.25149 App. B: stored scale e4m3(amax_b/6 * s_enc), elements
x * s_enc / stored) with its divisions pinned: amax_b/6 * s_enc is computed as amax_b * (s_enc/6), one
rounding per block instead of two, and each element takes one product with a rounded per-block multiplier
(vLLM's `cvt_warp_fp16_to_fp4` takes the same steps with approximate reciprocals, so it is close to, not
bit-equal with, this). The element rounding sees the fp32 product v_i, not the exact x_i * r: the product of a bf16 and
a 24-bit multiplier is a full fp32 value, so E2M1 ties and near-ties in the E2M1-subnormal region are
reachable and need a sticky-correct rounding (`reference.formats.e2m1` rounds the exact value of v_i).

Edge-case policy:
- NaN or +-Inf anywhere in a block: scale byte 0x7F (NaN) and all the block's codes 0x0; the block
  dequantizes to NaN, its neighbours are unaffected (as MXFP4 here; vLLM's kernel instead saturates Inf).
- Scale byte 0 (all-zero block, or a block below half the smallest E4M3 subnormal 2**-9 of the global
  range): r = 0, so every element's code is a signed zero.
- Block amax above the global amax (a stale global scale): the scale byte saturates at 448 (0x7E) and the
  elements at +-6.
- The sign of every code is the sign bit of its input (-0.0 -> 0x8; negative values rounding to 0 -> 0x8).
- Subnormal inputs are values like any other (fp32 products keep subnormals; no flush to zero).

Dequantization: d_b = fp32(fp32(b) * s_dec), value = fp32(e2m1 * d_b), saturated at +-finfo(dtype).max
(NVFP4 has no Inf), then rounded to `dtype` (RNE). NaN scale bytes (0x7F, 0xFF) give a NaN block; the
sign bit of a scale byte is honoured.
"""

from __future__ import annotations

import torch

from reference.formats.e2m1 import E2M1_MAX, SIGN_BIT, decode_e2m1, encode_e2m1
from reference.formats.e4m3 import decode_e4m3, encode_e4m3
from reference.formats.nibbles import pack_nibbles, unpack_nibbles
from reference.quant.nvfp4_global_scale import GlobalScale, decode_value, encode_value
from reference.quant.packed_fp4 import check_fp4_input, check_packed_fp4

NVFP4_BLOCK_SIZE = 16
INPUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
OUTPUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _check_scale_device(value: torch.Tensor, device: torch.device, first: str) -> None:
    if value.device != device:
        raise ValueError(f"global_scale: on {value.device}, but {first} is on {device}; move it with .to()")


def check_quantize_args(x: torch.Tensor, global_scale: GlobalScale) -> torch.Tensor:
    """Raise TypeError/ValueError naming the bad argument; returns s_enc. Shared with the kernel launchers."""
    check_fp4_input(x, NVFP4_BLOCK_SIZE, INPUT_DTYPES)
    s = encode_value(global_scale)
    _check_scale_device(s, x.device, "x")
    return s


def check_dequantize_args(
    codes: torch.Tensor, scales: torch.Tensor, global_scale: GlobalScale, dtype: torch.dtype
) -> torch.Tensor:
    """Raise TypeError/ValueError naming the bad argument; returns s_dec. Shared with the kernel launchers."""
    check_packed_fp4(codes, scales, dtype, NVFP4_BLOCK_SIZE, OUTPUT_DTYPES, "NVFP4")
    t = decode_value(global_scale)
    _check_scale_device(t, codes.device, "codes")
    return t


def quantize_nvfp4_encoded(x: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The algorithm above with s = s_enc as a 0-dim float32 tensor (no argument checks)."""
    blocks = x.to(torch.float32).unflatten(-1, (-1, NVFP4_BLOCK_SIZE))
    magnitude = blocks.abs()
    not_finite = ~torch.isfinite(blocks).all(dim=-1)
    # s / tensor(6): CUDA torch turns `tensor / python scalar` into a multiply by the inexact 1/6.
    block_scale = magnitude.amax(dim=-1) * (s / torch.full_like(s, E2M1_MAX))
    scales = torch.where(not_finite, torch.full_like(block_scale, float("nan")), block_scale)
    scales = encode_e4m3(scales)  # NaN -> 0x7F
    stored = decode_e4m3(scales)
    multiplier = torch.where(stored == 0, torch.zeros_like(stored), s / stored)
    scaled = magnitude * multiplier.unsqueeze(-1)
    codes = encode_e2m1(scaled) | (torch.signbit(blocks).to(torch.uint8) * SIGN_BIT)
    codes = torch.where(not_finite.unsqueeze(-1), torch.zeros_like(codes), codes)
    return pack_nibbles(codes.flatten(-2)), scales


def quantize_nvfp4(x: torch.Tensor, global_scale: GlobalScale) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize along the last dim. Returns (codes uint8 [..., K//2], scales uint8 E4M3 [..., K//16])."""
    return quantize_nvfp4_encoded(x, check_quantize_args(x, global_scale))


def dequantize_nvfp4(
    codes: torch.Tensor, scales: torch.Tensor, global_scale: GlobalScale, *, dtype: torch.dtype = torch.bfloat16
) -> torch.Tensor:
    """Codes uint8 [..., K//2], scales uint8 [..., K//16] -> values [..., K] of `dtype`."""
    t = check_dequantize_args(codes, scales, global_scale, dtype)
    block_scale = decode_e4m3(scales) * t
    values = decode_e2m1(unpack_nibbles(codes)).unflatten(-1, (-1, NVFP4_BLOCK_SIZE)) * block_scale.unsqueeze(-1)
    limit = torch.finfo(dtype).max
    values = torch.where(values.isnan(), values, values.clamp(-limit, limit))
    return values.flatten(-2).to(dtype)
