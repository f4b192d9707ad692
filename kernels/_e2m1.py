"""E2M1 rounding on fp32 bit patterns, shared by the MXFP4 and NVFP4 quantize kernels.

Both kernels hold |x| (or the scaled |x|) as fp32 bits and turn it into a 3-bit E2M1 magnitude code with
round-to-nearest-even and saturation at 6.0, without a sticky-bit bookkeeping: the FPU rounds exact values
(small path) and integer adds round the bits (large path).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def e2m1_code(magnitude, rounded_index, inv_scale, rebias, large_from):
    """E2M1 code (bits 2:0; bits 21:3 are zero, bits above are junk) of v = |x| * 2**-e: RNE, saturating.

    - v < 2 (codes 0..4 are exactly 2v): the FPU rounds in one fma, |x| * 2**-e + 1.5 * 2**22, whose fp32
      ulp is 0.5, so the sum's low mantissa bits are round-to-nearest-even(2v); 1.5 * 2**22 has a zero low
      byte. 2**-e lies in [2**-126, 2**127] and the fused product is not rounded before the add.
    - v >= 2 (x is then an fp32 normal): `rounded_index` is x's (biased exponent, top mantissa bit) after
      rounding its significand to 1 bit with ties to even (see `round_index`); subtracting
      rebias = (126 + e) << 1 gives the E2M1 code, and min() saturates at 6.0.
    magnitude: fp32 bits of |x|; inv_scale = 2**-e (fp32); large_from: fp32 bits of 2**(e + 1).
    With e = 0 (inv_scale 1.0, rebias 252, large_from 0x40000000) this is the E2M1 code of the fp32 value
    itself: the NVFP4 kernel's case, whose scaled values are already rounded fp32 products.
    """
    small = tl.fma(magnitude.to(tl.float32, bitcast=True), inv_scale, 6291456.0).to(tl.uint32, bitcast=True)
    large = tl.minimum(rounded_index - rebias, 7)
    return tl.where(magnitude >= large_from, large, small)


@triton.jit
def round_index(magnitude):
    """(biased exponent << 1 | top mantissa bit) of fp32 bits, significand rounded to 1 bit, ties to even."""
    return (magnitude + 0x1FFFFF + ((magnitude >> 22) & 1)) >> 22
