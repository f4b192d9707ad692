"""SiLU-and-mul: the Triton kernel against `reference.activation.silu_and_mul` (the mirror within the
"silu_and_mul" LOSSY row, the fp64 ideal for SQNR), its FP8 form bit for bit against the reference quantizer
over the unfused kernel's output, named values, the reference against the eager form the runner used before
(`F.silu(gate) * up`, an ulp apart), opcheck per op, argument checks, a negative control."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from kernels.tolerances import assert_exact, assert_lossy, families, lossy_bound, lossy_metrics, sqnr_db
from reference.activation import silu_and_mul as ref
from reference.quant.fp8 import quantize_fp8

kernel = pytest.importorskip("kernels.silu_and_mul")
DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@st.composite
def problems(draw, inter=None, dtypes=DTYPES):
    """`inter` and `dtypes` narrow the draw where a form needs it (the FP8 form: whole 128-wide groups, 16-bit
    inputs), drawn directly rather than filtered."""
    return dict(
        inter=draw(inter or st.one_of(st.sampled_from([128, 256, 1152, 1408]), st.integers(1, 300))),
        lead=draw(st.lists(st.integers(1, 3), max_size=2)),
        dtype=draw(st.sampled_from(dtypes)),
        scale=draw(st.sampled_from([2.0**-8, 0.25, 1.0, 4.0, 16.0])),
        seed=draw(st.integers(0, 2**31 - 1)),
    )


def make_x(p: dict) -> torch.Tensor:
    g = torch.Generator().manual_seed(p["seed"])
    return (torch.randn(*p["lead"], 2 * p["inter"], generator=g) * p["scale"]).to(p["dtype"])


# The row's SQNR floor sits 6 dB under the mirror's worst over normal outputs; this is that margin.
SQNR_MARGIN_DB = 6.0


def check(x: torch.Tensor, device: str, fn=kernel.silu_and_mul) -> torch.Tensor:
    got = fn(x.to(device)).cpu()
    mirror, ideal = ref.silu_and_mul_mirror(x), ref.silu_and_mul_ideal(x)
    if x.dtype == torch.float16 and x.numel() and float(ideal.abs().max()) < torch.finfo(x.dtype).tiny:
        # Every output subnormal in fp16 (inputs near 2**-8): the format's fixed spacing, 2**-24, bounds what even a
        # correctly rounded result reaches against the fp64 ideal (one element at 1.4e-6 is 35 dB off, the mirror
        # included), so the SQNR floor there is the mirror's own less the row's margin, and the mirror bounds hold.
        bound = lossy_bound(families.SILU_AND_MUL, got.dtype)
        metrics = lossy_metrics(got, mirror, ideal)
        floor = sqnr_db(mirror, ideal) - SQNR_MARGIN_DB
        assert metrics.max_rel <= bound.max_rel and metrics.rms_rel <= bound.rms_rel, f"out (subnormal): {metrics}"
        assert metrics.sqnr_db >= floor, f"out (subnormal): SQNR {metrics.sqnr_db:.1f} dB < {floor:.1f} dB"
        return got
    assert_lossy(families.SILU_AND_MUL, got, mirror, ideal, "out")
    return got


def test_all_subnormal_fp16_outputs_are_held_to_the_mirror():
    """The named case hypothesis found: one fp16 output at 1.4e-6 (subnormal), where the mirror itself is 35.3 dB
    from the ideal. It passes only through the subnormal branch of `check`, which still holds the mirror bounds."""
    x = torch.tensor([-2.9e-3, -9.3e-4], dtype=torch.float16)
    mirror, ideal = ref.silu_and_mul_mirror(x), ref.silu_and_mul_ideal(x)
    assert float(ideal.abs().max()) < torch.finfo(torch.float16).tiny
    assert sqnr_db(mirror, ideal) < lossy_bound(families.SILU_AND_MUL, torch.float16).sqnr_db
    check(x, "cpu", fn=lambda t: mirror.clone())
    with pytest.raises(AssertionError):  # the mirror bounds still bite: one ulp off everywhere is caught
        check(x, "cpu", fn=lambda t: mirror + 2.0**-24)


@given(p=problems())
def test_matches_reference(p, device):
    check(make_x(p), device)


@given(p=problems(inter=st.integers(1, 11).map(lambda groups: 128 * groups), dtypes=DTYPES[:2]))
def test_fp8_form_is_the_quantized_unfused_output(p, device):
    """codes and scales == reference quantize_fp8 (group 128) of the unfused kernel's output, bit for bit."""
    x = make_x(p).to(device)
    codes, scales = kernel.silu_and_mul_fp8(x)
    want_codes, want_scales = quantize_fp8(kernel.silu_and_mul(x).cpu(), granularity="group", group_size=128)
    assert_exact(codes.cpu().view(torch.uint8), want_codes.view(torch.uint8), "codes")
    assert_exact(scales.cpu(), want_scales, "scales")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_named_values(dtype, device):
    """gate 0 -> 0; gate 20 -> 20 * up exactly (1 + exp(-20) is 1 in fp32); up 0 -> 0; NaN gate or up -> NaN;
    gate +Inf -> Inf, gate -Inf -> NaN (the module docstring's edge cases); gate -1 -> the mirror's bits."""
    gate = torch.tensor([0.0, 20.0, 1.0, float("nan"), float("inf"), -float("inf"), 2.0, -1.0])
    up = torch.tensor([3.0, 2.0, 0.0, 1.0, 1.0, 1.0, float("nan"), 4.0])
    x = torch.cat([gate, up]).to(dtype)[None]
    got = kernel.silu_and_mul(x.to(device)).cpu().float()[0]
    assert got[0] == 0 and got[1] == 40.0 and got[2] == 0
    assert got[3].isnan() and got[4] == float("inf") and got[5].isnan() and got[6].isnan()
    assert torch.equal(got[7:], ref.silu_and_mul_mirror(x).float()[0, 7:])  # -1 * sigmoid(-1) * 4 = -1.0758...


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_mirror_is_within_an_ulp_of_the_eager_form(dtype):
    """The runner's eager `F.silu(gate) * up` rounds twice, the mirror once: at most one ulp apart."""
    x = (torch.randn(4, 2 * 512, generator=torch.Generator().manual_seed(3)) * 4).to(dtype)
    gate, up = x.chunk(2, dim=-1)
    eager, mirror = (F.silu(gate) * up).float(), ref.silu_and_mul_mirror(x).float()
    ulp = torch.finfo(dtype).eps * mirror.abs().clamp_min(torch.finfo(dtype).tiny)
    assert ((eager - mirror).abs() <= ulp).all()
    assert (eager != mirror).any()  # the second rounding shows somewhere: the two forms are not the same op


def test_opcheck(device):
    x = make_x(dict(inter=256, lead=[3], dtype=torch.bfloat16, scale=1.0, seed=4)).to(device)
    torch.library.opcheck(torch.ops.touchstone.silu_and_mul.default, (x,))
    torch.library.opcheck(torch.ops.touchstone.silu_and_mul_fp8.default, (x, 128))


@pytest.mark.parametrize(
    ("x", "group_size", "error", "message"),
    [
        (torch.zeros(2, 8, dtype=torch.int32), None, TypeError, "x: must be a bf16, fp16 or fp32 tensor"),
        (torch.zeros(2, 7), None, ValueError, "x: last dimension must be even"),
        (torch.zeros(2, 2 * 96, dtype=torch.bfloat16), 128, ValueError, "group_size: the FP8 form"),
        (torch.zeros(2, 512, dtype=torch.bfloat16), 64, ValueError, "group_size: the FP8 form"),
    ],
)
def test_bad_arguments_name_the_argument(x, group_size, error, message, device):
    with pytest.raises(error, match=message):
        kernel.launch_silu_and_mul(x.to(device), group_size)


def test_negative_control_gate_up_swapped(device):
    """silu(up) * gate is a different function: the row must catch it, and the same data pass unplanted."""
    x = make_x(dict(inter=300, lead=[2], dtype=torch.bfloat16, scale=1.0, seed=5))
    with pytest.raises(AssertionError):
        check(x, device, lambda t: kernel.launch_silu_and_mul(t, fault="gate_up_swapped"))
    check(x, device, lambda t: kernel.launch_silu_and_mul(t, fault="none"))
