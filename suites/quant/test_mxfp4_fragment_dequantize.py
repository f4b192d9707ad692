"""The MXFP4 dequantizer on fragment-layout weights (`kernels.mxfp4_fragment_dequantize`): bf16 bit for bit the
reference's dequantization of the interchange codes and scales the layout was prepared from (NaN payloads aside),
on every tier (the interpreter runs its Triton decode, a GPU of sm_90+ the layout's PTX). Named cases pin single
codes; a planted bug (rows g and g + 8 of a tile exchanged) must be caught.

Contract, as the W4A16 GEMM's: scale bytes 253 and 254, whose weights can reach 2**128, are outside it (the
interchange dequantizer saturates them, this one gives Inf), so the named case that saturates is not run here.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kernels import mxfp4_fragment_dequantize as kernel
from kernels import mxfp4_fragment_layout as layout
from kernels.tolerances import assert_exact
from reference.quant.mxfp4 import dequantize_mxfp4
from suites.quant import fp4_checks
from suites.quant import mxfp4_cases as cases

OUTSIDE_CONTRACT = {"product_overflows_saturates"}  # scale byte 254


def _check(codes, scales, device, **launch):
    words, pairs = layout.prepare(codes, scales)
    got = kernel.launch(words.to(device), pairs.to(device), **launch).cpu()
    assert_exact(got, dequantize_mxfp4(codes, scales, dtype=torch.bfloat16), "fragment dequantize")


@given(
    tiles=st.integers(1, 3),
    steps=st.integers(1, 11),
    seed=st.integers(0, 2**31 - 1),
    nan_block=st.booleans(),
)
def test_matches_the_reference_bit_for_bit(tiles, steps, seed, nan_block, device):
    """Random codes (-0 included) under scale bytes 0 .. 252 and 0xFF: 1 to 11 steps (a program's steps past the
    end on a GPU), 1 to 3 row tiles."""
    gen = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 256, (16 * tiles, 32 * steps), dtype=torch.uint8, generator=gen)
    scales = torch.randint(0, 253, (16 * tiles, 2 * steps), dtype=torch.uint8, generator=gen)
    if nan_block:
        scales[-1, -1] = 0xFF
    _check(codes, scales, device)


@pytest.mark.parametrize(
    "case", [c for c in cases.DEQUANT_CASES if c.name not in OUTSIDE_CONTRACT], ids=lambda c: c.name
)
def test_named_dequantize_cases(case, device):
    """One code in element 0 of row 9, block 1 (the lane's high row, second block of a step) of a 16 x 64 tile."""
    codes = torch.zeros(16, 32, dtype=torch.uint8)
    scales = torch.full((16, 2), 127, dtype=torch.uint8)
    codes[9, 16], scales[9, 1] = case.code, case.scale
    words, pairs = layout.prepare(codes, scales)
    out = kernel.dequantize_mxfp4_fragment(words.to(device), pairs.to(device)).cpu()
    fp4_checks.assert_first_element(out[9:10, 32:], case.expected[torch.bfloat16], f"{case.name} ({case.note})")
    rest = out.clone()
    rest[9, 32:] = 0
    assert not rest.any(), f"{case.name}: other elements are not zero"


def test_planted_bug_is_caught(device):
    gen = torch.Generator().manual_seed(5)
    codes = torch.randint(0, 256, (32, 64), dtype=torch.uint8, generator=gen)
    scales = torch.randint(120, 135, (32, 4), dtype=torch.uint8, generator=gen)
    _check(codes, scales, device)  # the control passes without the bug
    with pytest.raises(AssertionError):
        _check(codes, scales, device, fault="rows_swapped")


def test_opcheck(device):
    codes = torch.randint(0, 256, (16, 64), dtype=torch.uint8, generator=torch.Generator().manual_seed(6))
    words, pairs = layout.prepare(codes, torch.full((16, 4), 127, dtype=torch.uint8))
    torch.library.opcheck(torch.ops.touchstone.dequantize_mxfp4_fragment.default, (words.to(device), pairs.to(device)))


@pytest.mark.parametrize(
    ("words", "pairs", "message"),
    [
        (torch.zeros(1, 1, 32, 4, dtype=torch.int64), torch.zeros(1, 1, 8, 2, dtype=torch.int32), "words: must be"),
        (torch.zeros(1, 2, 32, 4, dtype=torch.int32), torch.zeros(1, 1, 8, 2, dtype=torch.int32), "pairs: must be"),
        (torch.zeros(1, 2, 4, 32, dtype=torch.int32).transpose(2, 3), torch.zeros(1, 2, 8, 2, dtype=torch.int32),
         "words: must be contiguous"),
    ],
    ids=["words_dtype", "pairs_shape", "words_strided"],
)  # fmt: skip
def test_bad_arguments_name_themselves(words, pairs, message):
    with pytest.raises((TypeError, ValueError), match=message):
        kernel.dequantize_mxfp4_fragment(words, pairs)
