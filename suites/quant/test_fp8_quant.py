"""FP8 group quantization: the Triton kernel against `reference.quant.fp8`, bit for bit, and the reference
against an ml_dtypes oracle. Per tensor (dynamic and static), per token, per token group; e4m3fn and
e4m3fnuz; fp32 or UE8M0 scales."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kernels.tolerances import assert_exact
from reference.quant import fp8 as ref
from suites import oracles
from suites.quant import mxfp4_cases as cases

kernel = pytest.importorskip("kernels.fp8_quant")
FORMATS = sorted(ref.FP8_FORMATS)


def check_quantize(x, device, quantize=kernel.quantize_fp8, **kwargs) -> None:
    q, scales = quantize(x.to(device), **kwargs)
    want_q, want_scales = ref.quantize_fp8(x, **kwargs)
    assert_exact(scales, want_scales, f"scales {kwargs}")
    assert_exact(q, want_q, f"codes {kwargs}")


@st.composite
def problems(draw):
    granularity = draw(st.sampled_from(ref.GRANULARITIES))
    group_size = draw(st.sampled_from([32, 64, 128]))
    lead = tuple(draw(st.lists(st.integers(1, 4), max_size=2)))
    k = group_size * draw(st.integers(1, 4))
    positions = st.tuples(st.floats(0, 1, exclude_max=True), st.sampled_from(sorted(cases.SPECIALS)))
    return dict(
        shape=(*lead, k),
        dtype=draw(st.sampled_from(ref.INPUT_DTYPES)),
        seed=draw(st.integers(0, 2**31 - 1)),
        spread=draw(st.sampled_from([0.0, 4.0, 12.0])),
        specials=draw(st.lists(positions, max_size=3)),
        kwargs=dict(
            granularity=granularity,
            group_size=group_size,
            fmt=draw(st.sampled_from(FORMATS)),
            ue8m0=draw(st.booleans()),
        ),
    )


def make_input(p: dict) -> torch.Tensor:
    x = cases.random_blocks(p["shape"], torch.float32, p["seed"], p["spread"])
    return cases.inject(x, p["specials"]).to(p["dtype"])


@given(p=problems())
def test_quantize_matches_reference(p, device):
    check_quantize(make_input(p), device, **p["kwargs"])


@given(p=problems())
def test_reference_is_the_same_on_every_device(p, device):
    """The reference run on the GPU must give the CPU's bytes: the bench checks kernels against it there
    (`tensor / python scalar` on CUDA is a multiply by the scalar's rounded reciprocal; this caught it)."""
    x = make_input(p)
    want_q, want_scales = ref.quantize_fp8(x, **p["kwargs"])
    q, scales = ref.quantize_fp8(x.to(device), **p["kwargs"])
    assert_exact(scales, want_scales, f"scales {p['kwargs']}")
    assert_exact(q, want_q, f"codes {p['kwargs']}")


@given(seed=st.integers(0, 2**31 - 1), fmt=st.sampled_from(FORMATS), dtype=st.sampled_from(ref.INPUT_DTYPES))
def test_static_per_tensor_scale(seed, fmt, dtype, device):
    x = cases.random_blocks((5, 96), torch.float32, seed, 6.0).to(dtype)
    scale = torch.tensor([float(torch.rand(1, generator=torch.Generator().manual_seed(seed))) + 1e-3])
    q, scales = kernel.quantize_fp8(x.to(device), granularity="tensor", fmt=fmt, static_scale=scale.to(device))
    want_q, want_scales = ref.quantize_fp8(x, granularity="tensor", fmt=fmt, static_scale=scale)
    assert_exact(scales, want_scales, "static scale")
    assert_exact(q, want_q, "codes with a static scale")


@pytest.mark.gpu_only(reason="needs tensors on two devices")
def test_static_scale_on_another_device_is_refused(device):
    with pytest.raises(ValueError, match="static_scale: on cpu, but x is on"):
        kernel.quantize_fp8(torch.ones(2, 128, device=device), granularity="tensor", static_scale=torch.ones(1))


@pytest.mark.parametrize("ue8m0", [False, True], ids=["fp32-scale", "ue8m0"])
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("arrangement", [None, 0], ids=["sequential", "shuffled"])
def test_every_bf16_pattern_per_group(arrangement, fmt, ue8m0, device):
    x = cases.all_bf16_patterns(arrangement).reshape(512, 128)
    check_quantize(x, device, granularity="group", group_size=128, fmt=fmt, ue8m0=ue8m0)


@pytest.mark.parametrize("ue8m0", [False, True], ids=["fp32-scale", "ue8m0"])
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("granularity", ref.GRANULARITIES)
def test_reference_matches_ml_dtypes_oracle(granularity, fmt, ue8m0):
    x = cases.random_blocks((64, 256), torch.float32, seed=21, spread=30.0)
    x = cases.inject(x, [(0.01, "nan"), (0.3, "-0"), (0.6, "subnormal"), (0.9, "max")])
    q, scales = ref.quantize_fp8(x, granularity=granularity, fmt=fmt, ue8m0=ue8m0)
    want_q, want_scales = oracles.quantize_fp8(x, granularity, 128, fmt, ref.DEFAULT_EPS, ue8m0)
    assert_exact(scales.reshape(-1), torch.from_numpy(want_scales), "scales vs oracle")
    assert_exact(q.reshape(-1), torch.from_numpy(want_q).view(q.dtype), "codes vs oracle")


# (name, group values (the rest of the 128 are +0.0), fmt, ue8m0, expected scale, expected first bytes)
NAMED = [
    (
        "fn_scale_one",
        [448.0, 1.0, -2.0, 0.5, 2**-9, 2**-10, 3 * 2**-10, -0.0],
        "e4m3fn",
        False,
        1.0,
        [0x7E, 0x38, 0xC0, 0x30, 0x01, 0x00, 0x02, 0x80],
    ),  # 2**-10 ties to 0, 3*2**-10 ties to 2**-8 (even)
    (
        "fnuz_scale_one",
        [224.0, 1.0, -2.0, 2**-10, 2**-11, -0.0, -(2**-12)],
        "e4m3fnuz",
        False,
        1.0,
        [0x7E, 0x40, 0xC8, 0x01, 0x00, 0x00, 0x00],
    ),  # no negative zero: -0.0 and -tiny give 0x00
    ("fn_ue8m0_rounds_scale_up", [449.0, 1.0], "e4m3fn", True, 2.0, [0x76, 0x30]),  # 449/2 = 224.5 -> 224
    ("fn_saturates_after_rounding", [448.0, -448.0, 447.0], "e4m3fn", False, 1.0, [0x7E, 0xFE, 0x7E]),
    ("all_zero_group_eps", [0.0], "e4m3fn", False, np.float32(1e-10) / np.float32(448.0), [0x00]),
]


@pytest.mark.parametrize(("name", "values", "fmt", "ue8m0", "scale", "codes"), NAMED, ids=[n[0] for n in NAMED])
def test_named_cases(name, values, fmt, ue8m0, scale, codes, device):
    x = torch.tensor(values + [0.0] * (128 - len(values)), dtype=torch.float32).reshape(1, 128)
    for impl, dev in ((ref.quantize_fp8, "cpu"), (kernel.quantize_fp8, device)):
        q, scales = impl(x.to(dev), granularity="group", group_size=128, fmt=fmt, ue8m0=ue8m0)
        assert math.isclose(scales.item(), float(np.float32(scale)), rel_tol=0), f"{name}: scale {scales.item()}"
        want = torch.tensor(codes + [0] * (128 - len(codes)), dtype=torch.uint8).reshape(1, 128)
        assert_exact(q.cpu().view(torch.uint8), want, f"{name} ({impl.__module__})")


@pytest.mark.parametrize("fmt", FORMATS)
def test_nan_poisons_its_group_and_inf_zeroes_it(fmt, device):
    x = cases.random_blocks((2, 256), torch.float32, seed=3, spread=2.0)
    x[0, 5], x[1, 200] = math.nan, math.inf
    q, scales = kernel.quantize_fp8(x.to(device), granularity="group", group_size=128, fmt=fmt)
    values, scales = q.float().cpu(), scales.cpu()
    assert scales[0, 0].isnan() and values[0, :128].isnan().all()
    assert scales[1, 1].isinf() and values[1, 200].isnan() and (values[1, 128:].nan_to_num(0) == 0).all()
    assert torch.isfinite(scales[0, 1]) and torch.isfinite(values[0, 128:]).all()


@pytest.mark.parametrize("granularity", ref.GRANULARITIES)
def test_round_trip_error_is_within_half_an_fp8_step(granularity):
    x = cases.random_blocks((16, 256), torch.float32, seed=4, spread=8.0)
    q, scales = ref.quantize_fp8(x, granularity=granularity)
    back = ref.dequantize_fp8(q, scales, granularity=granularity, dtype=torch.float32)
    group = {"tensor": x.numel(), "token": 256, "group": 128}[granularity]
    scale = scales.reshape(-1).repeat_interleave(group).reshape(x.shape)
    # E4M3 keeps 3 mantissa bits: |error| <= 2**-4 relative above the subnormals, 2**-10 * scale below.
    bound = torch.maximum(x.abs() * 2.0**-4, scale * 2.0**-10)
    assert ((back - x).abs() <= bound).all()


def test_opcheck(device):
    x = cases.random_blocks((4, 256), torch.bfloat16, seed=6, spread=4.0).to(device)
    for granularity in ref.GRANULARITIES:
        torch.library.opcheck(
            torch.ops.touchstone.quantize_fp8.default,
            (x, granularity, 128, "e4m3fn", ref.DEFAULT_EPS, granularity == "group", None),
        )


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (dict(granularity="row"), ValueError, "granularity"),
        (dict(fmt="e5m2"), ValueError, "fmt"),
        (dict(group_size=96), ValueError, "group_size"),
        (dict(eps=0.0), ValueError, "eps"),
        (dict(granularity="token", static_scale=torch.ones(1)), ValueError, "static_scale"),
        (dict(granularity="tensor", static_scale=torch.ones(2)), TypeError, "static_scale"),
    ],
)
def test_bad_arguments(kwargs, error, message, device):
    x = torch.zeros(2, 256)
    for impl, dev in ((ref.quantize_fp8, "cpu"), (kernel.quantize_fp8, device)):
        moved = {k: (v.to(dev) if isinstance(v, torch.Tensor) else v) for k, v in kwargs.items()}
        with pytest.raises(error, match=message):
            impl(x.to(dev), **moved)


def test_kernel_rejects_int_input(device):
    with pytest.raises(TypeError, match="x: dtype"):
        kernel.quantize_fp8(torch.zeros(2, 128, dtype=torch.int32, device=device))


def test_shard_of_rows_is_read_without_copy(device):
    x = cases.random_blocks((6, 512), torch.bfloat16, seed=8, spread=4.0)
    check_quantize(x[:, 128:384], device, granularity="group", group_size=128)  # strided rows


# Negative controls: planted bugs in the real kernel that the checks above must catch.
def faulty(fault: str):
    def quantize(
        x, *, granularity="group", group_size=128, fmt="e4m3fn", eps=ref.DEFAULT_EPS, ue8m0=False, static_scale=None
    ):
        return kernel.launch_quantize_fp8(x, granularity, group_size, fmt, eps, ue8m0, static_scale, fault=fault)

    return quantize


def test_negative_control_amax_mask(device):
    x = torch.zeros(1, 128)
    x[0, 127] = 5.0  # the maximum sits in the last lane
    with pytest.raises(AssertionError, match="not bit-exact"):
        check_quantize(x, device, faulty("amax_skips_last_lane"), granularity="group")
    check_quantize(x, device, faulty("none"), granularity="group")


def test_negative_control_ue8m0_rounding(device):
    x = cases.all_bf16_patterns(0).reshape(512, 128)
    with pytest.raises(AssertionError, match="not bit-exact"):
        check_quantize(x, device, faulty("ue8m0_rounds_down"), granularity="group", ue8m0=True)
