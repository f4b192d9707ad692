"""Block-FP8 linear layer: bf16/fp16 activations quantized per 1x128 group, then the block-FP8 GEMM (what
vLLM's `apply_w8a8_block_fp8_linear` does in two kernels, and what `kernels.block_fp8_linear` does in one).

Contract:
- x          [M, K]                    bfloat16 or float16   activations, K a positive multiple of 128
- b          [N, K]                    float8_e4m3fn         weights ("NT": C = X B^T)
- b_scales   [ceil(N / 128), K / 128]  float32               one scale per 128x128 weight tile
- out_dtype  bfloat16, float16 or float32;  C [M, N]

    a, a_scales = reference.quant.fp8.quantize_fp8(x, granularity="group", group_size=128)
    C = reference.gemm.block_fp8.block_fp8_gemm_mirror(a, a_scales, b, b_scales, out_dtype)

The mirror is exactly that composition, so its precision story is the GEMM's (`reference.gemm.block_fp8`)
after the quantizer's (`reference.quant.fp8`): the kernel's quantized activations and scales are those of the
quantize kernel bit for bit, and the GEMM part carries the GEMM's tolerance row.
"""

from __future__ import annotations

import torch

from reference.gemm.block_fp8 import BLOCK, OPERAND_DTYPE, OUT_DTYPES, _check_scales, block_fp8_gemm_mirror
from reference.quant.fp8 import quantize_fp8

INPUT_DTYPES = (torch.bfloat16, torch.float16)


def check_block_fp8_linear_args(x: torch.Tensor, b: torch.Tensor, b_scales: torch.Tensor, out_dtype) -> None:
    """Raise TypeError/ValueError naming the bad argument. Shared with the kernel launcher and fake impl."""
    if not isinstance(x, torch.Tensor) or x.dtype not in INPUT_DTYPES:
        raise TypeError(f"x: dtype must be one of {INPUT_DTYPES}, got {getattr(x, 'dtype', type(x))}")
    if not isinstance(b, torch.Tensor) or b.dtype != OPERAND_DTYPE:
        raise TypeError(f"b: dtype must be {OPERAND_DTYPE}, got {getattr(b, 'dtype', type(b))}")
    for name, t in (("x", x), ("b", b)):
        if t.dim() != 2:
            raise ValueError(f"{name}: must be 2-D, got shape {tuple(t.shape)}")
    k = x.shape[1]
    if b.shape[1] != k:
        raise ValueError(f"b: K = {b.shape[1]} does not match x's K = {k} (b is [N, K])")
    if k == 0 or k % BLOCK:
        raise ValueError(f"x: K = {k} must be a positive multiple of {BLOCK}; partial K blocks are not supported")
    if out_dtype not in OUT_DTYPES:
        raise TypeError(f"out_dtype: must be one of {OUT_DTYPES}, got {out_dtype}")
    _check_scales("b_scales", b_scales, (-(-b.shape[0] // BLOCK), k // BLOCK))


def block_fp8_linear_mirror(
    x: torch.Tensor, b: torch.Tensor, b_scales: torch.Tensor, out_dtype: torch.dtype = torch.bfloat16
) -> torch.Tensor:
    """quantize_fp8 (1x128 groups) then block_fp8_gemm_mirror."""
    check_block_fp8_linear_args(x, b, b_scales, out_dtype)
    a, a_scales = quantize_fp8(x, granularity="group", group_size=BLOCK)
    return block_fp8_gemm_mirror(a, a_scales, b, b_scales, out_dtype)
