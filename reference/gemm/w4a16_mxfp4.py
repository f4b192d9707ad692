"""W4A16 MXFP4 GEMM: y = x @ W^T with bf16 activations and MXFP4 weights quantized along K.

Contract (the layout of `reference.quant.mxfp4`, OCP MX v1.0 blocks of 32):
- x: bf16 [M, K]; K a multiple of 32; M >= 0 (M = 0 gives an empty output).
- codes: uint8 [N, K // 2], element 2i of a row in the low nibble; scales: uint8 E8M0 [N, K // 32].
- y: bf16 [M, N].

Two references:
- `w4a16_mxfp4_gemm_mirror` is what the Triton kernel computes, step by step:
  1. W is dequantized to bf16 exactly as `reference.quant.mxfp4.dequantize_mxfp4` does. Every E2M1 value
     times a power of two 2**e is a bf16 value (3 significant bits; bf16 reaches 2**-133) except when it is
     2**128 or more (scale bytes 253 and 254 only, codes 4 and 6 at byte 253): those saturate to
     +-bf16 max, the same policy as the dequantize op. The -0 code gives -0.0. Scale bytes 253 and 254
     are outside the kernel's contract (its fp32-FMA path never forms a bf16 weight; see
     kernels/w4a16_mxfp4_gemm.py); the suites draw scale bytes from 0..252 and 0xFF.
  2. Each product x[m, k] * W[n, k] is exact in fp32 (two 8-bit significands); products are summed in
     fp32. The kernel's summation order is not the mirror's: tl.dot (tensor cores) and the fp32-FMA decode
     path sum a K tile in an order of their own, and split-K adds per-split fp32 partial sums in a fixed
     order at the end. Reassociating an fp32 sum moves it by at most ~K * 2**-24 of sum |x * w|, far below
     the bf16 output's 2**-9: the suites bound the difference (`kernels.tolerances.LOSSY`), they do not
     expect bits.
  3. The fp32 sum is cast to bf16 once, round to nearest even; fp32 values beyond bf16 range become +-Inf.
- `w4a16_mxfp4_gemm_ideal`: the product of the dequantized operands in float64 (exact products, no
  saturation, float64 sums), for measuring what the kernel's arithmetic (fp32 sums, one bf16 rounding)
  loses. SQNR against the fp64 product with the weights before quantization
  (`suites.oracles.unquantized_product`) measures what MXFP4 itself loses.

NaN policy: an E8M0 scale byte 0xFF makes its 32 weights NaN, so y[m, n] is NaN for every m whose row n
holds such a block (NaN * 0 is NaN too). NaN or Inf in x propagates by IEEE rules (Inf * 0 = NaN). Both
references and the kernel follow this.
"""

from __future__ import annotations

import torch

from reference.formats.e2m1 import decode_e2m1
from reference.formats.e8m0 import decode_e8m0
from reference.formats.nibbles import unpack_nibbles
from reference.gemm.w4a16_operands import check_w4a16_operands
from reference.quant.mxfp4 import MX_BLOCK_SIZE, dequantize_mxfp4


def check_w4a16_args(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor) -> None:
    """Raise TypeError/ValueError naming the bad argument. Shared with the kernel launcher."""
    check_w4a16_operands(x, codes, scales, MX_BLOCK_SIZE, "MXFP4")


def w4a16_mxfp4_gemm_mirror(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """bf16 [M, N]: W dequantized exactly to bf16 (saturating), products summed in fp32, one bf16 rounding."""
    check_w4a16_args(x, codes, scales)
    w = dequantize_mxfp4(codes, scales, dtype=torch.bfloat16)
    # bf16 values are exact in fp32 (and in TF32, should a GPU matmul use it), so this is an fp32 sum of
    # exact products in the BLAS's order.
    return torch.matmul(x.to(torch.float32), w.to(torch.float32).T).to(torch.bfloat16)


def dequantize_exact(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """float64 [N, K]: E2M1 value times 2**e, no saturation (exact in float64); NaN for scale byte 0xFF."""
    values = decode_e2m1(unpack_nibbles(codes)).to(torch.float64).unflatten(-1, (-1, MX_BLOCK_SIZE))
    return (values * decode_e8m0(scales).to(torch.float64).unsqueeze(-1)).flatten(-2)


def w4a16_mxfp4_gemm_ideal(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """float64 [M, N]: the product of the dequantized operands, computed in float64."""
    check_w4a16_args(x, codes, scales)
    return torch.matmul(x.to(torch.float64), dequantize_exact(codes, scales).T)
