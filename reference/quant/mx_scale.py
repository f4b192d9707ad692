"""Shared-scale rules of the MX formats: which power of two a block of values is divided by.

Given the block's largest magnitude `amax`, the scale is X = 2**e with, for an element type whose largest
power of two is 2**emax_elem and whose largest value is elem_max (E2M1: emax_elem = 2, elem_max = 6):

| mode    | e                                             | source / users                                       |
|---------|-----------------------------------------------|------------------------------------------------------|
| "floor" | floor(log2 amax) - emax_elem                  | OCP MX v1.0 section 6.3; torchao's default; may clip |
| "rceil" | ceil(log2(amax / elem_max))                   | cuBLAS, triton_kernels' default, DeepGEMM (UE8M0)    |
| "even"  | floor(log2(round1(amax))) - emax_elem         | vLLM's test reference_mxfp4.py, torchao EVEN         |
| "ceil"  | ceil(log2 amax) - emax_elem                   | torchao CEIL                                         |

round1 rounds amax's significand to one fractional bit, half up (1.75 -> 2): the "add 1<<21, mask the
exponent" bit trick. With amax = m * 2**k (1 <= m < 2) the modes bump the exponent over "floor" when m > 1.5
(rceil), m >= 1.75 (even), m > 1 (ceil).

Policy (documented, shared by every MX quantizer here):
- e is clamped to [-127, 127], the E8M0 range. Only tiny blocks reach the lower clamp (microxcaling and
  torchao clamp at -127 too); no finite fp32 amax reaches the upper one.
- amax == 0 (all-zero block, signed zeros included): e = -127, byte 0x00 (microxcaling and torchao agree).
- amax NaN or Inf (a NaN or an Inf anywhere in the block): byte 0xFF (NaN); MX has no Inf, so the block
  is not representable. microxcaling does the same; torchao gives 0xFF for a NaN amax only.

All arithmetic is on float64, where every fp32/bf16/fp16 amax is a normal number, and amax / elem_max is
exact enough: amax has at most 24 significant bits, so amax / 6 is never within 2**-53 of a power of two
without being one. (torch.frexp would read the same exponents, but inductor's CPU codegen fails on its
int32 output inside float64 loops in torch 2.13, and the compiled reference is a benchmark baseline.)
"""

from __future__ import annotations

import torch

from reference.formats.e8m0 import E8M0_BIAS, E8M0_MAX_EXPONENT, E8M0_MIN_EXPONENT, E8M0_NAN

SCALE_MODES = ("floor", "rceil", "even", "ceil")


def floor_log2(x: torch.Tensor) -> torch.Tensor:
    """Exact floor(log2 x) for positive normal float64 x, as int64: x's unbiased exponent field."""
    return ((x.view(torch.int64) >> 52) & 0x7FF) - 1023


def ceil_log2(x: torch.Tensor) -> torch.Tensor:
    """Exact ceil(log2 x) for positive normal float64 x: one more than floor unless x is a power of two."""
    fraction = x.view(torch.int64) & ((1 << 52) - 1)
    return floor_log2(x) + (fraction != 0).to(torch.int64)


def round_significand_1bit_half_up(x: torch.Tensor) -> torch.Tensor:
    """Round positive x to 1 fractional significand bit, ties up: m * 2**k -> {1, 1.5, 2} * 2**k."""
    scale = torch.ldexp(torch.ones_like(x), floor_log2(x) - 1)  # half of x's binade unit
    return torch.floor(x / scale + 0.5) * scale


def shared_exponent(amax: torch.Tensor, mode: str, *, emax_elem: int, elem_max: float) -> torch.Tensor:
    """Unbiased scale exponent e (int64) per block for a positive, finite, nonzero float64 amax."""
    if mode == "floor":
        e = floor_log2(amax) - emax_elem
    elif mode == "rceil":
        e = ceil_log2(amax / elem_max)
    elif mode == "even":
        e = floor_log2(round_significand_1bit_half_up(amax)) - emax_elem
    elif mode == "ceil":
        e = ceil_log2(amax) - emax_elem
    else:
        raise ValueError(f"scale_mode must be one of {SCALE_MODES}, got {mode!r}")
    return e.clamp(E8M0_MIN_EXPONENT, E8M0_MAX_EXPONENT)


def mx_block_scales(blocks: torch.Tensor, mode: str, *, emax_elem: int, elem_max: float) -> torch.Tensor:
    """E8M0 scale byte (uint8) for each block along the last dim of `blocks`, with the policy above."""
    exact = blocks.to(torch.float64)
    amax = exact.abs().amax(dim=-1)
    not_finite = ~torch.isfinite(exact).all(dim=-1)
    is_zero = amax == 0
    safe = torch.where(is_zero | not_finite, torch.ones_like(amax), amax)
    e = shared_exponent(safe, mode, emax_elem=emax_elem, elem_max=elem_max)
    e = torch.where(is_zero, torch.full_like(e, E8M0_MIN_EXPONENT), e)
    scale = (e + E8M0_BIAS).to(torch.uint8)
    return torch.where(not_finite, torch.full_like(scale, E8M0_NAN), scale)
