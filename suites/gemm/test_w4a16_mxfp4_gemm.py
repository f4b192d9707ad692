"""W4A16 MXFP4 GEMM: the Triton kernel against the precision-mirroring reference and the ideal one.

Lossy-op policy (kernels.tolerances, row "w4a16_mxfp4_gemm"): max/RMS relative error against the mirror
(the kernel sums fp32 in its own order, so a bf16 rounding may flip by one ulp) and an SQNR floor against
the fp64 product with the weights before quantization. Named cases pin exact outputs where the arithmetic
leaves no freedom (one-hot activations select single weights; sums exact in fp32 and rounded once).
Both kernel paths run on every tier: M = 1 takes the fp32-FMA GEMV kernel, M >= 2 the tensor-core one.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kernels.tolerances import assert_exact, assert_lossy, families
from reference.gemm import w4a16_mxfp4 as ref
from reference.quant.mxfp4 import quantize_mxfp4
from suites import oracles
from suites.quant.mxfp4_cases import random_blocks

kernel = pytest.importorskip("kernels.w4a16_mxfp4_gemm")
FAMILY = families.W4A16_MXFP4_GEMM
SCALE_MODES = ("floor", "rceil", "even", "ceil")


def quantized_weights(n: int, k: int, seed: int, spread: float, exponent: int, mode: str):
    """Random weights (blocks spread over 2**+-spread, the whole matrix times 2**exponent) and their MXFP4
    codes/scales; |exponent| <= 100 keeps every scale byte inside 0..252 (the kernel's contract)."""
    w = (random_blocks((n, k), torch.float32, seed, spread) * 2.0**exponent).to(torch.bfloat16)
    codes, scales = quantize_mxfp4(w, scale_mode=mode)
    return w, codes, scales


def check(x, codes, scales, device, ideal, gemm=kernel.w4a16_mxfp4_gemm):
    got = gemm(x.to(device), codes.to(device), scales.to(device))
    assert got.dtype == torch.bfloat16 and got.shape == (x.shape[0], codes.shape[0])
    return assert_lossy(FAMILY, got.cpu(), ref.w4a16_mxfp4_gemm_mirror(x, codes, scales), ideal)


@st.composite
def problems(draw):
    x_exponent = draw(st.integers(-60, 60))
    return dict(
        m=draw(st.sampled_from([1, 1, 2, 3, 8, 17, 33])),
        n=draw(st.integers(16, 40)),
        k=32 * draw(st.integers(1, 7)),
        seed=draw(st.integers(0, 2**31 - 1)),
        spread=draw(st.sampled_from([0.0, 4.0, 12.0])),
        mode=draw(st.sampled_from(SCALE_MODES)),
        x_exponent=x_exponent,
        w_exponent=draw(st.integers(max(-100, -100 - x_exponent), min(100, 100 - x_exponent))),
        zero_block=draw(st.booleans()),
    )


@given(p=problems())
def test_matches_mirror_and_ideal(p, device):
    w, codes, scales = quantized_weights(p["n"], p["k"], p["seed"], p["spread"], p["w_exponent"], p["mode"])
    if p["zero_block"]:  # an all-zero block: scale byte 0 (2**-127)
        w[0, :32] = 0.0
        codes[0, :16], scales[0, 0] = 0, 0
    x = random_blocks((p["m"], p["k"]), torch.float32, p["seed"] + 1, 2.0) * 2.0 ** p["x_exponent"]
    x = x.to(torch.bfloat16)
    # SQNR against the unquantized product measures MXFP4's loss; with blocks spread over 2**+-12 a small
    # output is dominated by a few blocks and that figure is noise, so those draws use the exact product of
    # the dequantized operands as the ideal instead.
    ideal = ref.w4a16_mxfp4_gemm_ideal(x, codes, scales) if p["spread"] > 4 else oracles.unquantized_product(x, w)
    check(x, codes, scales, device, ideal)


@given(
    seed=st.integers(0, 2**31 - 1), m=st.sampled_from([1, 5]), nan_row=st.integers(0, 5), nan_block=st.integers(0, 2)
)
def test_nan_scale_poisons_its_row_only(seed, m, nan_row, nan_block, device):
    _, codes, scales = quantized_weights(6, 96, seed, 4.0, 0, "floor")
    scales[nan_row, nan_block] = 0xFF
    x = random_blocks((m, 96), torch.bfloat16, seed + 1, 2.0)
    got = kernel.w4a16_mxfp4_gemm(x.to(device), codes.to(device), scales.to(device)).cpu()
    assert got[:, nan_row].isnan().all()
    assert not got[:, [r for r in range(6) if r != nan_row]].isnan().any()
    check(x, codes, scales, device, ref.w4a16_mxfp4_gemm_ideal(x, codes, scales))


# Named cases: (name, x rows of one K = 64 problem as {index: value}, codes bytes of row 0 as {byte: value},
# scale bytes of row 0, expected y[., 0] per x row). Every other code byte is 0x00 (+0) and scale 127.
NAMED = [
    (
        "nibble_order_and_scale",
        [{0: 1.0}, {1: 1.0}, {33: 1.0}],
        {0: 0x21, 16: 0x70},
        (128, 125),
        [1.0, 2.0, 1.5],
        "byte 0 = 0x21: element 0 is code 1 (0.5), element 1 code 2 (1.0), times 2**1; "
        "block 1 byte 0 = 0x70: element 33 is code 7 (6), times 2**-2",
    ),
    (
        "negative_codes",
        [{0: 1.0}, {1: -2.0}],
        {0: 0xF9},
        (127, 127),
        [-0.5, 12.0],
        "0xF9: element 0 code 9 (-0.5), element 1 code 0xF (-6); -2 * -6 = 12",
    ),
    (
        "smallest_scale",
        [{0: 2.0**40}],
        {0: 0x07},
        (0, 127),
        [6.0 * 2.0**-87],
        "scale byte 0 is 2**-127 (subnormal): 6 * 2**-127 * 2**40",
    ),
    (
        "largest_contract_scale",
        [{0: 1.0}, {0: -0.5}],
        {0: 0x07},
        (252, 127),
        [1.5 * 2.0**127, -0.75 * 2.0**127],
        "scale byte 252 is 2**125: 6 * 2**125 = 1.5 * 2**127, still below bf16 max",
    ),
    (
        "fp32_overflow_to_inf",
        [{0: 1.0, 1: 1.0}],
        {0: 0x77},
        (252, 127),
        [math.inf],
        "two weights of 1.5 * 2**127 sum past fp32 max",
    ),
    (
        "one_rounding_tie_to_even",
        [{0: 1.0, 32: 2.0**-8}],
        {0: 0x02, 16: 0x02},
        (127, 127),
        [1.0],
        "1 + 2**-8 is exact in fp32 and a bf16 tie: RNE gives 1.0",
    ),
    (
        "one_rounding_sticky",
        [{0: 1.0, 32: 2.0**-8, 33: 2.0**-20}],
        {0: 0x02, 16: 0x22},
        (127, 127),
        [1.0 + 2.0**-7],
        "1 + 2**-8 + 2**-20 in fp32, rounded once, is above the tie: 1 + 2**-7 (bf16 partial "
        "sums would lose the 2**-20)",
    ),
]


def named_problem(x_rows, code_bytes, scale_bytes):
    x = torch.zeros(len(x_rows), 64)
    for r, row in enumerate(x_rows):
        for i, v in row.items():
            x[r, i] = v
    codes = torch.zeros(3, 32, dtype=torch.uint8)
    for i, v in code_bytes.items():
        codes[0, i] = v
    codes[1:] = codes[0].roll(1)  # rows 1 and 2: other weights, so that a wrong row index shows
    scales = torch.full((3, 2), 127, dtype=torch.uint8)
    scales[0] = torch.tensor(scale_bytes, dtype=torch.uint8)
    return x.to(torch.bfloat16), codes, scales


@pytest.mark.parametrize("rows", [1, 17], ids=["gemv", "dot"])
@pytest.mark.parametrize(
    ("name", "x_rows", "code_bytes", "scale_bytes", "want", "note"), NAMED, ids=[c[0] for c in NAMED]
)
def test_named_cases(name, x_rows, code_bytes, scale_bytes, want, note, rows, device):
    x, codes, scales = named_problem(x_rows, code_bytes, scale_bytes)
    want = torch.tensor(want, dtype=torch.bfloat16)
    assert_exact(ref.w4a16_mxfp4_gemm_mirror(x, codes, scales)[:, 0], want, f"{name}: mirror ({note})")
    # Each x row on its own (M = 1, GEMV) or all of them repeated to 17 rows (tensor-core kernel).
    for r in range(x.shape[0]):
        xr = x[r : r + 1].expand(rows, -1).contiguous()
        got = kernel.w4a16_mxfp4_gemm(xr.to(device), codes.to(device), scales.to(device)).cpu()
        assert_exact(got[:, 0], want[r].expand(rows), f"{name}: kernel, x row {r} ({note})")


@pytest.mark.parametrize(
    ("kind", "stages"), [("gemv", 1), ("gemv", 2), ("dot", 1)], ids=["gemv", "gemv_prefetch", "dot"]
)
@pytest.mark.parametrize("split_k", [1, 2, 4])
def test_split_k_and_ragged_k_tiles(kind, stages, split_k, device):
    """K = 7 blocks in tiles of 2 (the last tile half empty), split over up to 4 programs per output (one
    K tile each); the GEMV with and without its next-tile prefetch (whose last load is masked off)."""
    w, codes, scales = quantized_weights(24, 224, 5, 6.0, 0, "rceil")
    m = 1 if kind == "gemv" else 20
    x = random_blocks((m, 224), torch.bfloat16, 6, 3.0)
    config = (kind, 16, 16, 2, split_k, 4, stages)
    want = oracles.unquantized_product(x, w)
    check(x, codes, scales, device, want, gemm=lambda *args: kernel.launch(*args, config=config))


def test_strided_rows_are_read_in_place(device):
    w, codes, scales = quantized_weights(20, 512, 7, 4.0, 0, "even")
    x = random_blocks((3, 512), torch.bfloat16, 8, 2.0)[:, 128:384]  # K = 256 of a wider activation
    for m in (1, 3):
        check(x[:m], codes[:, 64:192], scales[:, 4:12], device, oracles.unquantized_product(x[:m], w[:, 128:384]))


def test_empty_and_degenerate_shapes(device):
    codes, scales = torch.zeros(4, 16, dtype=torch.uint8), torch.full((4, 1), 127, dtype=torch.uint8)
    assert kernel.w4a16_mxfp4_gemm(
        torch.zeros(0, 32, dtype=torch.bfloat16, device=device), codes.to(device), scales.to(device)
    ).shape == (0, 4)
    y = kernel.w4a16_mxfp4_gemm(
        torch.ones(2, 0, dtype=torch.bfloat16, device=device),
        torch.zeros(4, 0, dtype=torch.uint8, device=device),
        torch.zeros(4, 0, dtype=torch.uint8, device=device),
    )
    assert_exact(y.cpu(), torch.zeros(2, 4, dtype=torch.bfloat16))


def test_mirror_is_the_ideal_rounded_once():
    """The mirror differs from the exact product by one bf16 rounding plus fp32 reassociation."""
    _, codes, scales = quantized_weights(64, 512, 9, 8.0, 3, "floor")
    x = random_blocks((8, 512), torch.bfloat16, 10, 8.0)
    ideal = ref.w4a16_mxfp4_gemm_ideal(x, codes, scales)
    magnitude = x.double().abs() @ ref.dequantize_exact(codes, scales).abs().T
    error = (ref.w4a16_mxfp4_gemm_mirror(x, codes, scales).double() - ideal).abs()
    assert (error <= ideal.abs() * 2.0**-8 + magnitude * 512 * 2.0**-24).all()


def test_opcheck(device):
    _, codes, scales = quantized_weights(16, 64, 11, 2.0, 0, "floor")
    x = random_blocks((2, 64), torch.bfloat16, 12, 2.0)
    torch.library.opcheck(
        torch.ops.touchstone.w4a16_mxfp4_gemm.default, (x.to(device), codes.to(device), scales.to(device))
    )


def _args(**change):
    args = dict(
        x=torch.zeros(2, 64, dtype=torch.bfloat16),
        codes=torch.zeros(3, 32, dtype=torch.uint8),
        scales=torch.zeros(3, 2, dtype=torch.uint8),
    )
    args.update(change)
    return args


@pytest.mark.parametrize(
    ("args", "error", "message"),
    [
        (_args(x=torch.zeros(2, 64)), TypeError, "x: dtype"),
        (_args(codes=torch.zeros(3, 32, dtype=torch.int8)), TypeError, "codes: dtype"),
        (_args(scales=torch.zeros(3, 2, dtype=torch.float8_e8m0fnu)), TypeError, "scales: dtype"),
        (_args(x=torch.zeros(2, 48, dtype=torch.bfloat16)), ValueError, "x: K = 48"),
        (_args(codes=torch.zeros(3, 16, dtype=torch.uint8)), ValueError, "codes: shape"),
        (_args(scales=torch.zeros(2, 2, dtype=torch.uint8)), ValueError, "scales: shape"),
        (_args(x=torch.zeros(64, dtype=torch.bfloat16)), ValueError, "x: must be 2-D"),
    ],
)
def test_bad_arguments(args, error, message, device):
    for impl, dev in ((ref.w4a16_mxfp4_gemm_mirror, "cpu"), (kernel.w4a16_mxfp4_gemm, device)):
        with pytest.raises(error, match=message):
            impl(*(t.to(dev) for t in args.values()))


def test_kernel_rejects_layouts_it_cannot_read(device):
    x = torch.zeros(64, 2, dtype=torch.bfloat16, device=device).T  # K not contiguous
    codes, scales = (
        torch.zeros(3, 32, dtype=torch.uint8, device=device),
        torch.zeros(3, 2, dtype=torch.uint8, device=device),
    )
    with pytest.raises(ValueError, match="x: last dim must have stride 1"):
        kernel.w4a16_mxfp4_gemm(x, codes, scales)
    wide = torch.zeros(3, 34, dtype=torch.uint8, device=device)[:, 1:33]  # rows off 4-byte boundaries
    with pytest.raises(ValueError, match="codes: rows must start on 4-byte boundaries"):
        kernel.w4a16_mxfp4_gemm(torch.zeros(2, 64, dtype=torch.bfloat16, device=device), wide, scales)


# Negative controls: bugs planted in the real kernel (kernels.w4a16_mxfp4_gemm.FAULTS) that the lossy check
# against the mirror must catch, on both paths. Spread 8 makes neighbouring blocks' scales differ.
def faulty(fault: str):
    return lambda x, codes, scales: kernel.launch(x, codes, scales, fault=fault)


@pytest.mark.parametrize("m", [1, 17], ids=["gemv", "dot"])
@pytest.mark.parametrize("fault", ["scale_of_next_block", "swap_nibbles"])
def test_negative_control(fault, m, device):
    w, codes, scales = quantized_weights(16, 128, 13, 8.0, 0, "floor")
    x = random_blocks((m, 128), torch.bfloat16, 14, 2.0)
    with pytest.raises(AssertionError, match="max_rel"):
        check(x, codes, scales, device, oracles.unquantized_product(x, w), gemm=faulty(fault))
    check(x, codes, scales, device, oracles.unquantized_product(x, w), gemm=faulty("none"))
