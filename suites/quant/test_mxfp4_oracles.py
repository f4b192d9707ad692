"""The MXFP4 reference against independent oracles: ml_dtypes codecs and torchao's MX quantizer.

The reference is what the kernels are held to, so it is itself held to implementations written by others.
Disagreements that are policy, not bugs, are excluded by name below (torchao: Inf blocks, NaN-block codes,
fp32-subnormal block maxima).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kernels.tolerances import assert_exact
from reference.quant import mxfp4 as ref
from reference.quant.mx_scale import SCALE_MODES
from suites import oracles
from suites.quant import mxfp4_cases as cases

INPUTS = {
    "bf16_all_patterns": lambda: cases.all_bf16_patterns(None),
    "bf16_all_patterns_shuffled": lambda: cases.all_bf16_patterns(3),
    "fp32_near_midpoints": cases.near_midpoints,
    "fp32_wide_spread": lambda: cases.random_blocks((256, 256), torch.float32, seed=11, spread=60.0),
    "fp16_random": lambda: cases.random_blocks((64, 256), torch.float16, seed=12, spread=6.0),
}


@pytest.mark.parametrize("mode", SCALE_MODES)
@pytest.mark.parametrize("inputs", sorted(INPUTS))
def test_reference_matches_ml_dtypes_oracle(inputs, mode):
    x = INPUTS[inputs]()
    codes, scales = ref.quantize_mxfp4(x, scale_mode=mode)
    want_codes, want_scales = oracles.quantize_mxfp4(x, mode)
    assert_exact(scales, want_scales, "scales vs oracle")
    assert_exact(codes, want_codes, "codes vs oracle")


@given(seed=st.integers(0, 2**31 - 1), out_dtype=st.sampled_from(ref.OUTPUT_DTYPES))
def test_dequantize_matches_ml_dtypes_oracle(seed, out_dtype):
    gen = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 256, (8, 64), generator=gen, dtype=torch.uint8)
    scales = torch.randint(0, 256, (8, 4), generator=gen, dtype=torch.uint8)
    assert_exact(
        ref.dequantize_mxfp4(codes, scales, dtype=out_dtype), oracles.dequantize_mxfp4(codes, scales, out_dtype)
    )


def test_round_trip_is_idempotent():
    x = cases.random_blocks((32, 256), torch.float32, seed=5, spread=20.0)
    for mode in SCALE_MODES:
        once = ref.dequantize_mxfp4(*ref.quantize_mxfp4(x, scale_mode=mode), dtype=torch.float32)
        twice = ref.dequantize_mxfp4(*ref.quantize_mxfp4(once, scale_mode=mode), dtype=torch.float32)
        assert_exact(twice, once, f"dequant(quant(dequant(quant(x)))) ({mode})")


torchao_mx = pytest.importorskip("torchao.prototype.mx_formats.mx_tensor")
torchao_config = pytest.importorskip("torchao.prototype.mx_formats.config")


@pytest.mark.parametrize("mode", SCALE_MODES)
@pytest.mark.parametrize("inputs", sorted(name for name in INPUTS if "fp16" not in name))  # to_mx: fp32/bf16
def test_reference_matches_torchao(inputs, mode):
    x = INPUTS[inputs]()
    scale_mode = getattr(torchao_config.ScaleCalculationMode, mode.upper())
    their_scales, their_codes = torchao_mx.to_mx(x, torch.float4_e2m1fn_x2, 32, scale_mode)
    codes, scales = ref.quantize_mxfp4(x, scale_mode=mode)
    blocks = x.float().reshape(-1, 32)
    # Policy differences, not bugs: torchao gives Inf blocks a finite scale and NaN blocks arbitrary codes,
    # and where the scale byte is 0x00 (2**-127, an fp32 subnormal) it divides the elements by 2**-126.
    same_policy = torch.isfinite(blocks).all(dim=1) & (scales.reshape(-1) != 0)
    their_scales, their_codes = their_scales.view(torch.uint8).reshape(-1), their_codes.view(torch.uint8)
    assert_exact(their_scales[same_policy], scales.reshape(-1)[same_policy], "scales")
    assert_exact(their_codes.reshape(-1, 16)[same_policy], codes.reshape(-1, 16)[same_policy], "codes")
    assert (their_scales[blocks.isnan().any(dim=1)] == 0xFF).all(), "torchao: NaN block scale"
