"""An activation its producer already quantized for the next GEMM (vLLM fuses the same way: RMSNorm and
SiLU-and-mul write the block-FP8 GEMM's input).

A block-FP8 layer (runner.model.quant.fp8_block) multiplies E4M3 activations with one fp32 scale per token and
128 columns. Quantizing them is a launch of its own before every such GEMM unless the kernel that computes the
activation quantizes its own output in registers: kernels.rms_norm.rms_norm_fp8 and
kernels.silu_and_mul.silu_and_mul_fp8 do, bit for bit what the separate quantizer writes over their unfused
output. A scheme that takes such input says so (`LinearScheme.takes_fp8_groups`); the layer that feeds it asks
its producer for `Fp8Groups` (`wants_fp8_groups`) only where the kernels run and the columns fill whole groups.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

GROUP = 128  # the block-FP8 GEMM's activation group (DeepSeek-V3's)


class Fp8Groups(NamedTuple):
    codes: torch.Tensor  # float8_e4m3fn [T, K]
    scales: torch.Tensor  # float32 [T, K / GROUP]
    dtype: torch.dtype  # the activation's own dtype: the GEMM's output dtype


def wants_fp8_groups(consumer, x: torch.Tensor, columns: int) -> bool:
    """Whether the producer of `consumer`'s input (a Linear) should hand it Fp8Groups: its scheme takes them,
    the Triton kernels run for x (CUDA, bf16) and the `columns` fill whole groups."""
    from runner.model.quant.scheme import uses_kernels

    return getattr(consumer.scheme, "takes_fp8_groups", False) and uses_kernels(x) and columns % GROUP == 0
