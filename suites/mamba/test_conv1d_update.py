"""Causal conv1d decode update: the Triton kernel against `reference.mamba.conv1d.causal_conv1d_update` over
drawn dims, widths, dtypes, bias, activation and slot tables with pads and permutations: the whole conv state
bit for bit (rolled rows are copies), out bit for bit without activation and lossy (kernels.tolerances) with
SiLU; a run of decode steps equal to the prefill conv; pad slots inside the pool; errors; one opcheck; a
negative control."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kernels.tolerances import assert_exact, assert_lossy, families
from reference.mamba import conv1d as ref

kernel = pytest.importorskip("kernels.mamba_conv1d_update")
FAMILY = families.MAMBA_CONV1D_UPDATE


@st.composite
def problems(draw) -> dict:
    batch = draw(st.integers(1, 4))
    return dict(
        dim=draw(st.sampled_from([1, 5, 16, 33])),
        width=draw(st.integers(2, 4)),
        batch=batch,
        n_pad=draw(st.integers(0, batch - 1)),
        spare_slots=draw(st.integers(0, 3)),
        x_dtype=draw(st.sampled_from(ref.DTYPES)),
        state_dtype=draw(st.sampled_from(ref.DTYPES)),
        fp32_weight=draw(st.booleans()),
        has_bias=draw(st.booleans()),
        activation=draw(st.sampled_from(ref.ACTIVATIONS)),
        index_dtype=draw(st.sampled_from([None, torch.int32, torch.int64])),
        seed=draw(st.integers(0, 2**31 - 1)),
    )


def make_case(p: dict) -> dict:
    gen = torch.Generator().manual_seed(p["seed"])
    batch, dim, width = p["batch"], p["dim"], p["width"]
    num_slots = batch + p["spare_slots"]
    w_dtype = torch.float32 if p["fp32_weight"] else p["x_dtype"]
    if p["index_dtype"] is None:
        indices = None
    else:
        slots = torch.randperm(num_slots, generator=gen)[:batch]
        slots[torch.randperm(batch, generator=gen)[: p["n_pad"]]] = -1
        indices = slots.to(p["index_dtype"])
    return dict(
        x=torch.randn((batch, dim), generator=gen).to(p["x_dtype"]),
        conv_state=torch.randn((num_slots, width - 1, dim), generator=gen).to(p["state_dtype"]),
        weight=(torch.randn((dim, width), generator=gen) / width**0.5).to(w_dtype),
        bias=torch.randn((dim,), generator=gen).to(w_dtype) if p["has_bias"] else None,
        activation=p["activation"],
        state_indices=indices,
    )


def run(update, case: dict, device: str, pad_slot_id: int = -1) -> tuple[torch.Tensor, torch.Tensor]:
    moved = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in case.items()}
    moved["conv_state"] = moved["conv_state"].clone()
    out = update(**moved, pad_slot_id=pad_slot_id)
    return moved["conv_state"].cpu(), out.cpu()


def ideal_out(case: dict, pad_slot_id: int = -1) -> torch.Tensor:
    """fp64 out: causal_conv1d_ideal of each request's token on its slot's old state (pad rows 0)."""
    batch = case["x"].shape[0]
    indices = case["state_indices"]
    slots = list(range(batch)) if indices is None else [int(s) for s in indices.tolist()]
    out = torch.zeros(case["x"].shape, dtype=torch.float64)
    for i, s in enumerate(slots):
        if s != pad_slot_id:
            out[i] = ref.causal_conv1d_ideal(
                case["x"][i : i + 1, None],
                case["weight"],
                case["bias"],
                case["conv_state"][s : s + 1],
                case["activation"],
            )[0, 0]
    return out


def check_update(update, case: dict, device: str, pad_slot_id: int = -1) -> None:
    state, out = run(update, case, device, pad_slot_id)
    want_state, want_out = run(ref.causal_conv1d_update, case, "cpu", pad_slot_id)
    assert_exact(state, want_state, "conv_state (every slot)")
    if case["activation"] is None:
        assert_exact(out, want_out, "out")
    else:
        assert_lossy(FAMILY, out, want_out, ideal_out(case, pad_slot_id), "out")


def named_case(**changes) -> dict:
    p = dict(
        dim=16,
        width=4,
        batch=4,
        n_pad=1,
        spare_slots=2,
        x_dtype=torch.bfloat16,
        state_dtype=torch.bfloat16,
        fp32_weight=False,
        has_bias=True,
        activation="silu",
        index_dtype=torch.int32,
        seed=3,
    )
    p.update(changes)
    return make_case(p)


@given(p=problems())
def test_conv1d_update_matches_reference(p, device):
    check_update(kernel.causal_conv1d_update, make_case(p), device)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_steps_equal_the_prefill_conv(dtype, device):
    """Six kernel decode steps from an initial state give, bit for bit, causal_conv1d's outputs over the six
    tokens and its final state (no activation: the kernel is exact there)."""
    gen = torch.Generator().manual_seed(11)
    batch, length, dim, width = 2, 6, 8, 4
    x = torch.randn((batch, length, dim), generator=gen).to(dtype)
    init = torch.randn((batch, width - 1, dim), generator=gen).to(dtype)
    weight, bias = torch.randn((dim, width), generator=gen).to(dtype), torch.randn((dim,), generator=gen).to(dtype)
    want, final = ref.causal_conv1d(x, weight, bias, init)
    state = init.clone().to(device)
    outs = [
        kernel.causal_conv1d_update(x[:, t].to(device), state, weight.to(device), bias.to(device)).cpu()
        for t in range(length)
    ]
    assert_exact(torch.stack(outs, dim=1), want, "decode outputs")
    assert_exact(state.cpu(), final, "state after the decode steps")


def test_pad_slot_inside_the_pool_keeps_its_bytes(device):
    """pad_slot_id = 2, a real slot: requests naming it are skipped; slot 2 holds NaN payloads that any
    read-modify-write would canonicalise, and must keep them."""
    case = named_case(n_pad=0)
    case["state_indices"] = torch.tensor([2, 0, 5, 2], dtype=torch.int32)
    case["conv_state"].view(torch.int16)[2] = 0x7FC1
    check_update(kernel.causal_conv1d_update, case, device, pad_slot_id=2)
    state, out = run(kernel.causal_conv1d_update, case, device, pad_slot_id=2)
    assert_exact(state[2], case["conv_state"][2], "the pad slot")
    assert_exact(out[[0, 3]], torch.zeros_like(out[[0, 3]]), "out rows of pad entries")


def test_opcheck(device):
    case = named_case()
    torch.library.opcheck(
        torch.ops.touchstone.causal_conv1d_update.default,
        (
            case["x"].to(device),
            case["conv_state"].to(device),
            case["weight"].to(device),
            case["bias"].to(device),
            "silu",
            case["state_indices"].to(device),
            -1,
        ),
    )


@pytest.mark.parametrize(
    "name, change, error",
    [
        ("x", lambda c: c.update(x=c["x"][:, None]), ValueError),
        ("conv_state", lambda c: c.update(conv_state=c["conv_state"][:, 1:]), ValueError),
        ("weight", lambda c: c.update(weight=c["weight"][:, :1]), ValueError),
        ("bias", lambda c: c.update(bias=c["bias"].to(torch.int32)), TypeError),
        ("activation", lambda c: c.update(activation="relu"), ValueError),
        ("state_indices", lambda c: c.update(state_indices=c["state_indices"][:2]), ValueError),
    ],
)
def test_bad_arguments_name_the_argument(name, change, error, device):
    case = named_case()
    change(case)
    with pytest.raises(error, match=f"^{name}:"):
        run(kernel.causal_conv1d_update, case, device)


def test_negative_control_slot_is_row(device):
    """The planted bug updates slot i for request i: the suite's check must fail on a permuted slot table and
    pass with the sound kernel."""
    case = named_case(activation=None)
    case["state_indices"] = torch.tensor([4, -1, 0, 2], dtype=torch.int32)

    def launch(fault):
        return lambda **kw: kernel.launch_causal_conv1d_update(**kw, fault=fault)

    check_update(launch("none"), case, device)
    with pytest.raises(AssertionError):
        check_update(launch("slot_is_row"), case, device)
