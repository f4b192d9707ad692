"""E2M1 (FP4) element codec, as used by OCP MX v1.0 (MXFP4) and NVFP4.

Format: 1 sign bit, 2 exponent bits (bias 1), 1 mantissa bit; no Inf, no NaN. The eight magnitudes are
0, 0.5 (the one subnormal), 1, 1.5, 2, 3, 4, 6; code c in 0..7 is the magnitude index, bit 3 the sign
(0x8 is -0).

`encode_e2m1` is round-to-nearest, ties-to-even on the code (even codes have mantissa bit 0), computed
on the exact value: the input is widened to float64, where every finite fp32/bf16/fp16 value and every
power-of-two scaling of it used by the MX formats is exact, so there are no intermediate roundings and no
sticky-bit bookkeeping. Values above 6 saturate to 6. The sign bit is the input's sign bit, so -0.0 and
negative values that round to zero give 0x8. NaN has no encoding: callers (the MX quantizers) carry NaN
in the block scale and never pass NaN here; if they do, it encodes as 0x0 / 0x8 by its sign bit.
"""

from __future__ import annotations

import torch

E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
E2M1_MAX = 6.0
# Largest power of two the element type can represent (4 = 2**2): the MX spec's emax_elem.
E2M1_EMAX = 2
SIGN_BIT = 0x8


def encode_e2m1(values: torch.Tensor) -> torch.Tensor:
    """Round each value to the nearest E2M1 code (ties to even code), saturating. Returns uint8 codes 0..15."""
    exact = values.to(torch.float64)
    grid = torch.tensor(E2M1_MAGNITUDES, dtype=torch.float64, device=values.device)
    # Saturate first: beyond 6 every grid point is "equally far" once the distances round in float64.
    distance = (exact.abs().clamp(max=E2M1_MAX).unsqueeze(-1) - grid).abs()
    nearest = distance == distance.amin(dim=-1, keepdim=True)
    # At most two neighbours tie (adjacent codes, one even, one odd): take the even one when it ties.
    even = nearest & (torch.arange(8, device=values.device) % 2 == 0)
    code = torch.where(even.any(dim=-1), even.to(torch.uint8).argmax(dim=-1), nearest.to(torch.uint8).argmax(dim=-1))
    sign = torch.signbit(exact).to(torch.uint8) * SIGN_BIT
    return (code.to(torch.uint8) | sign).to(torch.uint8)


def decode_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """Codes 0..15 (uint8) to float32 values; 0x8 decodes to -0.0."""
    grid = torch.tensor(E2M1_MAGNITUDES, dtype=torch.float32, device=codes.device)
    magnitude = grid[(codes & 0x7).long()]
    return torch.where((codes & SIGN_BIT) != 0, -magnitude, magnitude)
