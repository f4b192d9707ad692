"""MXFP4 parity: the Triton kernels against `reference.quant.mxfp4`, bit for bit, in every scale mode.

Hypothesis draws the structure (shape, dtype, seed, scale mode, magnitude spread, special-value positions);
bulk data comes from a seeded generator. Exhaustive and targeted inputs cover what random data never hits:
all 65,536 bf16 patterns, fp32 values 1-4 ulp around each E2M1 midpoint, amax mantissas around the
scale-mode thresholds, NaN/Inf inside one block, and the named cases with expected bytes.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kernels.tolerances import assert_exact
from reference.quant import mxfp4 as ref
from reference.quant.mx_scale import SCALE_MODES
from suites.quant import fp4_checks
from suites.quant import mxfp4_cases as cases

kernel = pytest.importorskip("kernels.mxfp4")
INPUT_DTYPES = ref.INPUT_DTYPES
OUTPUT_DTYPES = ref.OUTPUT_DTYPES


def check_quantize(x: torch.Tensor, mode: str, device: str, quantize=kernel.quantize_mxfp4) -> None:
    """The kernel's codes and scales equal the reference's, byte for byte."""
    codes, scales = quantize(x.to(device), scale_mode=mode)
    want_codes, want_scales = ref.quantize_mxfp4(x, scale_mode=mode)
    assert_exact(scales, want_scales, f"scales ({mode})")
    assert_exact(codes, want_codes, f"codes ({mode})")


@st.composite
def quant_problems(draw):
    lead = tuple(draw(st.lists(st.integers(1, 4), max_size=2)))
    k = 32 * draw(st.integers(1, 6))
    positions = st.tuples(st.floats(0, 1, exclude_max=True), st.sampled_from(sorted(cases.SPECIALS)))
    return dict(
        shape=(*lead, k),
        dtype=draw(st.sampled_from(INPUT_DTYPES)),
        seed=draw(st.integers(0, 2**31 - 1)),
        spread=draw(st.sampled_from([0.0, 4.0, 12.0, 40.0])),
        specials=draw(st.lists(positions, max_size=4)),
        mode=draw(st.sampled_from(SCALE_MODES)),
    )


def make_input(p: dict) -> torch.Tensor:
    x = cases.random_blocks(p["shape"], torch.float32, p["seed"], p["spread"])
    return cases.inject(x, p["specials"]).to(p["dtype"])


@given(p=quant_problems())
def test_quantize_matches_reference(p, device):
    check_quantize(make_input(p), p["mode"], device)


@given(p=quant_problems(), out_dtype=st.sampled_from(OUTPUT_DTYPES))
def test_dequantize_of_quantized_matches_reference(p, out_dtype, device):
    codes, scales = ref.quantize_mxfp4(make_input(p), scale_mode=p["mode"])
    got = kernel.dequantize_mxfp4(codes.to(device), scales.to(device), dtype=out_dtype)
    assert_exact(got, ref.dequantize_mxfp4(codes, scales, dtype=out_dtype))


@given(
    rows=st.integers(1, 8),
    blocks=st.integers(1, 4),
    seed=st.integers(0, 2**31 - 1),
    out_dtype=st.sampled_from(OUTPUT_DTYPES),
)
def test_dequantize_any_bytes_matches_reference(rows, blocks, seed, out_dtype, device):
    """Every code and every scale byte, 0x00 and 0xFF included."""
    gen = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 256, (rows, 16 * blocks), generator=gen, dtype=torch.uint8)
    scales = torch.randint(0, 256, (rows, blocks), generator=gen, dtype=torch.uint8)
    got = kernel.dequantize_mxfp4(codes.to(device), scales.to(device), dtype=out_dtype)
    assert_exact(got, ref.dequantize_mxfp4(codes, scales, dtype=out_dtype))


@pytest.mark.parametrize("arrangement", [None, 0, 1], ids=["sequential", "shuffled0", "shuffled1"])
@pytest.mark.parametrize("mode", SCALE_MODES)
def test_every_bf16_pattern(mode, arrangement, device):
    check_quantize(cases.all_bf16_patterns(arrangement), mode, device)


@pytest.mark.parametrize("mode", SCALE_MODES)
def test_fp32_near_e2m1_midpoints(mode, device):
    check_quantize(cases.near_midpoints(), mode, device)


def check_amax_mantissas(device: str, quantize=kernel.quantize_mxfp4) -> None:
    """Scale bytes at amax mantissas around 1, 1.5, 1.75, 2 match the mode table, for fp32 and bf16."""
    for dtype in (torch.float32, torch.bfloat16):
        for k in (-100, 0, 100):
            blocks, mantissas = cases.amax_mantissa_blocks(dtype, k)
            for mode in SCALE_MODES:
                _, scales = quantize(blocks.to(device), scale_mode=mode)
                want = torch.tensor([[cases.expected_amax_scale(m, k, mode)] for m in mantissas], dtype=torch.uint8)
                assert_exact(scales, want, f"scale bytes, {mode}, {dtype}, k={k}")


def test_amax_mantissa_thresholds(device):
    check_amax_mantissas(device)


def check_named_cases(device: str, quantize=kernel.quantize_mxfp4) -> None:
    fp4_checks.check_named_quantize_cases(
        cases.QUANT_CASES, lambda case, dtype: quantize(case.block(dtype).to(device), scale_mode=case.mode)
    )


def test_named_quantize_cases(device):
    check_named_cases(device)


def test_named_cases_hold_for_the_reference():
    check_named_cases("cpu", ref.quantize_mxfp4)


@pytest.mark.parametrize("case", cases.DEQUANT_CASES, ids=lambda c: c.name)
def test_named_dequantize_cases(case, device):
    codes, scales = fp4_checks.one_code_block(case, 32)
    for dtype, bits in case.expected.items():
        for impl, dev in ((ref.dequantize_mxfp4, "cpu"), (kernel.dequantize_mxfp4, device)):
            out = impl(codes.to(dev), scales.to(dev), dtype=dtype)
            fp4_checks.assert_first_element(out, bits, f"{case.name} [{dtype}] ({case.note})")


@pytest.mark.parametrize("special", ["nan", "inf", "-inf"])
def test_one_nonfinite_poisons_only_its_block(special, device):
    x = cases.random_blocks((3, 128), torch.float32, seed=7, spread=4.0).to(device)
    fp4_checks.check_nonfinite_poisons_only_its_block(
        x,
        70,
        cases.SPECIALS[special],
        kernel.quantize_mxfp4,  # column 70: block 2 of row 1
        lambda codes, scales: kernel.dequantize_mxfp4(codes, scales, dtype=torch.float32),
        block=32,
        nan_scale=0xFF,
    )


# Metamorphic properties (no oracle needed), on the kernel.
@given(p=quant_problems(), cut=st.integers(0, 5), width=st.integers(1, 6))
def test_tensor_parallel_shard_equals_shard_of_quantized(p, cut, width, device):
    x = make_input({**p, "shape": (3, 32 * 12)}).to(device)
    fp4_checks.check_shard_of_quantized(
        x, cut, width, lambda x: kernel.quantize_mxfp4(x, scale_mode=p["mode"]), block=32
    )


@given(seed=st.integers(0, 2**31 - 1), shift=st.integers(-60, 60), mode=st.sampled_from(SCALE_MODES))
def test_power_of_two_scaling_shifts_scale_bytes(seed, shift, mode, device):
    x = cases.random_blocks((4, 128), torch.float32, seed, spread=8.0).to(device)  # bytes stay well inside [1, 253]
    codes, scales = kernel.quantize_mxfp4(x, scale_mode=mode)
    shifted_codes, shifted_scales = kernel.quantize_mxfp4(x * 2.0**shift, scale_mode=mode)
    assert_exact(shifted_codes, codes, "codes after scaling by 2**k")
    assert_exact(shifted_scales.to(torch.int32), scales.to(torch.int32) + shift, "scale bytes after 2**k")


@given(p=quant_problems())
def test_sign_symmetry(p, device):
    fp4_checks.check_sign_symmetry(
        make_input(p).to(device), lambda x: kernel.quantize_mxfp4(x, scale_mode=p["mode"]), block=32, nan_scale=0xFF
    )


def test_opcheck_quantize(device):
    x = cases.random_blocks((4, 64), torch.bfloat16, seed=3, spread=4.0).to(device)
    torch.library.opcheck(torch.ops.touchstone.quantize_mxfp4.default, (x, "rceil"))


def test_opcheck_dequantize(device):
    codes, scales = ref.quantize_mxfp4(cases.random_blocks((4, 64), torch.float32, seed=4, spread=4.0))
    torch.library.opcheck(
        torch.ops.touchstone.dequantize_mxfp4.default, (codes.to(device), scales.to(device), torch.float16)
    )


def test_empty_input(device):
    codes, scales = kernel.quantize_mxfp4(torch.empty(0, 64, device=device))
    assert codes.shape == (0, 32) and scales.shape == (0, 2)
    assert kernel.dequantize_mxfp4(codes, scales).shape == (0, 64)


@pytest.mark.parametrize("dtype", INPUT_DTYPES)
def test_multi_tile_launch_with_a_ragged_last_program(dtype, device, monkeypatch):
    """Several tiles per program (the GPU launch shape), with the last program's tiles partly past the end."""
    monkeypatch.setattr(kernel, "_INTERPRETER", (16, 3, 1))
    monkeypatch.setitem(kernel._QUANTIZE_GPU, dtype, (16, 3, 1))
    x = cases.random_blocks((37, 160), torch.float32, seed=9, spread=12.0).to(dtype)  # 185 blocks: 4 programs
    check_quantize(x, "even", device)


@given(
    seed=st.integers(0, 2**31 - 1),
    cut=st.integers(0, 5),
    width=st.integers(1, 6),
    out_dtype=st.sampled_from(OUTPUT_DTYPES),
)
def test_dequantize_of_a_shard_equals_shard_of_dequantized(seed, cut, width, out_dtype, device):
    """Column slices of codes/scales (strided rows, no copy) go through the kernel's non-contiguous path."""
    fp4_checks.check_shard_of_dequantized(
        seed, cut, width, lambda codes, scales: kernel.dequantize_mxfp4(codes, scales, dtype=out_dtype), 32, device
    )
