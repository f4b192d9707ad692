"""The W4A16 MXFP4 GEMM's prepared weight layout (`kernels.w4a16_mxfp4_layout`) and the ops that read it.

The layout is a transform of the interchange codes, tested as such: invertible on every input, a named word
with its expected bytes, and the prepared ops (`w4a16_mxfp4_gemm_prepared`, `dequantize_mxfp4_prepared`) giving
the interchange ops' bytes on the same weights, on both GEMM paths (the GEMV at M = 1, the tensor-core path
above). Negative controls: interchange codes handed to a prepared op, and the GEMM's planted bugs read through
the prepared layout, are caught.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kernels._boundary import runs_interpreted
from kernels.tolerances import assert_exact, assert_lossy, families
from reference.gemm import w4a16_mxfp4 as ref
from reference.quant.mxfp4 import dequantize_mxfp4, quantize_mxfp4
from suites import oracles
from suites.quant.mxfp4_cases import random_blocks

layout = pytest.importorskip("kernels.w4a16_mxfp4_layout")
gemm = pytest.importorskip("kernels.w4a16_mxfp4_gemm")
mxfp4 = pytest.importorskip("kernels.mxfp4")


@given(
    rows=st.integers(0, 5),
    words=st.integers(0, 9),
    batch=st.sampled_from([(), (2,)]),
    seed=st.integers(0, 2**31 - 1),
)
def test_prepare_is_undone_by_interchange(rows, words, batch, seed):
    gen = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 256, (*batch, rows, 4 * words), dtype=torch.uint8, generator=gen)
    prepared = layout.prepare_codes(codes)
    assert prepared.shape == codes.shape and prepared.dtype == torch.uint8
    assert_exact(layout.interchange_codes(prepared), codes, "interchange(prepare(codes))")
    assert_exact(layout.prepare_codes(layout.interchange_codes(codes)), codes, "prepare(interchange(codes))")


def test_a_named_word():
    """Elements 0..7 of a word hold codes 0..7 (interchange bytes 0x10 0x32 0x54 0x76). Prepared, the low 16 bits
    hold the even elements and the high 16 bits the odd ones: bytes (0, 2), (4, 6), (1, 3), (5, 7)."""
    codes = torch.tensor([[0x10, 0x32, 0x54, 0x76]], dtype=torch.uint8)
    assert layout.prepare_codes(codes).tolist() == [[0x20, 0x64, 0x31, 0x75]]
    assert layout.PERMUTATION == (0, 2, 4, 6, 1, 3, 5, 7)


@pytest.mark.parametrize(
    ("codes", "error", "message"),
    [
        (torch.zeros(2, 8, dtype=torch.int8), TypeError, "codes: must be a uint8 tensor"),
        (torch.zeros(2, 6, dtype=torch.uint8), ValueError, "codes: the last dim holds 6 code bytes"),
    ],
)
def test_bad_codes_are_named(codes, error, message):
    with pytest.raises(error, match=message):
        layout.prepare_codes(codes)


def _problem(m: int, n: int, k: int, seed: int, nan_block: bool = False):
    w = random_blocks((n, k), torch.float32, seed, 8.0).to(torch.bfloat16)
    codes, scales = quantize_mxfp4(w, scale_mode="floor")
    if nan_block:
        scales[n // 2, 0] = 255
    x = random_blocks((m, k), torch.bfloat16, seed + 1, 3.0)
    return w, x, codes, scales


@given(
    m=st.sampled_from([1, 1, 2, 5, 17]),
    n=st.integers(16, 40),
    k=st.sampled_from([32, 96, 128, 224]),
    seed=st.integers(0, 2**20),
    nan_block=st.booleans(),
)
def test_the_prepared_gemm_gives_the_interchange_gemms_bytes(m, n, k, seed, nan_block, device):
    """Both paths (M = 1: the GEMV; M > 1: the tensor-core one), K tails included (K = 96, 224 leave a part
    tile), a NaN scale poisoning its row.

    The tensor-core path hands tl.dot K in another order in each layout: the interchange path permutes x within
    each group of 8 K values (a word's nibbles) to its decoded order. On a GPU that stays inside the 16 K values
    one MMA step sums in one operation, so the bytes are asserted equal. The interpreter's tl.dot is numpy's fp32
    matmul, whose rounding follows the order: there the two may differ by what reordering an fp32 sum can move
    it, 2 * gamma_K * sum |x * w| (each path within gamma_K of the exact sum), plus one bf16 spacing of the output
    (hypothesis found 1-4 spacings where the sum cancels: 3 of 720 problems at seeds 0-59)."""
    _, x, codes, scales = _problem(m, n, k, seed, nan_block)
    x, codes, scales = x.to(device), codes.to(device), scales.to(device)
    want = gemm.w4a16_mxfp4_gemm(x, codes, scales)
    got = gemm.w4a16_mxfp4_gemm_prepared(x, layout.prepare_codes(codes), scales)
    if m == 1 or not runs_interpreted(x.device):  # the GEMV sums in one order in both layouts
        assert_exact(got.cpu(), want.cpu(), "prepared vs interchange")
        return
    got, want = got.cpu().double(), want.cpu().double()
    assert torch.equal(got.isnan(), want.isnan()), "prepared vs interchange: NaN positions differ"
    w = dequantize_mxfp4(codes.cpu(), scales.cpu(), dtype=torch.float32).double()
    gamma = k * 2.0**-24 / (1 - k * 2.0**-24)
    spacing = torch.finfo(torch.bfloat16).eps * 2.0 ** torch.floor(torch.log2(torch.maximum(got.abs(), want.abs())))
    bound = 2 * gamma * (x.cpu().double().abs() @ w.abs().T) + spacing
    finite = ~want.isnan()
    assert ((got - want).abs()[finite] <= bound[finite]).all(), "prepared vs interchange: beyond fp32 reordering"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_the_prepared_dequantize_gives_the_interchange_bytes(dtype, device):
    _, _, codes, scales = _problem(1, 24, 160, 3, nan_block=True)
    codes, scales = codes.to(device), scales.to(device)
    want = mxfp4.dequantize_mxfp4(codes, scales, dtype=dtype)
    got = mxfp4.dequantize_mxfp4_prepared(layout.prepare_codes(codes), scales, dtype=dtype)
    assert_exact(got.cpu(), want.cpu(), "prepared vs interchange dequantize")


def test_opcheck(device):
    _, x, codes, scales = _problem(2, 16, 64, 11)
    args = (x.to(device), layout.prepare_codes(codes).to(device), scales.to(device))
    torch.library.opcheck(torch.ops.touchstone.w4a16_mxfp4_gemm_prepared.default, args)
    torch.library.opcheck(torch.ops.touchstone.dequantize_mxfp4_prepared.default, (*args[1:], torch.bfloat16))


@pytest.mark.parametrize("m", [1, 17], ids=["gemv", "dot"])
def test_negative_control_interchange_codes_in_a_prepared_op(m, device):
    w, x, codes, scales = _problem(m, 16, 128, 13)
    want = oracles.unquantized_product(x, w)
    mirror = ref.w4a16_mxfp4_gemm_mirror(x, codes, scales)
    wrong = gemm.w4a16_mxfp4_gemm_prepared(x.to(device), codes.to(device), scales.to(device))
    with pytest.raises(AssertionError, match="max_rel"):
        assert_lossy(families.W4A16_MXFP4_GEMM, wrong.cpu(), mirror, want)


@pytest.mark.parametrize("m", [1, 17], ids=["gemv", "dot"])
@pytest.mark.parametrize("fault", ["scale_of_next_block", "swap_nibbles"])
def test_negative_control_planted_bugs_through_the_prepared_layout(fault, m, device):
    w, x, codes, scales = _problem(m, 16, 128, 13)
    want = oracles.unquantized_product(x, w)
    mirror = ref.w4a16_mxfp4_gemm_mirror(x, codes, scales)
    args = (x.to(device), layout.prepare_codes(codes).to(device), scales.to(device))
    with pytest.raises(AssertionError, match="max_rel"):
        assert_lossy(families.W4A16_MXFP4_GEMM, gemm.launch(*args, fault=fault, prepared=True).cpu(), mirror, want)
    assert_lossy(families.W4A16_MXFP4_GEMM, gemm.launch(*args, prepared=True).cpu(), mirror, want)
