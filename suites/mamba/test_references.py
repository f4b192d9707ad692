"""The Mamba decode references against independent formulations: causal_conv1d against torch's depthwise
conv1d on integer-valued data (exact in any order), the decode update against the prefill conv on one token,
the selective state update's fp64 ideal against mamba_ssm's einsum formulation (state-spaces/mamba
`selective_state_update_ref`) with torch's softplus/silu, and the mirror against the ideal."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from kernels.tolerances import assert_exact, families, lossy_bound, sqnr_db
from reference.mamba import conv1d as conv
from reference.mamba import state_update as ssu
from suites.mamba import state_update_cases as cases


@given(
    batch=st.integers(1, 3),
    length=st.integers(1, 6),
    dim=st.integers(1, 6),
    width=st.integers(2, 4),
    has_bias=st.booleans(),
    has_init=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_causal_conv1d_is_the_depthwise_conv(batch, length, dim, width, has_bias, has_init, seed):
    """Small integers: every product and partial sum is exact in fp32, so any summation order agrees."""
    gen = torch.Generator().manual_seed(seed)

    def ints(*shape):
        return torch.randint(-8, 9, shape, generator=gen).to(torch.float32)

    x, weight = ints(batch, length, dim), ints(dim, width)
    bias = ints(dim) if has_bias else None
    init = ints(batch, width - 1, dim) if has_init else None
    out, final = conv.causal_conv1d(x, weight, bias, init)
    pad = init if has_init else torch.zeros(batch, width - 1, dim)
    xpad = torch.cat([pad, x], dim=1)
    want = F.conv1d(xpad.transpose(1, 2), weight[:, None, :], bias, groups=dim).transpose(1, 2)
    assert_exact(out, want.contiguous(), "causal_conv1d")
    assert_exact(final, xpad[:, -(width - 1) :].contiguous(), "final_state")


@given(
    dtype=st.sampled_from(conv.DTYPES),
    state_dtype=st.sampled_from(conv.DTYPES),
    width=st.integers(2, 4),
    activation=st.sampled_from(conv.ACTIVATIONS),
    seed=st.integers(0, 2**31 - 1),
)
def test_update_is_the_prefill_conv_on_one_token(dtype, state_dtype, width, activation, seed):
    gen = torch.Generator().manual_seed(seed)
    batch, dim, slots = 3, 5, 5
    x = torch.randn((batch, dim), generator=gen).to(dtype)
    state = torch.randn((slots, width - 1, dim), generator=gen).to(state_dtype)
    weight, bias = torch.randn((dim, width), generator=gen), torch.randn((dim,), generator=gen)
    indices = torch.tensor([4, -1, 1])
    before = state.clone()
    out = conv.causal_conv1d_update(x, state, weight, bias, activation, indices)
    for i, s in ((0, 4), (2, 1)):
        want, final = conv.causal_conv1d(x[i : i + 1, None], weight, bias, before[s : s + 1], activation)
        assert_exact(out[i], want[0, 0], f"out of request {i}")
        assert_exact(state[s], final[0], f"slot {s}")
    assert_exact(out[1], torch.zeros_like(out[1]), "pad row")
    assert_exact(state[[0, 2, 3]], before[[0, 2, 3]], "slots no request names")


def test_final_state_of_a_short_prefill_keeps_the_initial_tail():
    init = torch.arange(12, dtype=torch.float32).reshape(1, 3, 4)
    x = torch.full((1, 1, 4), -1.0)
    _, final = conv.causal_conv1d(x, torch.ones(4, 4), initial_state=init)
    assert_exact(final, torch.cat([init[:, 1:], x], dim=1))


def _mamba_ssm_formula(case: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """selective_state_update_ref's einsum formulation, per-head parameters broadcast, in fp64."""
    f64 = {
        k: (v.to(torch.float64) if isinstance(v, torch.Tensor) and v.is_floating_point() else v)
        for k, v in case.items()
    }
    state = f64["state"].clone()
    batch, heads = f64["x"].shape[:2]
    slots = torch.arange(batch) if case["state_indices"] is None else case["state_indices"].long()
    keep = slots != -1
    req, slot = torch.arange(batch)[keep], slots[keep]
    dt = f64["dt"][req] + (f64["dt_bias"] if f64["dt_bias"] is not None else 0.0)
    if f64["dt_softplus"]:
        dt = F.softplus(dt)
    rep = heads // f64["B"].shape[1]
    B = f64["B"][req].repeat_interleave(rep, 1)
    C = f64["C"][req].repeat_interleave(rep, 1)
    x = f64["x"][req]
    dA = torch.exp(dt[..., None, None] * f64["A"][None, :, None, None])
    new = state[slot] * dA + (dt[..., None, None] * B[:, :, None, :]) * x[..., None]
    state[slot] = new
    out = torch.zeros(f64["x"].shape, dtype=torch.float64)
    o = torch.einsum("bhdn,bhn->bhd", new, C)
    if f64["D"] is not None:
        o = o + x * f64["D"][:, None]
    if f64["z"] is not None:
        o = o * F.silu(f64["z"][req])
    out[req] = o
    return state, out


@given(p=cases.problems())
def test_ideal_is_mamba_ssm_formula(p):
    case = cases.make_case(p)
    want_state, want_out = _mamba_ssm_formula(case)
    state, out = ssu.selective_state_update_ideal(**case)
    torch.testing.assert_close(state, want_state, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(out, want_out, rtol=1e-12, atol=1e-12)


@given(p=cases.problems())
def test_mirror_is_near_the_ideal(p):
    """The mirror rounds like the kernels (fp32 math, one rounding of state and out): its SQNR against the
    fp64 ideal stays above the tolerance rows' floors, so those floors test the kernels, not the mirror."""
    case = cases.make_case(p)
    state, out = cases.run(ssu.selective_state_update, case, "cpu")
    ideal_state, ideal_out = ssu.selective_state_update_ideal(**case)
    assert sqnr_db(out, ideal_out) >= lossy_bound(families.MAMBA_STATE_UPDATE_OUT, out.dtype).sqnr_db
    assert sqnr_db(state, ideal_state) >= lossy_bound(families.MAMBA_STATE_UPDATE_STATE, state.dtype).sqnr_db
