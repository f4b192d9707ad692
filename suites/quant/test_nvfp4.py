"""NVFP4 parity: the Triton kernels against `reference.quant.nvfp4`, bit for bit; the reference against the
ml_dtypes oracle; named cases with expected bytes; boundary errors that name the argument.

Hypothesis draws the structure (shape, dtype, seed, magnitude spread, global scale, special-value
positions); bulk data comes from a seeded generator. Targeted inputs cover what random data never hits:
all 65,536 bf16 patterns, fp32 values 1-4 ulp around each E2M1 midpoint, products that round onto a
midpoint (double rounding), NaN/Inf inside one block.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kernels.tolerances import assert_exact
from reference.formats.e4m3 import decode_e4m3
from reference.quant import nvfp4 as ref
from reference.quant.nvfp4_global_scale import DecodeScale, EncodeScale, tensor_amax
from suites import oracles
from suites.quant import fp4_checks, mxfp4_cases
from suites.quant import nvfp4_cases as cases

kernel = pytest.importorskip("kernels.nvfp4")
INPUT_DTYPES = ref.INPUT_DTYPES
OUTPUT_DTYPES = ref.OUTPUT_DTYPES


def check_quantize(
    x: torch.Tensor, scale: EncodeScale | DecodeScale, device: str, quantize=kernel.quantize_nvfp4
) -> None:
    """The kernel's codes and scales equal the reference's, byte for byte."""
    codes, scales = quantize(x.to(device), scale.to(device))
    want_codes, want_scales = ref.quantize_nvfp4(x, scale)
    assert_exact(scales, want_scales, "scales")
    assert_exact(codes, want_codes, "codes")


# Global scales: the tensor's own amax (vLLM), a stale one (blocks saturate), both conventions.
SCALE_SOURCES = ("encode_from_amax", "decode_from_amax", "stale_encode", "power_of_two")


def global_scale(x: torch.Tensor, source: str) -> EncodeScale | DecodeScale:
    amax = tensor_amax(x[torch.isfinite(x)]) if torch.isfinite(x).any() else torch.tensor(0.0)
    if source == "encode_from_amax":
        return EncodeScale.from_amax(amax)
    if source == "decode_from_amax":
        return DecodeScale.from_amax(amax)
    if source == "stale_encode":
        return EncodeScale.from_amax(amax * 0.125)
    return EncodeScale(1.0)


@st.composite
def quant_problems(draw):
    lead = tuple(draw(st.lists(st.integers(1, 4), max_size=2)))
    k = 16 * draw(st.integers(1, 8))
    positions = st.tuples(st.floats(0, 1, exclude_max=True), st.sampled_from(sorted(cases.SPECIALS)))
    return dict(
        shape=(*lead, k),
        dtype=draw(st.sampled_from(INPUT_DTYPES)),
        seed=draw(st.integers(0, 2**31 - 1)),
        spread=draw(st.sampled_from([0.0, 4.0, 12.0])),
        specials=draw(st.lists(positions, max_size=4)),
        source=draw(st.sampled_from(SCALE_SOURCES)),
    )


def make_input(p: dict) -> torch.Tensor:
    x = cases.random_nvfp4_blocks(p["shape"], torch.float32, p["seed"], p["spread"])
    return cases.inject(x, p["specials"]).to(p["dtype"])


@given(p=quant_problems())
def test_quantize_matches_reference(p, device):
    x = make_input(p)
    check_quantize(x, global_scale(x, p["source"]), device)


@given(p=quant_problems())
def test_reference_is_the_same_on_every_device(p, device):
    """The bench checks kernels against the reference run on the GPU: it must give the CPU's bytes."""
    x = make_input(p)
    scale = global_scale(x, p["source"])
    check_quantize(x, scale, device, quantize=ref.quantize_nvfp4)


@given(p=quant_problems(), out_dtype=st.sampled_from(OUTPUT_DTYPES))
def test_dequantize_of_quantized_matches_reference(p, out_dtype, device):
    x = make_input(p)
    scale = global_scale(x, p["source"])
    codes, scales = ref.quantize_nvfp4(x, scale)
    got = kernel.dequantize_nvfp4(codes.to(device), scales.to(device), scale.to(device), dtype=out_dtype)
    assert_exact(got, ref.dequantize_nvfp4(codes, scales, scale, dtype=out_dtype))


@given(
    rows=st.integers(1, 6),
    blocks=st.integers(1, 4),
    seed=st.integers(0, 2**31 - 1),
    out_dtype=st.sampled_from(OUTPUT_DTYPES),
    decode=st.sampled_from([1.0, 3.1e-3, 2.0**100, 7e-30]),
)
def test_dequantize_any_bytes_matches_reference(rows, blocks, seed, out_dtype, decode, device):
    """Every code and every scale byte: NaN (0x7F, 0xFF), negative and subnormal scales, overflow."""
    gen = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 256, (rows, 8 * blocks), generator=gen, dtype=torch.uint8)
    scales = torch.randint(0, 256, (rows, blocks), generator=gen, dtype=torch.uint8)
    scale = DecodeScale(decode)
    got = kernel.dequantize_nvfp4(codes.to(device), scales.to(device), scale.to(device), dtype=out_dtype)
    assert_exact(got, ref.dequantize_nvfp4(codes, scales, scale, dtype=out_dtype))


@pytest.mark.parametrize("scale", [1.0, 448.0 * 6 / 3.0e38, 3.7e20], ids=["one", "tiny", "huge"])
def test_every_bf16_pattern(scale, device):
    check_quantize(mxfp4_cases.all_bf16_patterns(0).view(-1, 64), EncodeScale(scale), device)


def test_fp32_near_e2m1_midpoints(device):
    check_quantize(cases.near_midpoints(), EncodeScale(1.0), device)


def test_double_rounding_probes(device):
    check_quantize(cases.double_rounding_blocks(), EncodeScale(1.0), device)


def check_named_cases(device: str, quantize=kernel.quantize_nvfp4) -> None:
    fp4_checks.check_named_quantize_cases(
        cases.QUANT_CASES,
        lambda case, dtype: quantize(case.block(dtype).to(device), EncodeScale(case.encode_scale).to(device)),
    )


def test_named_quantize_cases(device):
    check_named_cases(device)


def test_named_cases_hold_for_the_reference():
    check_named_cases("cpu", ref.quantize_nvfp4)


@pytest.mark.parametrize("case", cases.DEQUANT_CASES, ids=lambda c: c.name)
def test_named_dequantize_cases(case, device):
    codes, scales = fp4_checks.one_code_block(case, cases.BLOCK)
    scale = DecodeScale(case.decode_scale)
    for dtype, bits in case.expected.items():
        for impl, dev in ((ref.dequantize_nvfp4, "cpu"), (kernel.dequantize_nvfp4, device)):
            out = impl(codes.to(dev), scales.to(dev), scale.to(dev), dtype=dtype)
            fp4_checks.assert_first_element(out, bits, f"{case.name} [{dtype}] ({case.note})")


@pytest.mark.parametrize("inputs", ["bf16_all_patterns", "near_midpoints", "double_rounding", "fp32_wide_spread"])
def test_reference_matches_ml_dtypes_oracle(inputs):
    x, s = {
        "bf16_all_patterns": lambda: (mxfp4_cases.all_bf16_patterns(3), 3.0e-20),
        "near_midpoints": lambda: (cases.near_midpoints(), 1.0),
        "double_rounding": lambda: (cases.double_rounding_blocks(), 1.0),
        "fp32_wide_spread": lambda: (cases.random_nvfp4_blocks((128, 256), torch.float32, 1, 30.0), 7.7),
    }[inputs]()
    codes, scales = ref.quantize_nvfp4(x, EncodeScale(s))
    want_codes, want_scales = oracles.quantize_nvfp4(x, s)
    assert_exact(scales, want_scales, "scales vs oracle")
    assert_exact(codes, want_codes, "codes vs oracle")


@pytest.mark.parametrize("special", ["nan", "inf", "-inf"])
def test_one_nonfinite_poisons_only_its_block(special, device):
    x = cases.random_nvfp4_blocks((3, 64), torch.float32, seed=7, spread=4.0)
    scale = EncodeScale.from_amax(tensor_amax(x)).to(device)
    fp4_checks.check_nonfinite_poisons_only_its_block(
        x.to(device),
        37,
        cases.SPECIALS[special],
        lambda x: kernel.quantize_nvfp4(x, scale),  # block 2 of row 1
        lambda codes, scales: kernel.dequantize_nvfp4(codes, scales, scale, dtype=torch.float32),
        block=cases.BLOCK,
        nan_scale=0x7F,
    )


# Metamorphic properties (no oracle needed), on the kernel.
@given(p=quant_problems(), cut=st.integers(0, 5), width=st.integers(1, 6))
def test_tensor_parallel_shard_equals_shard_of_quantized(p, cut, width, device):
    x = make_input({**p, "shape": (3, 16 * 12)}).to(device)
    scale = global_scale(x.cpu(), p["source"]).to(device)
    fp4_checks.check_shard_of_quantized(x, cut, width, lambda x: kernel.quantize_nvfp4(x, scale), block=cases.BLOCK)


@given(p=quant_problems())
def test_sign_symmetry(p, device):
    x = make_input(p).to(device)
    scale = global_scale(x.cpu(), p["source"]).to(device)
    fp4_checks.check_sign_symmetry(x, lambda x: kernel.quantize_nvfp4(x, scale), block=cases.BLOCK, nan_scale=0x7F)


@given(seed=st.integers(0, 2**31 - 1), shift=st.integers(-30, 30))
def test_scaling_input_and_global_scale_together_changes_nothing(seed, shift, device):
    """x * 2**k with s_enc * 2**-k: every block scale and code is unchanged (all products are exact)."""
    x = cases.random_nvfp4_blocks((4, 64), torch.float32, seed, spread=2.0)
    scale = EncodeScale.from_amax(tensor_amax(x))
    codes, scales = kernel.quantize_nvfp4(x.to(device), scale.to(device))
    shifted = EncodeScale(scale.value * 2.0**-shift).to(device)
    shifted_codes, shifted_scales = kernel.quantize_nvfp4((x * 2.0**shift).to(device), shifted)
    assert_exact(shifted_scales, scales, "scales after x * 2**k, s / 2**k")
    assert_exact(shifted_codes, codes, "codes after x * 2**k, s / 2**k")


def test_round_trip_is_idempotent():
    x = cases.random_nvfp4_blocks((32, 256), torch.float32, seed=5, spread=6.0)
    scale = EncodeScale.from_amax(tensor_amax(x))
    once = ref.dequantize_nvfp4(*ref.quantize_nvfp4(x, scale), scale, dtype=torch.float32)
    twice = ref.dequantize_nvfp4(*ref.quantize_nvfp4(once, scale), scale, dtype=torch.float32)
    # Re-quantizing a dequantized tensor reproduces it wherever the block scale comes back the same.
    same_scale = ref.quantize_nvfp4(once, scale)[1] == ref.quantize_nvfp4(x, scale)[1]
    mask = same_scale.repeat_interleave(16, dim=-1)
    assert same_scale.float().mean() > 0.9
    assert_exact(twice[mask], once[mask], "dequant(quant(dequant(quant(x))))")


def test_opcheck_quantize(device):
    x = cases.random_nvfp4_blocks((4, 64), torch.bfloat16, seed=3, spread=4.0).to(device)
    s = EncodeScale.from_amax(tensor_amax(x)).value.to(device)
    torch.library.opcheck(torch.ops.touchstone.quantize_nvfp4.default, (x, s))


def test_opcheck_dequantize(device):
    x = cases.random_nvfp4_blocks((4, 64), torch.float32, seed=4, spread=4.0)
    scale = EncodeScale.from_amax(tensor_amax(x))
    codes, scales = ref.quantize_nvfp4(x, scale)
    torch.library.opcheck(
        torch.ops.touchstone.dequantize_nvfp4.default,
        (codes.to(device), scales.to(device), scale.to_decode().value.to(device), torch.float16),
    )


def test_empty_input(device):
    scale = EncodeScale(1.0).to(device)
    codes, scales = kernel.quantize_nvfp4(torch.empty(0, 64, device=device), scale)
    assert codes.shape == (0, 32) and scales.shape == (0, 4)
    assert kernel.dequantize_nvfp4(codes, scales, scale).shape == (0, 64)


@pytest.mark.parametrize("dtype", INPUT_DTYPES)
def test_multi_tile_launch_with_a_ragged_last_program(dtype, device, monkeypatch):
    """Several tiles per program (the GPU launch shape), with the last program's tiles partly past the end."""
    monkeypatch.setattr(kernel, "_INTERPRETER", (16, 3, 1))
    monkeypatch.setitem(kernel._QUANTIZE_GPU, dtype, (16, 3, 1))
    x = cases.random_nvfp4_blocks((37, 80), torch.float32, seed=9, spread=12.0).to(dtype)  # 185 blocks: 4 programs
    check_quantize(x, EncodeScale.from_amax(tensor_amax(x)), device)


def test_multiplier_table_is_the_reference_division():
    """`multipliers` holds r = s / d for every non-negative scale byte, as the reference computes it."""
    s = EncodeScale.from_amax(torch.tensor(7.25)).value
    stored = decode_e4m3(torch.arange(127, dtype=torch.uint8))
    want = torch.where(stored == 0, torch.zeros_like(stored), s / stored)
    table = kernel.multipliers(s)
    assert_exact(table[:127], want, "multipliers")
    assert table.shape == (128,) and table[127].isnan()


@pytest.mark.parametrize("dtype", INPUT_DTYPES)
def test_other_multiplier_path(dtype, device, monkeypatch):
    """The launch knob's other side (in-kernel division vs the launcher's table) gives the same bytes."""
    monkeypatch.setattr(kernel, "_MULTIPLIER_TABLE", not kernel._MULTIPLIER_TABLE)
    x = cases.inject(
        cases.random_nvfp4_blocks((6, 64), torch.float32, seed=11, spread=12.0), [(0.3, "nan"), (0.7, "-inf")]
    ).to(dtype)
    for scale in (EncodeScale.from_amax(tensor_amax(x[torch.isfinite(x)])), EncodeScale(3.7e20)):
        check_quantize(x, scale, device)
    if dtype == torch.float32:
        check_quantize(cases.double_rounding_blocks(), EncodeScale(1.0), device)
        check_named_cases(device)


@given(
    seed=st.integers(0, 2**31 - 1),
    cut=st.integers(0, 5),
    width=st.integers(1, 6),
    out_dtype=st.sampled_from(OUTPUT_DTYPES),
)
def test_dequantize_of_a_shard_equals_shard_of_dequantized(seed, cut, width, out_dtype, device):
    """Column slices of codes/scales (strided rows, no copy) go through the kernel's non-contiguous path."""
    scale = DecodeScale(0.37).to(device)
    fp4_checks.check_shard_of_dequantized(
        seed,
        cut,
        width,
        lambda codes, scales: kernel.dequantize_nvfp4(codes, scales, scale, dtype=out_dtype),
        cases.BLOCK,
        device,
    )


# Boundary: bad input raises an error that names the argument, in the reference and the kernel alike.
IMPLS = {"reference": ref, "kernel": kernel}
QUANTIZE_ERRORS = [
    (
        lambda d: torch.zeros(2, 64, dtype=torch.int32, device=d),
        lambda d: EncodeScale(1.0).to(d),
        TypeError,
        "x: dtype",
    ),
    (
        lambda d: torch.zeros(2, 40, device=d),
        lambda d: EncodeScale(1.0).to(d),
        ValueError,
        "x: last dim must be a multiple of 16",
    ),
    (lambda d: torch.zeros(2, 64, device=d), lambda d: 1.0, TypeError, "global_scale: must be an EncodeScale"),
    (
        lambda d: torch.zeros(2, 64, device=d),
        lambda d: torch.tensor(1.0, device=d),
        TypeError,
        "a bare value does not say which",
    ),
]


@pytest.mark.parametrize("impl", sorted(IMPLS))
@pytest.mark.parametrize(("x", "scale", "error", "message"), QUANTIZE_ERRORS, ids=["dtype", "k", "float", "tensor"])
def test_quantize_rejects(impl, x, scale, error, message, device):
    dev = device if impl == "kernel" else "cpu"
    with pytest.raises(error, match=message):
        IMPLS[impl].quantize_nvfp4(x(dev), scale(dev))


DEQUANTIZE_ERRORS = [
    (torch.zeros(2, 8, dtype=torch.int8), torch.zeros(2, 1, dtype=torch.uint8), {}, TypeError, "codes: dtype"),
    (torch.zeros(2, 8, dtype=torch.uint8), torch.zeros(2, 1), {}, TypeError, "scales: dtype"),
    (
        torch.zeros(2, 8, dtype=torch.uint8),
        torch.zeros(2, 2, dtype=torch.uint8),
        {},
        ValueError,
        "do not describe one NVFP4 tensor",
    ),
    (
        torch.zeros(2, 8, dtype=torch.uint8),
        torch.zeros(2, 1, dtype=torch.uint8),
        {"dtype": torch.int32},
        TypeError,
        "dtype must be one of",
    ),
]


@pytest.mark.parametrize("impl", sorted(IMPLS))
@pytest.mark.parametrize(
    ("codes", "scales", "kwargs", "error", "message"),
    DEQUANTIZE_ERRORS,
    ids=["codes-dtype", "scales-dtype", "k-mismatch", "out-dtype"],
)
def test_dequantize_rejects(impl, codes, scales, kwargs, error, message, device):
    dev = device if impl == "kernel" else "cpu"
    with pytest.raises(error, match=message):
        IMPLS[impl].dequantize_nvfp4(codes.to(dev), scales.to(dev), DecodeScale(1.0).to(dev), **kwargs)


def test_kernel_rejects_non_unit_last_stride(device):
    with pytest.raises(ValueError, match="x: last dim must have stride 1"):
        kernel.quantize_nvfp4(torch.zeros(64, 32, device=device).t(), EncodeScale(1.0).to(device))


def test_scale_on_another_device_is_refused():
    with pytest.raises(ValueError, match="global_scale: on meta, but x is on cpu"):
        ref.quantize_nvfp4(torch.zeros(2, 64), EncodeScale(torch.tensor(1.0, device="meta")))


def test_fake_impl_validates_too():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(), pytest.raises(ValueError, match="x: last dim must be a multiple of 16"):
        torch.ops.touchstone.quantize_nvfp4(torch.empty(2, 40), torch.empty((), dtype=torch.float32))
