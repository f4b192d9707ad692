"""RMSNorm and fused residual-add + RMSNorm: the Triton kernel against `reference.norm.rms_norm` (new residual
bit-exact, the normalized output within the "rms_norm" LOSSY row), the reference against the runner's own
RMSNorm module, named edge cases with expected values, opcheck per op, negative controls."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kernels.tolerances import assert_exact, assert_lossy, families
from reference.norm import rms_norm as ref
from reference.quant.fp8 import quantize_fp8

kernel = pytest.importorskip("kernels.rms_norm")
EPS = 1e-5


def ref_quantize(t: torch.Tensor):
    return quantize_fp8(t, granularity="group", group_size=128)


@st.composite
def problems(draw, hidden=None, dtypes=ref.DTYPES):
    """Shapes, dtypes and scales; `hidden` and `dtypes` narrow the draw where a form needs it (the FP8 forms:
    whole 128-wide groups, 16-bit inputs), drawn directly rather than filtered."""
    hidden = draw(hidden or st.one_of(st.sampled_from([576, 64, 1000, 2048]), st.integers(16, 300)))
    return dict(
        shape=(*draw(st.lists(st.integers(1, 3), max_size=2)), hidden),
        dtype=draw(st.sampled_from(dtypes)),
        seed=draw(st.integers(0, 2**31 - 1)),
        scale=draw(st.sampled_from([2.0**-10, 1.0, 4.0, 2.0**12])),
        residual=draw(st.booleans()),
        eps=draw(st.sampled_from([EPS, 1e-6, 0.5])),
    )


def make_inputs(p: dict):
    g = torch.Generator().manual_seed(p["seed"])
    x = (torch.randn(p["shape"], generator=g) * p["scale"]).to(p["dtype"])
    weight = (1 + torch.randn(p["shape"][-1], generator=g) / 4).to(p["dtype"])
    residual = (torch.randn(p["shape"], generator=g) * p["scale"]).to(p["dtype"]) if p["residual"] else None
    return x, weight, residual


def check_norm(x, weight, eps, residual, device, norm=kernel.rms_norm) -> None:
    moved = None if residual is None else residual.to(device)
    got = norm(x.to(device), weight.to(device), eps, moved)
    want = ref.rms_norm(x, weight, eps, residual)
    ideal = ref.rms_norm_ideal(x, weight, eps, residual)
    if residual is not None:
        assert_exact(got[1], want[1], "new residual")
        got, want, ideal = got[0], want[0], ideal[0]
    assert_lossy(families.RMS_NORM, got.cpu(), want, ideal, "out")


@given(p=problems())
def test_rms_norm_matches_reference(p, device):
    x, weight, residual = make_inputs(p)
    check_norm(x, weight, p["eps"], residual, device)


@pytest.mark.parametrize("dtype", ref.DTYPES)
def test_reference_is_the_runners_rmsnorm(dtype):
    """The mirror must be what runner/model/layers.py computes today, residual add included."""
    from runner.model.layers import RMSNorm

    x, weight, residual = make_inputs(dict(shape=(5, 576), dtype=dtype, seed=1, scale=3.0, residual=True))
    module = RMSNorm(576, EPS, dtype, "cpu")
    with torch.no_grad():
        module.weight.copy_(weight)
        h = x + residual
        want = module(h)
    out, new_residual = ref.rms_norm(x, weight, EPS, residual)
    assert_exact(new_residual, h, "new residual")
    assert_exact(out, want, "out")
    assert_exact(ref.rms_norm(h, weight, EPS), want, "out without residual")


def test_fused_add_and_norm_on_strided_rows(device):
    x, weight, residual = make_inputs(dict(shape=(4, 1152), dtype=torch.bfloat16, seed=2, scale=1.0, residual=True))
    check_norm(x[:, 288:864], weight[288:864].contiguous(), EPS, residual[:, :576], device)


TINY_NORMED = 1e-6 / math.sqrt(1e-12 + EPS)
# (name, row values (hidden 576, the rest +0.0 unless `fill`), fill, dtype, expected first outputs, weight 1)
NAMED = [
    ("zeros_row_is_zero_not_nan", [0.0, -0.0], 0.0, torch.bfloat16, [0.0, -0.0]),
    # all 576 equal: mean(r^2) = r^2, eps negligible -> +-1 exactly (rsqrt(4) = 0.5 in any rounding)
    ("constant_row_is_one", [-2.0], 2.0, torch.float16, [-1.0, 1.0]),
    # squares ~1e34 sum to ~5.8e36 < fp32 max: normalized, no overflow
    ("huge_values_normalize", [-1e17], 1e17, torch.float32, [-1.0, 1.0]),
    # squares overflow fp32: rsqrt(inf) = 0, the row becomes zeros (the runner's behaviour, documented)
    ("overflowing_row_is_zero", [3e38], 3e38, torch.float32, [0.0, 0.0]),
    # eps dominates a tiny row: 1e-6 * rsqrt(1e-12 + 1e-5) = 3.162e-4
    ("eps_dominates_tiny_row", [-1e-6], 1e-6, torch.float32, [-TINY_NORMED, TINY_NORMED]),
]


@pytest.mark.parametrize(("name", "values", "fill", "dtype", "expected"), NAMED, ids=[n[0] for n in NAMED])
@pytest.mark.parametrize("with_residual", [False, True], ids=["plain", "fused"])
def test_named_cases(name, values, fill, dtype, expected, with_residual, device):
    x = torch.full((2, 576), fill, dtype=torch.float32)
    x[:, : len(values)] = torch.tensor(values)
    x = x.to(dtype)
    weight = torch.ones(576, dtype=dtype)
    residual = torch.zeros_like(x) if with_residual else None
    for impl, dev in ((ref.rms_norm, "cpu"), (kernel.rms_norm, device)):
        got = impl(x.to(dev), weight.to(dev), EPS, None if residual is None else residual.to(dev))
        out = got[0] if with_residual else got
        want = torch.tensor(expected, dtype=torch.float64)
        assert torch.allclose(out[:, :2].cpu().double(), want.expand(2, 2), rtol=2e-6, atol=0), f"{name}: {out}"
        if name.startswith("zeros"):
            r = x if residual is None else x + residual  # -0 + +0 = +0: the fused row has no -0 left
            assert_exact(out.cpu(), r, f"{name} ({impl.__module__})")


def test_nan_poisons_only_its_row(device):
    x, weight, _ = make_inputs(dict(shape=(3, 64), dtype=torch.bfloat16, seed=4, scale=1.0, residual=False))
    x[1, 7] = math.nan
    out = kernel.rms_norm(x.to(device), weight.to(device), EPS).cpu()
    assert out[1].isnan().all() and torch.isfinite(out[[0, 2]]).all()


FP8_GROUPS = st.one_of(st.sampled_from([2048]), st.integers(1, 5).map(lambda groups: 128 * groups))
FP8_INPUTS = [dtype for dtype in ref.DTYPES if dtype != torch.float32]


@given(p=problems(hidden=FP8_GROUPS, dtypes=FP8_INPUTS))
def test_fp8_form_is_the_quantized_unfused_output(p, device):
    """rms_norm_fp8: codes and scales == reference quantize_fp8 (group 128) of the unfused kernel's output, bit for
    bit; the new residual as the unfused form's."""
    x, weight, residual = (None if t is None else t.to(device) for t in make_inputs(p))
    fused = kernel.rms_norm_fp8(x, weight, p["eps"], residual)
    plain = kernel.rms_norm(x, weight, p["eps"], residual)
    if residual is not None:
        assert_exact(fused[1].cpu(), plain[1].cpu(), "new residual")
        fused, plain = fused[0], plain[0]
    want_codes, want_scales = ref_quantize(plain.cpu())
    assert_exact(fused[0].cpu().view(torch.uint8), want_codes.view(torch.uint8), "codes")
    assert_exact(fused[1].cpu(), want_scales, "scales")


def test_fp8_reference_is_the_composition():
    x, weight, residual = make_inputs(dict(shape=(2, 256), dtype=torch.bfloat16, seed=9, scale=1.0, residual=True))
    (codes, scales), new_residual = ref.rms_norm_fp8(x, weight, EPS, residual)
    out, want_residual = ref.rms_norm(x, weight, EPS, residual)
    want_codes, want_scales = ref_quantize(out)
    assert_exact(codes.view(torch.uint8), want_codes.view(torch.uint8), "codes")
    assert_exact(scales, want_scales, "scales")
    assert_exact(new_residual, want_residual, "new residual")


def test_fp8_form_needs_whole_groups(device):
    x, weight, _ = make_inputs(dict(shape=(2, 200), dtype=torch.bfloat16, seed=1, scale=1.0, residual=False))
    with pytest.raises(ValueError, match="x: the FP8 form quantizes whole 128-wide groups"):
        kernel.launch_rms_norm(x.to(device), weight.to(device), EPS, fp8_groups=True)


def test_opcheck_fp8(device):
    x, weight, residual = make_inputs(dict(shape=(3, 256), dtype=torch.bfloat16, seed=7, scale=1.0, residual=True))
    x, weight, residual = x.to(device), weight.to(device), residual.to(device)
    torch.library.opcheck(torch.ops.touchstone.rms_norm_fp8.default, (x, weight, EPS))
    torch.library.opcheck(torch.ops.touchstone.fused_add_rms_norm_fp8.default, (x, residual, weight, EPS))


def test_opcheck(device):
    x, weight, residual = make_inputs(dict(shape=(3, 576), dtype=torch.bfloat16, seed=5, scale=1.0, residual=True))
    x, weight, residual = x.to(device), weight.to(device), residual.to(device)
    torch.library.opcheck(torch.ops.touchstone.rms_norm.default, (x, weight, EPS))


def test_opcheck_fused(device):
    x, weight, residual = make_inputs(dict(shape=(3, 576), dtype=torch.float16, seed=6, scale=1.0, residual=True))
    x, weight, residual = x.to(device), weight.to(device), residual.to(device)
    torch.library.opcheck(torch.ops.touchstone.fused_add_rms_norm.default, (x, residual, weight, EPS))


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (dict(x=torch.zeros(2, 8, dtype=torch.int32)), TypeError, "x: dtype"),
        (dict(weight=torch.ones(8, dtype=torch.float16)), TypeError, "weight: dtype"),
        (dict(weight=torch.ones(4)), ValueError, "weight: shape"),
        (dict(eps=0.0), ValueError, "eps"),
        (dict(residual=torch.zeros(2, 8, dtype=torch.bfloat16)), TypeError, "residual: dtype"),
        (dict(residual=torch.zeros(3, 8)), ValueError, "residual: shape"),
    ],
)
def test_bad_arguments(kwargs, error, message, device):
    args = dict(x=torch.zeros(2, 8), weight=torch.ones(8), eps=EPS, residual=None) | kwargs
    for impl, dev in ((ref.rms_norm, "cpu"), (kernel.rms_norm, device)):
        moved = {k: (v.to(dev) if isinstance(v, torch.Tensor) else v) for k, v in args.items()}
        with pytest.raises(error, match=message):
            impl(moved["x"], moved["weight"], moved["eps"], moved["residual"])


def test_kernel_rejects_rows_longer_than_its_block(device):
    with pytest.raises(ValueError, match="x: rows of 8200"):
        kernel.rms_norm(torch.zeros(1, 8200, device=device), torch.ones(8200, device=device), EPS)


# Negative controls: planted bugs in the real kernel that the checks above must catch.
def faulty(fault: str):
    return lambda x, weight, eps, residual=None: kernel.launch_rms_norm(x, weight, eps, residual, fault=fault)


def test_negative_control_forgotten_eps(device):
    x = torch.zeros(2, 576, dtype=torch.bfloat16)  # the named zeros row: rsqrt(0) * 0 = NaN without eps
    weight = torch.ones(576, dtype=torch.bfloat16)
    with pytest.raises(AssertionError, match="NaN positions differ"):
        check_norm(x, weight, EPS, None, device, faulty("forgets_eps"))
    check_norm(x, weight, EPS, None, device, faulty("none"))


def test_negative_control_residual_after_norm(device):
    x, weight, residual = make_inputs(dict(shape=(2, 576), dtype=torch.bfloat16, seed=7, scale=1.0, residual=True))
    with pytest.raises(AssertionError, match="max_rel"):
        check_norm(x, weight, EPS, residual, device, faulty("residual_after_norm"))
    check_norm(x, weight, EPS, residual, device, faulty("none"))
