"""W4A16 NVFP4 GEMM: y = x @ W^T with bf16 activations and NVFP4 weights quantized along K.

Contract (the layout of `reference.quant.nvfp4`: blocks of 16 E2M1 codes, one E4M3 scale each, one fp32 global
scale per tensor):
- x: bf16 [M, K]; K a multiple of 16; M >= 0 (M = 0 gives an empty output).
- codes: uint8 [N, K // 2], element 2i of a row in the low nibble; scales: uint8 E4M3 bytes [N, K // 16].
- global_scale: an `EncodeScale` or a `DecodeScale` (`reference.quant.nvfp4_global_scale`); its decode value s_dec.
- y: bf16 [M, N].

Two references:
- `w4a16_nvfp4_gemm_mirror` is what the Triton kernel computes, step by step:
  1. Each weight without the global scale, E2M1 value times its block's E4M3 scale, is a bf16 value: the
     product of a 2-bit and a 4-bit significand has at most 6 significant bits, and its magnitude lies in
     [2**-10, 6 * 448] (E4M3's smallest subnormal 2**-9 times 0.5) or is 0, inside bf16's normal range. So W'
     is exact in bf16; the -0 code gives -0.0; the sign bit of a scale byte is honoured; scale bytes 0x7F
     and 0xFF (E4M3's NaN) make their block's 16 weights NaN.
  2. Each product x[m, k] * W'[n, k] is exact in fp32 (8- and 6-bit significands); products are summed in
     fp32, in an order the kernel does not share (tl.dot's, split-K partials added in split order).
  3. The fp32 sum times s_dec, rounded to fp32, then to bf16 (round to nearest even; beyond bf16's range,
     +-Inf). Applying the global scale once per output keeps W' exact; dequantizing W to bf16 with s_dec
     folded in (`reference.quant.nvfp4.dequantize_nvfp4`) rounds every weight instead.
  The kernel multiplies each split's partial sum by s_dec before the splits are added: the same class of
  reassociation as step 2, bounded by the lossy table (`kernels.tolerances`, row "w4a16_nvfp4_gemm").
- `w4a16_nvfp4_gemm_ideal`: the product of the dequantized operands (E2M1 * E4M3 * s_dec) in float64, for
  measuring what the kernel's arithmetic loses; SQNR against the fp64 product with the weights before
  quantization (`suites.oracles.unquantized_product`) measures what NVFP4 itself loses.

NaN policy: a NaN scale byte makes y[m, n] NaN for every m whose row n holds that block; NaN or Inf in x
propagates by IEEE rules (Inf * 0 = NaN). Both references and the kernel follow it.
"""

from __future__ import annotations

import torch

from reference.formats.e2m1 import decode_e2m1
from reference.formats.e4m3 import decode_e4m3
from reference.formats.nibbles import unpack_nibbles
from reference.gemm.w4a16_operands import check_w4a16_operands
from reference.quant.nvfp4 import NVFP4_BLOCK_SIZE
from reference.quant.nvfp4_global_scale import GlobalScale, decode_value


def check_w4a16_nvfp4_args(
    x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, global_scale: GlobalScale
) -> torch.Tensor:
    """Raise TypeError/ValueError naming the bad argument; returns s_dec (0-dim fp32, on the scale's device).
    Shared with the kernel launcher."""
    check_w4a16_operands(x, codes, scales, NVFP4_BLOCK_SIZE, "NVFP4")
    return decode_value(global_scale)


def block_scaled_weights(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """fp32 [N, K]: E2M1 value times its block's E4M3 scale, without the global scale (exact; NaN blocks NaN)."""
    values = decode_e2m1(unpack_nibbles(codes)).unflatten(-1, (-1, NVFP4_BLOCK_SIZE))
    return (values * decode_e4m3(scales).unsqueeze(-1)).flatten(-2)


def w4a16_nvfp4_gemm_mirror(
    x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, global_scale: GlobalScale
) -> torch.Tensor:
    """bf16 [M, N]: fp32 sums of exact products with the block-scaled weights, times s_dec in fp32, one bf16
    rounding."""
    s = check_w4a16_nvfp4_args(x, codes, scales, global_scale)
    w = block_scaled_weights(codes, scales)  # exact in bf16, so exact in fp32 (and TF32)
    acc = torch.matmul(x.to(torch.float32), w.T)
    return (acc * s.to(acc.device)).to(torch.bfloat16)


def dequantize_exact(codes: torch.Tensor, scales: torch.Tensor, global_scale: GlobalScale) -> torch.Tensor:
    """float64 [N, K]: E2M1 * E4M3 * s_dec, no rounding."""
    s = decode_value(global_scale)
    return block_scaled_weights(codes, scales).to(torch.float64) * s.to(torch.float64).cpu().item()


def w4a16_nvfp4_gemm_ideal(
    x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, global_scale: GlobalScale
) -> torch.Tensor:
    """float64 [M, N]: the product of the dequantized operands, computed in float64."""
    check_w4a16_nvfp4_args(x, codes, scales, global_scale)
    return torch.matmul(x.to(torch.float64), dequantize_exact(codes, scales, global_scale).T)
