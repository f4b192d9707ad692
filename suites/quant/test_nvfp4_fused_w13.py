"""Fused gate/up (w1/w3) NVFP4 global scales: the three named policies of `reference.quant.nvfp4_fused_w13`."""

from __future__ import annotations

import warnings

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kernels.tolerances import assert_exact, sqnr_db
from reference.formats.e4m3 import decode_e4m3
from reference.quant import nvfp4 as ref
from reference.quant.nvfp4_fused_w13 import (
    DEFAULT_W13_POLICY,
    W13_POLICIES,
    NVFP4Tensor,
    W13ScaleMismatchWarning,
    fuse_w13,
)
from reference.quant.nvfp4_global_scale import DecodeScale, EncodeScale, tensor_amax


def quantized(x: torch.Tensor, convention=DecodeScale) -> NVFP4Tensor:
    scale = convention.from_amax(tensor_amax(x))
    return NVFP4Tensor(*ref.quantize_nvfp4(x, scale), scale)


def halves(ratio: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(32, 128, generator=gen), torch.randn(32, 128, generator=gen) * ratio


def dequantized(t: NVFP4Tensor) -> torch.Tensor:
    return ref.dequantize_nvfp4(t.codes, t.scales, t.global_scale, dtype=torch.float32)


def test_default_is_the_established_convention():
    assert DEFAULT_W13_POLICY == "use_w1"


@pytest.mark.parametrize("convention", [EncodeScale, DecodeScale])
def test_equal_scales_fuse_alike_under_every_policy(convention):
    w1, w3 = halves(1.0, 0)
    w3 = w3 * (tensor_amax(w1) / tensor_amax(w3))  # same amax, so bit-equal global scales
    q1, q3 = quantized(w1, convention), quantized(w3, convention)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning either
        fused = [fuse_w13(q1, q3, policy) for policy in W13_POLICIES]
    for other in fused[1:]:
        assert_exact(other.codes, fused[0].codes) and assert_exact(other.scales, fused[0].scales)
        assert_exact(other.global_scale.value, fused[0].global_scale.value)
    assert_exact(fused[0].codes, torch.cat((q1.codes, q3.codes)), "codes are the stacked halves")


def test_raise_refuses_mismatched_scales():
    q1, q3 = (quantized(w) for w in halves(2.0, 1))
    with pytest.raises(ValueError, match=r"w1.global_scale .* and w3.global_scale .* differ"):
        fuse_w13(q1, q3, "raise")


def test_use_w1_warns_and_keeps_w1s_scale():
    q1, q3 = (quantized(w) for w in halves(2.0, 2))
    with pytest.warns(W13ScaleMismatchWarning, match="using w1's for both halves"):
        fused = fuse_w13(q1, q3)
    assert_exact(fused.global_scale.value, q1.global_scale.value)
    assert_exact(fused.scales, torch.cat((q1.scales, q3.scales)))


def test_max_requant_keeps_the_larger_scale_and_the_codes():
    q1, q3 = (quantized(w) for w in halves(10.0, 3))
    fused = fuse_w13(q1, q3, "max_requant")
    assert_exact(fused.global_scale.value, q3.global_scale.value, "the larger decode scale (w3's amax)")
    assert_exact(fused.codes, torch.cat((q1.codes, q3.codes)), "FP4 payload untouched")
    assert_exact(fused.scales[32:], q3.scales, "the larger half's block scales untouched")
    ratio = q1.global_scale.value / q3.global_scale.value
    assert (decode_e4m3(fused.scales[:32]) <= decode_e4m3(q1.scales)).all()
    want = (decode_e4m3(q1.scales) * ratio).clamp(max=448).to(torch.float8_e4m3fn).view(torch.uint8)
    assert_exact(fused.scales[:32], want, "w1's block scales re-encoded by gs_w1 / gs_max (RNE)")


def test_max_requant_keeps_nan_blocks_nan():
    w1, w3 = halves(2.0, 4)
    w1[0, 3] = float("nan")
    q1 = NVFP4Tensor(*ref.quantize_nvfp4(w1, DecodeScale(1.0)), DecodeScale(1.0))
    fused = fuse_w13(q1, quantized(w3), "max_requant")
    assert fused.scales[0, 0] == 0x7F


@given(ratio=st.sampled_from([2.0, 3.5, 10.0, 0.1, 0.5]), seed=st.integers(0, 2**31 - 1))
def test_max_requant_is_at_least_as_accurate_as_use_w1(ratio, seed):
    w1, w3 = halves(ratio, seed)
    q1, q3 = quantized(w1), quantized(w3)
    ideal = torch.cat((w1, w3))
    with pytest.warns(W13ScaleMismatchWarning):
        use_w1 = sqnr_db(dequantized(fuse_w13(q1, q3, "use_w1")), ideal)
    max_requant = sqnr_db(dequantized(fuse_w13(q1, q3, "max_requant")), ideal)
    separate = sqnr_db(torch.cat((dequantized(q1), dequantized(q3))), ideal)
    assert max_requant >= use_w1 and max_requant <= separate + 0.5
    assert separate - max_requant < 3.0, "re-encoding the block scales costs little"


def test_bad_arguments_are_refused_by_name():
    q1, q3 = (quantized(w) for w in halves(1.0, 5))
    with pytest.raises(ValueError, match="policy must be one of"):
        fuse_w13(q1, q3, "average")
    with pytest.raises(TypeError, match="w3: must be an NVFP4Tensor"):
        fuse_w13(q1, (q3.codes, q3.scales), "use_w1")
    short = NVFP4Tensor(q3.codes[:, :32], q3.scales[:, :4], q3.global_scale)
    with pytest.raises(ValueError, match="halves must share K"):
        fuse_w13(q1, short)
    bare = NVFP4Tensor(q3.codes, q3.scales, 0.5)
    with pytest.raises(TypeError, match=r"w3\.global_scale: must be an EncodeScale"):
        fuse_w13(q1, bare)
