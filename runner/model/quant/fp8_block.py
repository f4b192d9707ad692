"""Block FP8 W8A8 (DeepSeek-V3's layout): E4M3 weight with one fp32 scale per 128 x 128 tile, activations
quantized per token per 128 columns at run time; the product is the block-FP8 GEMM
(`kernels.block_fp8_gemm` on CUDA, its precision mirror `reference.gemm.block_fp8` elsewhere).

The GEMM takes K in whole blocks, so K is zero-padded to a multiple of 128 once at load (the weight) and per
call (the activation): zero columns add nothing to a sum and never raise a group's amax."""

from __future__ import annotations

import torch

from reference.gemm.block_fp8 import BLOCK
from runner.model.quant.online import OnlineScheme, zero_pad_columns
from runner.model.quant.scheme import uses_kernels


class Fp8Block(OnlineScheme):
    name = "fp8_block"

    def quantize(self, layer, w: torch.Tensor) -> None:
        from reference.quant.fp8 import quantize_fp8_blocks

        q, s = quantize_fp8_blocks(zero_pad_columns(w, BLOCK), block=BLOCK)
        layer.register_buffer("weight_fp8", q)
        layer.register_buffer("weight_scale_inv", s)  # the name HF's fine-grained FP8 checkpoints use

    def apply(self, layer, x: torch.Tensor) -> torch.Tensor:
        a = zero_pad_columns(x, BLOCK)
        if uses_kernels(x):
            from kernels.block_fp8_gemm import block_fp8_gemm
            from kernels.fp8_quant import quantize_fp8

            aq, a_s = quantize_fp8(a, granularity="group", group_size=BLOCK)
            return block_fp8_gemm(aq, a_s, layer.weight_fp8, layer.weight_scale_inv, x.dtype)
        from reference.gemm.block_fp8 import block_fp8_gemm_mirror
        from reference.quant.fp8 import quantize_fp8

        aq, a_s = quantize_fp8(a, granularity="group", group_size=BLOCK)
        return block_fp8_gemm_mirror(aq, a_s, layer.weight_fp8, layer.weight_scale_inv, x.dtype)
