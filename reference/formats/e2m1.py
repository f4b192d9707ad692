"""E2M1 (FP4) element codec, as used by OCP MX v1.0 (MXFP4) and NVFP4.

Format: 1 sign bit, 2 exponent bits (bias 1), 1 mantissa bit; no Inf, no NaN. The eight magnitudes are
0, 0.5 (the one subnormal), 1, 1.5, 2, 3, 4, 6; code c in 0..7 is the magnitude index, bit 3 the sign
(0x8 is -0).

`encode_e2m1` is round-to-nearest, ties-to-even on the code (even codes have mantissa bit 0), computed
on the exact value: the input is widened to float64, where every finite fp32/bf16/fp16 value and every
power-of-two scaling of it used by the MX formats is exact, and compared with the midpoints between the
magnitudes (exact too), so there are no intermediate roundings and no sticky-bit bookkeeping. Values above
6 saturate to 6. The sign bit is the input's sign bit, so -0.0 and negative values that round to zero give
0x8. NaN has no encoding: callers (the MX quantizers) carry NaN
in the block scale and never pass NaN here; if they do, it encodes as 0x0 / 0x8 by its sign bit.
"""

from __future__ import annotations

import itertools

import torch

E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
E2M1_MAX = 6.0
# Largest power of two the element type can represent (4 = 2**2): the MX spec's emax_elem.
E2M1_EMAX = 2
SIGN_BIT = 0x8
# Halfway between neighbouring magnitudes, and the halfway points whose tie goes up (to the even upper code).
MIDPOINTS = tuple((a + b) / 2 for a, b in itertools.pairwise(E2M1_MAGNITUDES))
TIES_UP = tuple(m for code, m in enumerate(MIDPOINTS) if code % 2 == 1)


def encode_e2m1(values: torch.Tensor) -> torch.Tensor:
    """Round each value to the nearest E2M1 code (ties to even code), saturating. Returns uint8 codes 0..15."""
    magnitude = values.to(torch.float64).abs()
    # Code c covers (MIDPOINTS[c - 1], MIDPOINTS[c]]: a value on a midpoint goes to the lower code, then one up
    # where the upper neighbour is the even code (0.75 -> 1.0, 1.75 -> 2.0, 3.5 -> 4.0). Above 6: code 7.
    code = torch.bucketize(magnitude, _grid(MIDPOINTS, values.device))
    code += torch.isin(magnitude, _grid(TIES_UP, values.device)).to(code.dtype)
    code = code.masked_fill(magnitude.isnan(), 0)  # NaN has no code: 0x0 / 0x8 by its sign bit
    sign = torch.signbit(values).to(torch.uint8) * SIGN_BIT
    return code.to(torch.uint8) | sign


def _grid(points: tuple[float, ...], device) -> torch.Tensor:
    return torch.tensor(points, dtype=torch.float64, device=device)


def decode_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """Codes 0..15 (uint8) to float32 values; 0x8 decodes to -0.0."""
    grid = torch.tensor(E2M1_MAGNITUDES, dtype=torch.float32, device=codes.device)
    magnitude = grid[(codes & 0x7).long()]
    return torch.where((codes & SIGN_BIT) != 0, -magnitude, magnitude)
