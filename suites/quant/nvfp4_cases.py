"""NVFP4 test material: named special cases with expected bytes, and input generators.

Every expected byte was worked out by hand from the algorithm in `reference.quant.nvfp4` (the arithmetic
is in each case's note; q = s/6 is fp32(1/6) = 0.16666667163 for s = 1) and is checked against the
reference, the kernels and the ml_dtypes oracle. Random data never reaches most of these: the double-
rounding block needs fp32 products that land exactly on an E2M1 midpoint.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from suites.quant.mxfp4_cases import FP32_MAX, SPECIALS, bits_of, inject, random_blocks  # noqa: F401 (re-exported)
from suites.quant.mxfp4_cases import near_midpoints as mx_near_midpoints

BLOCK = 16


@dataclasses.dataclass(frozen=True)
class QuantCase:
    name: str
    values: tuple[float, ...]  # the first elements of one 16-element block; the rest are +0.0
    encode_scale: float  # s_enc
    scale: int  # expected E4M3 byte
    codes: tuple[int, ...]  # expected first packed bytes; the remaining bytes must be 0x00
    note: str
    dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16)

    def block(self, dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor(list(self.values) + [0.0] * (BLOCK - len(self.values)), dtype=torch.float64).to(dtype)

    def expected_codes(self) -> torch.Tensor:
        return torch.tensor(list(self.codes) + [0] * (BLOCK // 2 - len(self.codes)), dtype=torch.uint8)


_ULP_QUARTER = 2.0**-25  # fp32 ulp at 0.25
# Block amax 7 with s = 1: sf = fp32(7 * q) = 1.16666675 -> E4M3 1.125 (0x39); r = fp32(1/1.125) =
# 0.88888890 (just above 8/9). Each probe p = 1.125 * midpoint has an exact product p * r just ABOVE the
# midpoint that rounds in fp32 to the midpoint itself, so the E2M1 rounding sees a tie: two roundings give
# the even code, one (a fused multiply-add) gives the upper code for 0.25, 1.25, 2.5 and 5.
DOUBLE_ROUNDING = (7.0, 0.28125, 0.84375, 1.40625, 1.96875, 2.8125, 3.9375, 5.625)
QUANT_CASES = (
    QuantCase("all_zero", (0.0,), 1.0, 0x00, (), "amax 0: sf 0 -> byte 0, r = 0, codes +0"),
    QuantCase(
        "negative_zero_keeps_sign",
        (-0.0, 0.0, 0.0, -0.0),
        1.0,
        0x00,
        (0x08, 0x80),
        "-0.0 -> 0x8 in its nibble; element 2i low",
    ),
    QuantCase(
        "exact_grid",
        (0.5, 1, 1.5, 2, 3, 4, 6, -6),
        1.0,
        0x38,
        (0x21, 0x43, 0x65, 0xF7),
        "amax 6: sf = fp32(6 * q) = 1.0 (0x38), r = 1; every value on the grid",
    ),
    QuantCase(
        "ties_to_even",
        (6, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, -0.25),
        1.0,
        0x38,
        (0x07, 0x22, 0x44, 0x86),
        "r = 1: 0.25->0, 0.75->1.0(c2), 1.25->1.0(c2), 1.75->2(c4), 2.5->2(c4), 3.5->4(c6), -0.25->-0",
    ),
    QuantCase("tie_at_5", (6, 5, -5), 1.0, 0x38, (0x67, 0x0E), "5 is the 4|6 midpoint -> 4 (c6)"),
    QuantCase(
        "block_scale_rounds",
        (7, 1, 0.5),
        1.0,
        0x39,
        (0x27, 0x01),
        "sf = 1.16666675 -> E4M3 1.125 (0x39, nearer than 1.25); r = 0.8888889: 7->6.22 sat (c7), "
        "1->0.89->1.0 (c2), 0.5->0.44->0.5 (c1)",
    ),
    QuantCase(
        "block_scale_tie_to_even",
        (6.375, 1),
        1.0,
        0x38,
        (0x27,),
        "sf = fp32(6.375 * q) = 1.0625, the 1.0|1.125 midpoint -> 1.0 (even mantissa); 6.375 saturates",
    ),
    QuantCase(
        "double_rounding",
        DOUBLE_ROUNDING,
        1.0,
        0x39,
        (0x07, 0x22, 0x44, 0x66),
        "fp32(p * r) is exactly each midpoint: ties to even 0.25->0, .75->c2, 1.25->c2, 1.75->c4, 2.5->c4, "
        "3.5->c6, 5->c6 (a single rounding would give c1, c3, c5, c7 for 0.25, 1.25, 2.5, 5)",
    ),
    QuantCase(
        "fp32_sticky_above_quarter",
        (6, 0.25 + _ULP_QUARTER, 0.25 + 2 * _ULP_QUARTER, 0.25 + 3 * _ULP_QUARTER),
        1.0,
        0x38,
        (0x17, 0x11),
        "r = 1: 0.25 + {1,2,3} ulp is above the 0|0.5 midpoint -> 0.5 (c1)",
        (torch.float32,),
    ),
    QuantCase(
        "global_scale_from_amax",
        (6, -3, 1.5),
        448.0,
        0x7E,
        (0xD7, 0x03),
        "s = 2688/6 = 448, q = 74.666664; sf = 447.99998 -> 448 (0x7E); r = 448/448 = 1",
    ),
    QuantCase(
        "block_above_global_amax_saturates",
        (12, 1),
        448.0,
        0x7E,
        (0x27,),
        "sf = 896 clamps to 448 (0x7E): r = 1, 12 saturates at 6 (c7)",
    ),
    QuantCase(
        "block_scale_subnormal",
        (6 * 2**-8, 3 * 2**-8),
        1.0,
        0x02,
        (0x57,),
        "sf = 2**-8 = E4M3 subnormal 2 * 2**-9 (0x02); r = 2**8: 6 (c7), 3 (c5)",
    ),
    QuantCase(
        "block_scale_underflows",
        (6 * 2**-11, -(2**-11)),
        1.0,
        0x00,
        (0x80,),
        "sf = 2**-11 < 2**-10 (half the smallest subnormal) -> 0: r = 0, codes keep their signs",
    ),
    QuantCase("nan_block", (math.nan, 1.0, 2.0), 1.0, 0x7F, (), "NaN anywhere: scale 0x7F, codes 0"),
    QuantCase("inf_block", (math.inf, 1.0), 1.0, 0x7F, (), "Inf anywhere: scale 0x7F, codes 0"),
    QuantCase("neg_inf_block", (-math.inf, 1.0), 448.0, 0x7F, (), "-Inf anywhere: scale 0x7F, codes 0"),
)


@dataclasses.dataclass(frozen=True)
class DequantCase:
    name: str
    code: int  # one nibble, in element 0
    scale: int  # E4M3 byte
    decode_scale: float
    expected: dict  # output dtype -> expected bits of element 0 (None: NaN)
    note: str


DEQUANT_CASES = (
    DequantCase(
        "largest",
        0x7,
        0x7E,
        1.0,
        {torch.bfloat16: 0x4528, torch.float16: 0x6940, torch.float32: 0x45280000},
        "6 * 448 = 2688 = 1.3125 * 2**11",
    ),
    DequantCase(
        "overflow_saturates",
        0x7,
        0x7E,
        2.0**120,
        {torch.bfloat16: 0x7F7F, torch.float16: 0x7BFF, torch.float32: 0x7F7FFFFF},
        "d = 448 * 2**120 fits fp32, 6 * d does not: NVFP4 has no Inf, so it saturates",
    ),
    DequantCase(
        "rounds_to_output",
        0x3,
        0x39,
        1.0 + 2.0**-10,
        {torch.bfloat16: 0x3FD8, torch.float16: 0x3EC2},
        "d = 9/8 * 1025/1024 exact; 1.5 * d = 1.68914795 -> bf16 1.6875, fp16 1.68945312 (RNE)",
    ),
    DequantCase(
        "negative_zero",
        0x8,
        0x38,
        1.0,
        {torch.bfloat16: -0x8000, torch.float16: -0x8000, torch.float32: -(2**31)},
        "code 0x8 is -0.0",
    ),
    DequantCase(
        "subnormal_scale",
        0x1,
        0x01,
        1.0,
        {torch.bfloat16: 0x3A80, torch.float32: 0x3A800000},
        "E4M3 0x01 = 2**-9 (a subnormal scale, not 0.0088); 0.5 * 2**-9 = 2**-10",
    ),
    DequantCase(
        "negative_scale_byte",
        0x2,
        0xB8,
        1.0,
        {torch.bfloat16: -0x4080, torch.float32: -0x40800000},
        "scale byte 0xB8 = -1.0: the sign is honoured, 1.0 * -1.0 = -1.0 (0xBF80)",
    ),
    DequantCase(
        "nan_scale",
        0x2,
        0x7F,
        1.0,
        {torch.bfloat16: None, torch.float16: None, torch.float32: None},
        "scale 0x7F decodes the whole block to NaN",
    ),
    DequantCase(
        "negative_nan_scale", 0x0, 0xFF, 1.0, {torch.bfloat16: None, torch.float32: None}, "scale 0xFF is NaN too"
    ),
)


def random_nvfp4_blocks(shape: tuple[int, ...], dtype: torch.dtype, seed: int, spread: float) -> torch.Tensor:
    """Normal data whose 16-element blocks get magnitudes 2**U(-spread, spread)."""
    return random_blocks(shape, dtype, seed, spread, block=BLOCK)


def near_midpoints(exponents: tuple[int, ...] = (-8, -3, 0, 5, 8)) -> torch.Tensor:
    """fp32 blocks probing 1-4 ulp around every E2M1 midpoint; with s = 1, element 0 = 6 * 2**k makes the
    block scale exactly 2**k (E4M3 holds 2**-9..2**8), so r = 2**-k and the products are exact."""
    return mx_near_midpoints(exponents, block=BLOCK)


def double_rounding_blocks() -> torch.Tensor:
    """The double-rounding block at several magnitudes (s = 1 keeps its scale in E4M3 range), both signs."""
    rows = [torch.tensor(DOUBLE_ROUNDING + (0.0,) * 8, dtype=torch.float64) * 2.0**k for k in (-6, -2, 0, 3, 5)]
    x = torch.stack(rows)
    return torch.cat((x, -x)).to(torch.float32)
