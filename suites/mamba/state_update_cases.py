"""Drawn problems of the selective state update and the check every suite test (and the negative control)
runs: the kernel's new state and out against the fp32 mirror (lossy rows) and the fp64 ideal (SQNR), and every
slot that no request updates bit-identical to its old bytes."""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from kernels.tolerances import assert_exact, assert_lossy, families
from reference.mamba import state_update as ref

INPUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@st.composite
def problems(draw) -> dict:
    nheads = draw(st.sampled_from([1, 2, 4]))
    batch = draw(st.integers(1, 4))
    n_pad = draw(st.integers(0, batch - 1)) if batch > 1 else 0
    return dict(
        nheads=nheads,
        ngroups=draw(st.sampled_from([g for g in (1, 2, 4) if nheads % g == 0])),
        head_dim=draw(st.sampled_from([1, 4, 8, 12, 16])),
        dstate=draw(st.sampled_from([1, 8, 16, 24, 32])),
        batch=batch,
        n_pad=n_pad,
        spare_slots=draw(st.integers(0, 3)),
        state_dtype=draw(st.sampled_from(ref.STATE_DTYPES)),
        x_dtype=draw(st.sampled_from(INPUT_DTYPES)),
        index_dtype=draw(st.sampled_from([None, torch.int32, torch.int64])),
        has_D=draw(st.booleans()),
        has_z=draw(st.booleans()),
        has_dt_bias=draw(st.booleans()),
        dt_softplus=draw(st.booleans()),
        seed=draw(st.integers(0, 2**31 - 1)),
    )


def make_case(p: dict) -> dict:
    """Tensors of a drawn problem (CPU): Mamba2-like magnitudes (A = -exp(randn), dt + dt_bias >= 0 unless
    softplus makes it so), slots a random permutation of the pool with pad entries (-1) among the requests."""
    gen = torch.Generator().manual_seed(p["seed"])
    batch, heads, dim, n, groups = p["batch"], p["nheads"], p["head_dim"], p["dstate"], p["ngroups"]
    xd = p["x_dtype"]

    def randn(*shape, dtype=torch.float32, scale=1.0):
        return (torch.randn(shape, generator=gen) * scale).to(dtype)

    num_slots = batch + p["spare_slots"]
    if p["index_dtype"] is None:
        indices = None
    else:
        slots = torch.randperm(num_slots, generator=gen)[:batch]
        pads = torch.randperm(batch, generator=gen)[: p["n_pad"]]
        slots[pads] = -1
        indices = slots.to(p["index_dtype"])
    # dt >= 0 without softplus (a negative step would grow the state: exp(dt A) > 1, fp16 out overflows)
    dt = randn(batch, heads) if p["dt_softplus"] else torch.rand((batch, heads), generator=gen) * 0.5
    dt_bias = randn(heads, scale=0.5) if p["dt_softplus"] else torch.rand((heads,), generator=gen) * 0.5
    return dict(
        state=randn(num_slots, heads, dim, n, dtype=p["state_dtype"]),
        x=randn(batch, heads, dim, dtype=xd),
        dt=dt.to(xd),
        A=-torch.exp(randn(heads)),
        B=randn(batch, groups, n, dtype=xd),
        C=randn(batch, groups, n, dtype=xd),
        D=randn(heads) if p["has_D"] else None,
        z=randn(batch, heads, dim, dtype=xd) if p["has_z"] else None,
        dt_bias=dt_bias if p["has_dt_bias"] else None,
        dt_softplus=p["dt_softplus"],
        state_indices=indices,
    )


def untouched_slots(case: dict, pad_slot_id: int = -1) -> list[int]:
    num_slots, batch = case["state"].shape[0], case["x"].shape[0]
    if case["state_indices"] is None:
        return list(range(batch, num_slots))
    used = {int(s) for s in case["state_indices"].tolist() if int(s) != pad_slot_id}
    return [s for s in range(num_slots) if s not in used]


def pad_rows(case: dict, pad_slot_id: int = -1) -> list[int]:
    indices = case["state_indices"]
    return [] if indices is None else [i for i, s in enumerate(indices.tolist()) if int(s) == pad_slot_id]


def run(update, case: dict, device: str, pad_slot_id: int = -1) -> tuple[torch.Tensor, torch.Tensor]:
    """(state after, out) of `update` (kernel or reference signature) on a copy of the case, on `device`."""
    moved = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in case.items()}
    state = moved.pop("state").clone()
    out = update(state, **moved, pad_slot_id=pad_slot_id)
    return state.cpu(), out.cpu()


def check_state_update(update, case: dict, device: str, pad_slot_id: int = -1) -> None:
    """`update` against the mirror and the ideal: out and the updated slots lossy, the rest bit for bit."""
    state, out = run(update, case, device, pad_slot_id)
    want_state, want_out = run(ref.selective_state_update, case, "cpu", pad_slot_id)
    ideal_state, ideal_out = ref.selective_state_update_ideal(**case, pad_slot_id=pad_slot_id)
    kept = untouched_slots(case, pad_slot_id)
    assert_exact(state[kept], case["state"][kept], f"slots {kept} that no request updates")
    pads = pad_rows(case, pad_slot_id)
    assert_exact(out[pads], torch.zeros_like(out[pads]), f"out rows {pads} of pad entries")
    updated = [s for s in range(state.shape[0]) if s not in kept]
    assert_lossy(
        families.MAMBA_STATE_UPDATE_STATE,
        state[updated],
        want_state[updated],
        ideal_state[updated],
        "updated state slots",
    )
    assert_lossy(families.MAMBA_STATE_UPDATE_OUT, out, want_out, ideal_out, "out")
