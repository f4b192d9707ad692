"""E2M1 rounding on fp32 bit patterns, for the MXFP4 and NVFP4 quantize kernels.

Both kernels hold |x| (or the scaled |x|) as fp32 bits and turn it into a 3-bit E2M1 magnitude code with
round-to-nearest-even and saturation at 6.0, without a sticky-bit bookkeeping: the FPU rounds exact values
or integer adds round the bits. `e2m1_code` (MXFP4: v = |x| * 2**-e, exact) rounds small values with an fma
and large ones with integer adds on x's bits; `e2m1_code_of_clamped` (NVFP4: v is an already-rounded fp32
product) rounds every v in one fma against an exponent-dependent base: 4 instructions after the clamp.
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
    itself.
    """
    small = tl.fma(magnitude.to(tl.float32, bitcast=True), inv_scale, 6291456.0).to(tl.uint32, bitcast=True)
    large = tl.minimum(rounded_index - rebias, 7)
    return tl.where(magnitude >= large_from, large, small)


@triton.jit
def round_index(magnitude):
    """(biased exponent << 1 | top mantissa bit) of fp32 bits, significand rounded to 1 bit, ties to even."""
    return (magnitude + 0x1FFFFF + ((magnitude >> 22) & 1)) >> 22


@triton.jit
def e2m1_code_of_clamped(bits, tag):
    """E2M1 code (bits 2:0, then tag's bits 7:3, junk from bit 8) of the fp32 value v with bits `bits`, 0 <= v <= 6.

    One fma rounds v: w = v * 2**-22 + base, with base = 2**E * (1 + (254 + 2E + tag) * 2**-23) and E the
    exponent of max(v, 1) (0, 1 or 2). w's ulp is then 2**(E - 23), v * 2**-22's grid step 2**(E - 1) (0.5
    below 2, 1 below 4, 2 up to 6: E2M1's spacing), so the one rounding of the exact sum adds
    k = RNE(v / 2**(E - 1)) to base's mantissa; that mantissa is even, so ties go to even k, and E2M1's code
    k + 2E has k's parity. With tag = 2 + t the low byte of w is k + 2E + t (254 + 2 = 256 carries out of
    it): the code, plus t's bits. tag: 2 plus a multiple of 8 below 2**22 (bits 7:3 land above the code;
    bits from 8 up only move junk). The product v * 2**-22 is exact and not rounded on its own inside the
    fma, so tiny v cannot underflow into a different rounding. Checked against ml_dtypes' E2M1 cast for
    every fp32 in [0, 6] (tag 2). sm_90: max, shift, imad, fma.
    """
    biased_exponent = tl.maximum(bits, 0x3F800000) >> 23  # 127 + E
    base = biased_exponent * 0x800002 + tag  # (127 + E) << 23 | 254 + 2E + tag: one IMAD
    return tl.fma(bits.to(tl.float32, bitcast=True), 2.0**-22, base.to(tl.float32, bitcast=True)).to(
        tl.uint32, bitcast=True
    )
