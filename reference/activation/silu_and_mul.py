"""SiLU-and-mul on the fused gate/up projection: x [..., 2I] -> silu(gate) * up [..., I], gate the first I
columns and up the last I (vLLM's and transformers' layout; the MoE layers use the same,
reference.moe.experts.silu_and_mul).

- `silu_and_mul_mirror`: the kernel's precision (kernels.silu_and_mul): gate and up widened to fp32,
  silu(g) = g / (1 + exp(-g)) and the product in fp32, one rounding to x's dtype. torch's eager
  `F.silu(gate) * up` rounds twice (silu to x's dtype, then the product): up to an ulp apart.
- `silu_and_mul_ideal`: fp64, no rounding: the SQNR reference.
- `silu_and_mul_fp8`: the mirror's output quantized per token and `group_size` columns to E4M3
  (reference.quant.fp8.quantize_fp8): the input a block-FP8 GEMM takes. The fused kernel quantizes exactly
  the values its unfused form writes, so it is held bit for bit to that composition.

Edge cases: NaN in gate or up gives NaN; gate = +Inf gives Inf * up; gate = -Inf gives NaN (-Inf / Inf in
the formula, as torch's silu returns); a gate so negative that exp(-g) overflows gives -0.0 * up.
"""

from __future__ import annotations

import torch

from reference.quant.fp8 import quantize_fp8


def check_silu_and_mul_args(x: torch.Tensor) -> int:
    """TypeError/ValueError naming `x`; returns I, half of x's last dimension."""
    if not isinstance(x, torch.Tensor) or x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise TypeError(f"x: must be a bf16, fp16 or fp32 tensor, got {getattr(x, 'dtype', type(x))}")
    if x.dim() < 1 or x.shape[-1] % 2:
        raise ValueError(f"x: last dimension must be even (gate then up), got shape {tuple(x.shape)}")
    return x.shape[-1] // 2


def silu_and_mul_mirror(x: torch.Tensor) -> torch.Tensor:
    check_silu_and_mul_args(x)
    gate, up = x.float().chunk(2, dim=-1)
    return (gate / (1.0 + torch.exp(-gate)) * up).to(x.dtype)


def silu_and_mul_ideal(x: torch.Tensor) -> torch.Tensor:
    check_silu_and_mul_args(x)
    gate, up = x.double().chunk(2, dim=-1)
    return gate / (1.0 + torch.exp(-gate)) * up


def silu_and_mul_fp8(x: torch.Tensor, group_size: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """(E4M3 codes [..., I], fp32 scales [..., I / group_size]) of the mirror's output."""
    return quantize_fp8(silu_and_mul_mirror(x), granularity="group", group_size=group_size)
