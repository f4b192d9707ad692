"""NVFP4 global-scale conventions: EncodeScale (448*6/amax) and DecodeScale (amax/(448*6)) cannot be mixed up.

The round trip between them is one IEEE reciprocal each way: the start value or an fp32 neighbour, exact
for powers of two; quantizing with either convention of the same scale gives the same bytes whenever the
conversion is exact.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kernels.tolerances import assert_exact, sqnr_db
from reference.quant import nvfp4 as ref
from reference.quant.nvfp4_global_scale import (
    AMAX_FLOOR,
    GLOBAL_RANGE,
    DecodeScale,
    EncodeScale,
    decode_value,
    encode_value,
    tensor_amax,
)
from suites.quant import nvfp4_cases as cases

fp32_scales = st.floats(2.0**-100, 2.0**100, allow_nan=False, allow_infinity=False, width=32)


def ulps_apart(a: torch.Tensor, b: torch.Tensor) -> int:
    return abs(int(a.view(torch.int32)) - int(b.view(torch.int32)))


@given(value=fp32_scales)
def test_round_trip_encode_decode_encode(value):
    start = EncodeScale(value)
    back = start.to_decode().to_encode()
    assert isinstance(back, EncodeScale) and ulps_apart(back.value, start.value) <= 1
    assert_exact(start.to_decode().value, (1.0 / torch.tensor(value, dtype=torch.float32)), "1 / s_enc in fp32")


@given(value=fp32_scales)
def test_round_trip_decode_encode_decode(value):
    start = DecodeScale(value)
    back = start.to_encode().to_decode()
    assert isinstance(back, DecodeScale) and ulps_apart(back.value, start.value) <= 1


@given(exponent=st.integers(-100, 100))
def test_round_trip_is_exact_for_powers_of_two(exponent):
    assert_exact(EncodeScale(2.0**exponent).to_decode().to_encode().value, torch.tensor(2.0**exponent))
    assert_exact(DecodeScale(2.0**exponent).to_encode().value, torch.tensor(2.0**-exponent))


def test_round_trip_is_not_always_exact():
    """Why the round trip is stated as 'within one ulp': fp32 reciprocals do not always invert."""
    values = torch.rand(4096, generator=torch.Generator().manual_seed(0)) * 1000 + 1
    back = 1.0 / (1.0 / values)
    assert (back != values).any() and ((back.view(torch.int32) - values.view(torch.int32)).abs() <= 1).all()


@pytest.mark.parametrize("amax", [6.0, 1.0, 3.0e4, 0.0, math.inf])
def test_from_amax_matches_the_published_formulas(amax):
    clamped = min(max(amax, AMAX_FLOOR), torch.finfo(torch.float32).max)
    assert_exact(EncodeScale.from_amax(amax).value, torch.tensor(GLOBAL_RANGE) / torch.tensor(clamped))
    assert_exact(DecodeScale.from_amax(amax).value, torch.tensor(clamped) / torch.tensor(GLOBAL_RANGE))
    assert math.isfinite(float(EncodeScale.from_amax(amax).value)) and float(DecodeScale.from_amax(amax).value) > 0


def test_from_amax_propagates_nan():
    assert EncodeScale.from_amax(float("nan")).value.isnan()


def test_bare_values_are_refused_by_name():
    x = torch.zeros(2, 32)
    for bare in (1.0, torch.tensor(1.0), 448):
        with pytest.raises(TypeError, match=r"global_scale: must be an EncodeScale .* or a DecodeScale"):
            ref.quantize_nvfp4(x, bare)
        with pytest.raises(TypeError, match="global_scale"):
            encode_value(bare)
        with pytest.raises(TypeError, match="global_scale"):
            decode_value(bare)


def test_values_must_be_one_float32_element():
    with pytest.raises(TypeError, match="EncodeScale: value must be a one-element float32 tensor"):
        EncodeScale(torch.tensor([1.0, 2.0]))
    with pytest.raises(TypeError, match="DecodeScale: value must be a one-element float32 tensor"):
        DecodeScale(torch.tensor(1.0, dtype=torch.float64))
    with pytest.raises(TypeError, match="DecodeScale: value must be a float"):
        DecodeScale("0.5")


def test_each_convention_converts_to_the_other_explicitly():
    enc = EncodeScale(448.0)
    assert enc.to_encode() is enc and isinstance(enc.to_decode(), DecodeScale)
    dec = DecodeScale(0.25)
    assert dec.to_decode() is dec and float(dec.to_encode().value) == 4.0
    assert float(encode_value(dec)) == 4.0 and float(decode_value(enc)) == float(torch.tensor(1.0) / 448.0)


@given(seed=st.integers(0, 2**31 - 1), exponent=st.integers(-20, 20))
def test_either_convention_of_one_scale_quantizes_alike(seed, exponent):
    """Power-of-two global scales convert exactly, so both conventions give the very same bytes."""
    x = cases.random_nvfp4_blocks((4, 64), torch.float32, seed, spread=3.0) * 2.0**exponent
    a = ref.quantize_nvfp4(x, EncodeScale(2.0**-exponent))
    b = ref.quantize_nvfp4(x, DecodeScale(2.0**exponent))
    assert_exact(a[0], b[0], "codes") and assert_exact(a[1], b[1], "scales")


def test_quantize_in_one_convention_dequantize_in_the_other():
    """The ModelOpt checkpoint path: quantized with the decode scale, dequantized by a vLLM-style consumer that
    holds the encode scale: the round trip through the conversions keeps the values (SQNR of NVFP4 itself)."""
    x = cases.random_nvfp4_blocks((64, 256), torch.float32, seed=1, spread=0.0)
    dec = DecodeScale.from_amax(tensor_amax(x))
    codes, scales = ref.quantize_nvfp4(x, dec)
    via_encode = ref.dequantize_nvfp4(codes, scales, dec.to_encode(), dtype=torch.float32)
    direct = ref.dequantize_nvfp4(codes, scales, dec, dtype=torch.float32)
    assert sqnr_db(via_encode, x) > 17.0 and sqnr_db(via_encode, direct) > 120.0


def test_mixing_up_the_conventions_by_hand_is_what_the_types_prevent():
    """Reading an encode value as a decode value scales the tensor by (amax / 2688)**2: garbage."""
    x = cases.random_nvfp4_blocks((64, 256), torch.float32, seed=2, spread=0.0)
    enc = EncodeScale.from_amax(tensor_amax(x))
    codes, scales = ref.quantize_nvfp4(x, enc)
    right = ref.dequantize_nvfp4(codes, scales, enc, dtype=torch.float32)
    mixed_up = ref.dequantize_nvfp4(codes, scales, DecodeScale(enc.value), dtype=torch.float32)
    assert sqnr_db(right, x) > 17.0 and sqnr_db(mixed_up, x) < 0.0
