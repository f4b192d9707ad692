"""Selective state update (Mamba2 decode): the Triton kernel against `reference.mamba.state_update` over drawn
heads, head dims, d_state, groups, state/input dtypes and slot tables with pads and permutations (out and
state lossy per kernels.tolerances, slots no request names bit for bit); named cases (dt = 0, A = 0, NaN
isolation, pad slots inside the pool); argument errors; one opcheck; a negative control."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given

from kernels.tolerances import assert_exact
from reference.mamba import state_update as ref
from suites.mamba import state_update_cases as cases

kernel = pytest.importorskip("kernels.mamba_state_update")


def named_problem(**changes) -> dict:
    p = dict(
        nheads=4,
        ngroups=2,
        head_dim=8,
        dstate=16,
        batch=4,
        n_pad=1,
        spare_slots=2,
        state_dtype=torch.float32,
        x_dtype=torch.bfloat16,
        index_dtype=torch.int32,
        has_D=True,
        has_z=True,
        has_dt_bias=False,
        dt_softplus=False,
        seed=7,
    )
    p.update(changes)
    return p


@given(p=cases.problems())
def test_state_update_matches_reference(p, device):
    cases.check_state_update(kernel.selective_state_update, cases.make_case(p), device)


@pytest.mark.parametrize("state_dtype", ref.STATE_DTYPES)
def test_dt_zero_leaves_the_state_unchanged(state_dtype, device):
    """dt = 0, no bias, no softplus: dA = exp(0) = 1 and dB = 0, so every updated slot keeps its bytes (the drawn
    state has no zeros, whose sign x * 0 could flip) and out = C . state + D x."""
    case = cases.make_case(named_problem(state_dtype=state_dtype))
    case["dt"] = torch.zeros_like(case["dt"])
    state, _ = cases.run(kernel.selective_state_update, case, device)
    assert_exact(state, case["state"], "state after a dt = 0 step")
    cases.check_state_update(kernel.selective_state_update, case, device)


def test_a_zero_state_is_exact(device):
    """A = 0: dA = exp(0) = 1 exactly on every implementation, so without softplus the new fp32 state is
    state * 1 + (dt * B) * x in IEEE, bit for bit with the mirror (the kernel keeps products and sums unfused)."""
    case = cases.make_case(named_problem())
    case["A"] = torch.zeros_like(case["A"])
    state, _ = cases.run(kernel.selective_state_update, case, device)
    want, _ = cases.run(ref.selective_state_update, case, "cpu")
    assert_exact(state, want, "state with A = 0")


def test_nan_in_one_request_stays_in_its_slot(device):
    """A NaN in x[r, h, p] poisons row p of head h in request r's slot and out[r, h, p]; every other slot and
    out row is bit-identical to the run without it."""
    case = cases.make_case(named_problem(n_pad=0, has_z=False))
    clean_state, clean_out = cases.run(kernel.selective_state_update, case, device)
    r, h, p = 2, 1, 3
    case["x"][r, h, p] = float("nan")
    state, out = cases.run(kernel.selective_state_update, case, device)
    slot = int(case["state_indices"][r])
    poisoned = torch.zeros(state.shape, dtype=torch.bool)
    poisoned[slot, h, p] = True
    assert state[poisoned].isnan().all(), "the poisoned state row is not NaN"
    assert_exact(state[~poisoned], clean_state[~poisoned], "state outside the poisoned row")
    assert out[r, h, p].isnan(), "the poisoned out element is not NaN"
    mask = torch.ones(out.shape, dtype=torch.bool)
    mask[r, h, p] = False
    assert_exact(out[mask], clean_out[mask], "out outside the poisoned element")


@pytest.mark.parametrize("state_dtype", ref.STATE_DTYPES)
def test_pad_slot_inside_the_pool_keeps_its_bytes(state_dtype, device):
    """pad_slot_id = 3, a real slot: requests naming it are skipped, so slot 3 (filled with NaN payloads that
    any read-modify-write would canonicalise) keeps its bytes and those requests' out rows are 0."""
    case = cases.make_case(named_problem(state_dtype=state_dtype, n_pad=0, spare_slots=2))
    case["state_indices"] = torch.tensor([3, 0, 3, 5], dtype=torch.int32)
    bits = case["state"].view(torch.int32 if state_dtype == torch.float32 else torch.int16)
    bits[3] = 0x7FC01234 if state_dtype == torch.float32 else 0x7FC1
    cases.check_state_update(kernel.selective_state_update, case, device, pad_slot_id=3)
    state, out = cases.run(kernel.selective_state_update, case, device, pad_slot_id=3)
    assert_exact(state[3], case["state"][3], "the pad slot")
    assert_exact(out[[0, 2]], torch.zeros_like(out[[0, 2]]), "out rows of pad entries")


def test_every_request_padded_writes_zeros_only(device):
    case = cases.make_case(named_problem())
    case["state_indices"] = torch.full((4,), -1, dtype=torch.int32)
    state, out = cases.run(kernel.selective_state_update, case, device)
    assert_exact(state, case["state"], "state with every request padded")
    assert_exact(out, torch.zeros_like(out), "out with every request padded")


def test_opcheck(device):
    case = cases.make_case(named_problem(has_dt_bias=True, dt_softplus=True))
    moved = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in case.items()}
    torch.library.opcheck(
        torch.ops.touchstone.selective_state_update.default,
        (
            moved["state"],
            moved["x"],
            moved["dt"],
            moved["A"],
            moved["B"],
            moved["C"],
            moved["D"],
            moved["z"],
            moved["dt_bias"],
            True,
            moved["state_indices"],
            -1,
        ),
    )


def _bad(name: str):
    case = cases.make_case(named_problem())
    if name == "state":
        case["state"] = case["state"].to(torch.float16)
    elif name == "x":
        case["x"] = case["x"][:, :, :4]
    elif name == "dt":
        case["dt"] = case["dt"][:, None]
    elif name == "B":
        case["B"] = torch.zeros(4, 3, 16)  # 3 groups do not divide 4 heads
    elif name == "C":
        case["C"] = case["C"].to(torch.int32)
    elif name == "state_indices":
        case["state_indices"] = case["state_indices"].float()
    return case


@pytest.mark.parametrize(
    "name, error",
    [
        ("state", TypeError),
        ("x", ValueError),
        ("dt", ValueError),
        ("B", ValueError),
        ("C", TypeError),
        ("state_indices", TypeError),
    ],
)
def test_bad_arguments_name_the_argument(name, error, device):
    with pytest.raises(error, match=f"^{name}:"):
        cases.run(kernel.selective_state_update, _bad(name), device)


def test_reference_refuses_bad_slot_values():
    case = cases.make_case(named_problem())
    for indices, what in (([0, 1, 1, 2], "twice"), ([0, 1, 9, 2], "outside")):
        case["state_indices"] = torch.tensor(indices, dtype=torch.int32)
        with pytest.raises(ValueError, match=f"^state_indices:.*{what}"):
            cases.run(ref.selective_state_update, case, "cpu")


def test_negative_control_slot_is_row(device):
    """The planted bug updates slot i for request i, ignoring state_indices: the suite's check must fail on a
    permuted slot table, and pass with the sound kernel."""
    case = cases.make_case(named_problem(n_pad=1))
    case["state_indices"] = torch.tensor([4, -1, 0, 2], dtype=torch.int32)

    def launch(fault):
        return lambda state, **kw: kernel.launch_selective_state_update(state, **kw, fault=fault)

    cases.check_state_update(launch("none"), case, device)
    with pytest.raises(AssertionError):
        cases.check_state_update(launch("slot_is_row"), case, device)
