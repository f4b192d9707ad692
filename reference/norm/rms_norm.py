"""RMSNorm, alone or fused with the residual add before it: the definition the Triton kernel is checked against.

Spec: `out = weight * (r * rsqrt(mean(r^2) + eps))` over the last dim (Zhang & Sennrich 2019, as in Llama and
SmolLM2), where `r = x`, or with `residual` given `r = x + residual` in x's dtype (one rounding, as vLLM's
fused_add_rms_norm) and `r` is returned too as the new residual stream. Precision mirrors runner/model/layers.py
RMSNorm op for op: r widened to fp32, sum of squares and mean in fp32, `+ eps`, rsqrt, multiply, round to x's
dtype, THEN the weight multiply in x's dtype (one more rounding; for bf16/fp16 the product of two narrow values
is exact in fp32, so it rounds once). The kernel sums the squares in another order and its rsqrt is
approximate, so the two can differ by an ulp: a lossy op (kernels.tolerances row "rms_norm").

`rms_norm_fp8` is the output quantized for a block-FP8 GEMM (E4M3 per token and 128-wide group,
reference.quant.fp8.quantize_fp8): the kernel's fused form quantizes exactly what its unfused form writes, so it
is held bit for bit to that composition over the kernel's own output.

Edge-case policy (all follow from the formula in fp32, as in the runner):
- a row of zeros gives zeros (eps > 0 keeps the rsqrt finite), signs of -0 follow the products;
- a row whose fp32 sum of squares overflows (|x| around 1.8e19 and up) has rsqrt(inf) = 0 and gives zeros
  (+-0), an Inf in a row gives NaN at the Inf and zeros elsewhere; a NaN poisons its whole row;
- subnormal inputs are ordinary fp32 values after widening; no saturation: the final rounding is RNE and may
  overflow to Inf only where weight * normalized value exceeds the dtype's range.
"""

from __future__ import annotations

import torch

from reference.quant.fp8 import quantize_fp8

DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def check_rms_norm_args(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None) -> None:
    """Raise TypeError/ValueError naming the bad argument. Shared with the kernel launchers."""
    if x.dtype not in DTYPES:
        raise TypeError(f"x: dtype must be one of {DTYPES}, got {x.dtype}")
    if x.dim() == 0:
        raise ValueError("x: needs at least one dimension")
    if weight.dtype != x.dtype:
        raise TypeError(f"weight: dtype must be x's {x.dtype} (the multiply is in x's dtype), got {weight.dtype}")
    if weight.shape != x.shape[-1:]:
        raise ValueError(f"weight: shape must be ({x.shape[-1]},) (x's last dim), got {tuple(weight.shape)}")
    if not eps > 0:
        raise ValueError(f"eps: must be positive so that a row of zeros normalizes to zeros, got {eps}")
    if residual is not None:
        if residual.dtype != x.dtype:
            raise TypeError(f"residual: dtype must be x's {x.dtype}, got {residual.dtype}")
        if residual.shape != x.shape:
            raise ValueError(f"residual: shape must be x's {tuple(x.shape)}, got {tuple(residual.shape)}")


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
    """`out`, or `(out, x + residual)` when `residual` is given; see the module docstring."""
    check_rms_norm_args(x, weight, eps, residual)
    r = x if residual is None else x + residual
    wide = r.float()
    wide = wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + eps)
    out = weight * wide.to(x.dtype)
    return out if residual is None else (out, r)


def rms_norm_fp8(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
    """(codes, scales) of `rms_norm`'s output (E4M3, group 128), or ((codes, scales), x + residual)."""
    out = rms_norm(x, weight, eps, residual)
    normed = out if residual is None else out[0]
    quantized = quantize_fp8(normed, granularity="group", group_size=128)
    return quantized if residual is None else (quantized, out[1])


def rms_norm_ideal(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
    """The same formula in fp64 with no intermediate rounding (r = x + residual exactly): the SQNR reference."""
    check_rms_norm_args(x, weight, eps, residual)
    r = x.double() if residual is None else x.double() + residual.double()
    out = weight.double() * (r * torch.rsqrt(r.pow(2).mean(-1, keepdim=True) + eps))
    return out if residual is None else (out, r)
