"""MXFP4 test material: named special cases with expected bytes, and the input generators the suites share.

Every expected byte below was worked out by hand from the spec (the arithmetic is in each case's note) and
is checked against the reference, the kernels and the ml_dtypes oracle.
"""

from __future__ import annotations

import dataclasses
import math

import torch

FP32_MAX = 3.4028234663852886e38


@dataclasses.dataclass(frozen=True)
class QuantCase:
    name: str
    values: tuple[float, ...]  # the first elements of one 32-element block; the rest are +0.0
    mode: str
    scale: int  # expected E8M0 byte
    codes: tuple[int, ...]  # expected first packed bytes; the remaining bytes must be 0x00
    note: str
    dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16)

    def block(self, dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor(list(self.values) + [0.0] * (32 - len(self.values)), dtype=torch.float64).to(dtype)

    def expected_codes(self) -> torch.Tensor:
        return torch.tensor(list(self.codes) + [0] * (16 - len(self.codes)), dtype=torch.uint8)


_ULP_QUARTER = 2.0**-25  # fp32 ulp at 0.25
QUANT_CASES = (
    QuantCase("all_zero", (0.0,), "floor", 0x00, (), "amax 0: policy byte 0x00 (2**-127)"),
    QuantCase(
        "negative_zero_keeps_sign",
        (-0.0, 0.0, 0.0, -0.0),
        "floor",
        0x00,
        (0x08, 0x80),
        "-0.0 -> 0x8 in its nibble; element 2i low",
    ),
    QuantCase(
        "exact_grid",
        (0.5, 1, 1.5, 2, 3, 4, 6, -6),
        "floor",
        127,
        (0x21, 0x43, 0x65, 0xF7),
        "amax 6: floor(log2 6) - 2 = 0; every value on the grid, codes 1..7 and 0xF",
    ),
    QuantCase(
        "ties_to_even",
        (4, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, -0.25),
        "floor",
        127,
        (0x06, 0x22, 0x44, 0x86),
        "0.25->0, 0.75->1.0(c2), 1.25->1.0(c2), 1.75->2(c4), 2.5->2(c4), 3.5->4(c6), -0.25->-0",
    ),
    QuantCase("tie_at_5", (6, 5, -5), "floor", 127, (0x67, 0x0E), "5 is the 4|6 midpoint -> 4 (c6)"),
    QuantCase("floor_clips_max", (7, 1), "floor", 127, (0x27,), "m=1.75 > 1.5: 7 saturates to 6 (c7)"),
    QuantCase("rceil_never_clips", (7, 1), "rceil", 128, (0x16,), "ceil(log2(7/6)) = 1: 3.5->4(c6), 0.5(c1)"),
    QuantCase("even_bumps_at_1_75", (7, 1), "even", 128, (0x16,), "m=1.75 rounds to 2: e=1"),
    QuantCase("even_keeps_below_1_75", (6.5, 1), "even", 127, (0x27,), "m=1.625: e=0, 6.5 saturates to 6"),
    QuantCase("ceil_bumps_above_1", (7, 1), "ceil", 128, (0x16,), "ceil(log2 7) - 2 = 1"),
    QuantCase("ceil_at_power_of_two", (4, 1), "ceil", 127, (0x26,), "ceil(log2 4) - 2 = 0"),
    QuantCase(
        "fp32_sticky_above_quarter",
        (4, 0.25 + _ULP_QUARTER, 0.25 + 2 * _ULP_QUARTER, 0.25 + 3 * _ULP_QUARTER),
        "floor",
        127,
        (0x16, 0x11),
        "0.25 + {1,2,3} ulp is above the 0|0.5 midpoint -> 0.5 (c1)",
        (torch.float32,),
    ),
    QuantCase(
        "fp32_below_quarter",
        (4, 0.25 - _ULP_QUARTER / 2),
        "floor",
        127,
        (0x06,),
        "just below 0.25 -> 0",
        (torch.float32,),
    ),
    QuantCase(
        "subnormal_inputs",
        (1.5 * 2**-127, 2**-127, 2**-128, 2**-129, -(2**-128)),
        "floor",
        0x00,
        (0x23, 0x01, 0x09),
        "amax 1.5*2**-127 clamps e to -127: values 1.5, 1, .5, .25(tie->0), -.5",
    ),
    QuantCase(
        "subnormal_inputs_rceil",
        (1.5 * 2**-127, 2**-127, 2**-128, 2**-129, -(2**-128)),
        "rceil",
        0x00,
        (0x23, 0x01, 0x09),
        "ceil(log2(amax/6)) = -129 clamps to -127",
    ),
    QuantCase("nan_block", (math.nan, 1.0, 2.0), "floor", 0xFF, (), "NaN anywhere: scale 0xFF, codes 0"),
    QuantCase("inf_block", (math.inf, 1.0), "rceil", 0xFF, (), "Inf anywhere: scale 0xFF, codes 0"),
    QuantCase("neg_inf_block", (-math.inf, 1.0), "even", 0xFF, (), "-Inf anywhere: scale 0xFF, codes 0"),
    QuantCase(
        "fp32_max_floor",
        (FP32_MAX, -1e38),
        "floor",
        252,
        (0xC7,),
        "e = 127 - 2: 7.99 saturates (c7); -1e38/2**125 = -2.35 -> -2 (0xC)",
        (torch.float32,),
    ),
    QuantCase(
        "fp32_max_rceil",
        (FP32_MAX, -1e38),
        "rceil",
        253,
        (0xA6,),
        "e = ceil(log2(max/6)) = 126: 3.99 -> 4 (c6); -1.18 -> -1 (0xA)",
        (torch.float32,),
    ),
)


@dataclasses.dataclass(frozen=True)
class DequantCase:
    name: str
    code: int  # one nibble, in element 0
    scale: int
    expected: dict  # output dtype -> expected bits of element 0 (None: NaN)
    note: str


_BITS_DTYPE = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32}
DEQUANT_CASES = (
    DequantCase(
        "product_overflows_saturates",
        0x7,
        254,
        {torch.bfloat16: 0x7F7F, torch.float16: 0x7BFF, torch.float32: 0x7F7FFFFF},
        "6 * 2**127 is past every dtype's max: MX has no Inf, so it saturates",
    ),
    DequantCase(
        "fp16_saturates", 0x7, 127 + 14, {torch.float16: 0x7BFF, torch.bfloat16: 0x47C0}, "6 * 2**14 = 98304 > 65504"
    ),
    DequantCase(
        "smallest_product_subnormal",
        0x1,
        0,
        {torch.bfloat16: 0x0020, torch.float16: 0x0000, torch.float32: 0x00200000},
        "0.5 * 2**-127 = 2**-128: a bf16/fp32 subnormal, 0 in fp16",
    ),
    DequantCase(
        "negative_zero",
        0x8,
        127,
        {torch.bfloat16: -0x8000, torch.float16: -0x8000, torch.float32: -(2**31)},
        "code 0x8 is -0.0",
    ),
    DequantCase(
        "one_and_a_half",
        0x3,
        127,
        {torch.bfloat16: 0x3FC0, torch.float16: 0x3E00, torch.float32: 0x3FC00000},
        "code 3 with scale 1",
    ),
    DequantCase(
        "negative_six_times_256",
        0xF,
        135,
        {torch.bfloat16: -0x3B40, torch.float16: -0x1A00},
        "-6 * 2**8 = -1536: bf16 0xC4C0, fp16 0xE600 (as signed int16)",
    ),
    DequantCase(
        "nan_scale",
        0x2,
        0xFF,
        {torch.bfloat16: None, torch.float16: None, torch.float32: None},
        "scale 0xFF decodes the whole block to NaN",
    ),
)


def bits_of(t: torch.Tensor) -> torch.Tensor:
    return t.view(_BITS_DTYPE[t.dtype])


def random_blocks(
    shape: tuple[int, ...], dtype: torch.dtype, seed: int, spread: float, block: int = 32
) -> torch.Tensor:
    """Normal data whose blocks of `block` get magnitudes 2**U(-spread, spread): many scale exponents per tensor."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=gen, dtype=torch.float32)
    blocks = x.unflatten(-1, (-1, block))
    exponent = (torch.rand((*blocks.shape[:-1], 1), generator=gen) * 2 - 1) * spread
    return (blocks * torch.exp2(exponent.round())).flatten(-2).to(dtype)


SPECIALS = {
    "nan": math.nan,
    "inf": math.inf,
    "-inf": -math.inf,
    "+0": 0.0,
    "-0": -0.0,
    "subnormal": 2**-130,
    "-subnormal": -(2**-133),
    "max": FP32_MAX,
    "tie": 0.25,
    "big": 1e30,
}


def inject(x: torch.Tensor, positions: list[tuple[float, str]]) -> torch.Tensor:
    """Put named special values at fractional positions of the flattened tensor (positions in [0, 1))."""
    flat = x.flatten().clone()
    for fraction, name in positions:
        flat[int(fraction * flat.numel())] = SPECIALS[name]
    return flat.view_as(x)


def all_bf16_patterns(shuffle_seed: int | None = None) -> torch.Tensor:
    """Every one of the 65,536 bf16 bit patterns as a [2048, 32] tensor; optionally shuffled across blocks."""
    patterns = torch.arange(2**16, dtype=torch.int32).to(torch.int16)
    if shuffle_seed is not None:
        patterns = patterns[torch.randperm(2**16, generator=torch.Generator().manual_seed(shuffle_seed))]
    return patterns.view(torch.bfloat16).view(2048, 32)


_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)


def near_midpoints(exponents: tuple[int, ...] = (-120, -3, 0, 7, 100), block: int = 32) -> torch.Tensor:
    """fp32 blocks of `block` probing 1-4 ulp around every E2M1 midpoint, at several scale exponents.

    Block layout: element 0 is the amax 6 * 2**k (every MX mode but ceil then uses e = k), elements 1.. are
    (midpoint +- j ulp) * 2**k, so the scaled values sit exactly around the midpoints.
    """
    rows = []
    for k in exponents:
        probes = []
        for mid in _MIDPOINTS:
            m = torch.tensor(mid, dtype=torch.float32)
            for direction in (math.inf, -math.inf):
                v = m
                for _ in range(4):
                    v = torch.nextafter(v, torch.tensor(direction, dtype=torch.float32))
                    probes.append(float(v))
            probes.append(mid)
        for start in range(0, len(probes), block - 1):
            chunk = probes[start : start + block - 1]
            row = [6.0] + chunk + [0.0] * (block - 1 - len(chunk))
            rows.append(torch.tensor(row, dtype=torch.float64) * 2.0**k)
    return torch.stack(rows).to(torch.float32)


def amax_mantissa_blocks(dtype: torch.dtype, k: int) -> tuple[torch.Tensor, list[float]]:
    """One block per amax mantissa m at and around 1, 1.5, 1.75, 2 (in dtype's ulp): amax = m * 2**k."""
    ulp = 2.0**-23 if dtype == torch.float32 else 2.0**-7
    mantissas = [1.0, 1.0 + ulp, 1.5 - ulp, 1.5, 1.5 + ulp, 1.75 - ulp, 1.75, 1.75 + ulp, 2.0 - ulp]
    blocks = torch.zeros(len(mantissas), 32, dtype=torch.float64)
    blocks[:, 0] = torch.tensor(mantissas, dtype=torch.float64) * 2.0**k
    blocks[:, 1] = -0.3 * 2.0**k
    return blocks.to(dtype), mantissas


def expected_amax_scale(m: float, k: int, mode: str) -> int:
    """The scale byte for amax = m * 2**k (1 <= m < 2), written from the mode table, not from the code."""
    bump = {"floor": False, "rceil": m > 1.5, "even": m >= 1.75, "ceil": m > 1.0}[mode]
    return 127 + k - 2 + int(bump)
