"""The SSD chunked scan (reference.mamba.ssd) against the plain per-token recurrence in fp64: any chunk size,
lengths that are not a chunk multiple, initial states, groups, D, z, dt bias and softplus; a scan split in two
with the final state carried over; one token of the scan against the decode-time selective state update."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import reference.mamba.ssd as ssd
from kernels.tolerances import assert_agree, families
from reference.mamba.ssd import segsum, ssd_chunked_scan, ssm_recurrence_sequential
from reference.mamba.state_update import selective_state_update, selective_state_update_ideal


def assert_fp64_agree(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    assert got.dtype == torch.float64, what
    assert_agree(families.SSD_ORDERS, got, want, what)


def draw_inputs(
    seed: int,
    b: int,
    length: int,
    h: int,
    g: int,
    p: int,
    n: int,
    *,
    dtype=torch.float64,
    options: frozenset = frozenset(),
) -> dict:
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype)

    args = dict(
        x=randn(b, length, h, p),
        dt=randn(b, length, h).abs() * 0.5 if "softplus" not in options else randn(b, length, h),
        A=-torch.rand(h, generator=gen, dtype=torch.float64).to(dtype) * 2,
        B=randn(b, length, g, n),
        C=randn(b, length, g, n),
    )
    kwargs = dict(
        D=randn(h) if "D" in options else None,
        z=randn(b, length, h, p) if "z" in options else None,
        dt_bias=randn(h) * 0.5 if "softplus" in options else None,
        dt_softplus="softplus" in options,
        initial_states=randn(b, h, p, n) if "init" in options else None,
    )
    return args, kwargs


shapes = st.tuples(
    st.integers(1, 2),
    st.integers(1, 20),
    st.sampled_from([(1, 1), (2, 1), (2, 2), (4, 2)]),
    st.integers(1, 4),
    st.integers(1, 6),
)
options = st.frozensets(st.sampled_from(["D", "z", "softplus", "init"]))


@given(shape=shapes, chunk=st.integers(1, 8), opts=options, seed=st.integers(0, 2**31 - 1))
def test_chunked_scan_equals_the_sequential_recurrence(shape, chunk, opts, seed):
    b, length, (h, g), p, n = shape
    args, kwargs = draw_inputs(seed, b, length, h, g, p, n, options=opts)
    y, final = ssd_chunked_scan(**args, chunk_size=chunk, **kwargs)
    want_y, want_final = ssm_recurrence_sequential(**args, **kwargs)
    assert_fp64_agree(y, want_y, f"y (chunk {chunk}, l {length})")
    assert_fp64_agree(final, want_final, f"final state (chunk {chunk}, l {length})")


@given(shape=shapes, chunk=st.integers(1, 8), opts=options, seed=st.integers(0, 2**31 - 1), data=st.data())
def test_a_scan_split_in_two_resumes_from_its_final_state(shape, chunk, opts, seed, data):
    b, length, (h, g), p, n = shape
    args, kwargs = draw_inputs(seed, b, length, h, g, p, n, options=opts)
    k = data.draw(st.integers(0, length))
    y, final = ssd_chunked_scan(**args, chunk_size=chunk, **kwargs)

    def part(t, lo, hi):
        return t[:, lo:hi] if t is not None and t.dim() >= 3 else t

    first = {name: part(t, 0, k) for name, t in args.items()}
    second = {name: part(t, k, length) for name, t in args.items()}
    z = kwargs.pop("z")
    init = kwargs.pop("initial_states")
    y1, s1 = ssd_chunked_scan(**first, chunk_size=chunk, z=part(z, 0, k), initial_states=init, **kwargs)
    y2, s2 = ssd_chunked_scan(**second, chunk_size=chunk, z=part(z, k, length), initial_states=s1, **kwargs)
    assert_fp64_agree(torch.cat([y1, y2], dim=1), y, f"y split at {k}")
    assert_fp64_agree(s2, final, f"final state split at {k}")


@given(shape=shapes, opts=options, seed=st.integers(0, 2**31 - 1), chunk=st.integers(1, 4))
def test_one_token_of_the_scan_is_the_selective_state_update(shape, opts, seed, chunk):
    """Prefill and decode agree: the scan over one token from a state equals the decode reference's update of
    that state (both in fp64: the decode reference's fp64 twin on fp32 inputs, the scan on the same values)."""
    b, _, (h, g), p, n = shape
    args, kwargs = draw_inputs(seed, b, 1, h, g, p, n, dtype=torch.float32, options=opts | {"init"})
    state = kwargs.pop("initial_states")
    decode = dict(
        x=args["x"][:, 0],
        dt=args["dt"][:, 0],
        A=args["A"],
        B=args["B"][:, 0],
        C=args["C"][:, 0],
        D=kwargs["D"],
        z=None if kwargs["z"] is None else kwargs["z"][:, 0],
        dt_bias=kwargs["dt_bias"],
        dt_softplus=kwargs["dt_softplus"],
    )
    want_state, want_out = selective_state_update_ideal(state, **decode)
    f64 = {name: t.double() for name, t in args.items()}
    kw64 = {name: t.double() if isinstance(t, torch.Tensor) else t for name, t in kwargs.items()}
    y, final = ssd_chunked_scan(**f64, chunk_size=chunk, initial_states=state.double(), **kw64)
    assert_fp64_agree(y[:, 0], want_out, "out")
    assert_fp64_agree(final, want_state, "state")
    # and the fp32 paths agree to fp32 rounding: same state, same out up to a few ulps of the largest value
    state32 = state.clone()
    out32 = selective_state_update(state32, **decode)
    y32, final32 = ssd_chunked_scan(**args, chunk_size=chunk, initial_states=state, **kwargs)
    assert y32.dtype == final32.dtype == torch.float32
    assert_agree(families.SSD_ORDERS, y32[:, 0], out32, "fp32 out")
    assert_agree(families.SSD_ORDERS, final32, state32, "fp32 state")


def test_named_two_token_case():
    """h = p = n = 1, dt = 1, A = -ln 2 (decay 1/2), B = 1, C = 2, D = 0.5, x = (1, 3), initial state 4:
    S1 = 4/2 + 1 = 3, y1 = 6 + 0.5 = 6.5; S2 = 3/2 + 3 = 4.5, y2 = 9 + 1.5 = 10.5."""
    f = torch.float64
    x = torch.tensor([1.0, 3.0], dtype=f).view(1, 2, 1, 1)
    args = dict(
        x=x,
        dt=torch.ones(1, 2, 1, dtype=f),
        A=torch.tensor([-torch.log(torch.tensor(2.0, dtype=f))]),
        B=torch.ones(1, 2, 1, 1, dtype=f),
        C=torch.full((1, 2, 1, 1), 2.0, dtype=f),
    )
    kwargs = dict(D=torch.tensor([0.5], dtype=f), initial_states=torch.full((1, 1, 1, 1), 4.0, dtype=f))
    want_y = torch.tensor([6.5, 10.5], dtype=f).view(1, 2, 1, 1)
    for chunk in (1, 2, 3):
        y, final = ssd_chunked_scan(**args, chunk_size=chunk, **kwargs)
        assert_fp64_agree(y, want_y, f"y, chunk {chunk}")
        assert_fp64_agree(final, torch.full((1, 1, 1, 1), 4.5, dtype=f), f"state, chunk {chunk}")
    y, final = ssm_recurrence_sequential(**args, **kwargs)
    assert_fp64_agree(y, want_y, "sequential y")


def test_zero_dt_leaves_the_state_alone():
    args, kwargs = draw_inputs(7, 1, 5, 2, 1, 3, 4, options=frozenset({"init", "D"}))
    args["dt"] = torch.zeros_like(args["dt"])
    _, final = ssd_chunked_scan(**args, chunk_size=2, **kwargs)
    assert torch.equal(final, kwargs["initial_states"])  # exp(0) = 1 exactly, and nothing is added


def test_segsum_named_case():
    inf = float("inf")
    want = torch.tensor([[0.0, -inf, -inf], [2.0, 0.0, -inf], [5.0, 3.0, 0.0]], dtype=torch.float64)
    assert torch.equal(segsum(torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)), want)


def test_negative_control_an_off_by_one_segment_sum_is_caught(monkeypatch):
    """Planted bug: the segment sum includes its first element (a_j + ... + a_i), decaying every intra-chunk
    contribution once too often. The agreement check must fail."""
    args, kwargs = draw_inputs(3, 1, 9, 2, 1, 2, 3, options=frozenset({"init"}))
    want_y, _ = ssm_recurrence_sequential(**args, **kwargs)
    y, _ = ssd_chunked_scan(**args, chunk_size=4, **kwargs)
    assert_fp64_agree(y, want_y, "y without the fault")
    right = ssd.segsum
    monkeypatch.setattr(ssd, "segsum", lambda a: right(a) + a[..., None, :])  # [i, j] gains a[j]
    faulty, _ = ssd_chunked_scan(**args, chunk_size=4, **kwargs)
    with pytest.raises(AssertionError, match="y with the fault"):
        assert_fp64_agree(faulty, want_y, "y with the fault")


@pytest.mark.parametrize(
    ("change", "error", "name"),
    [
        (dict(x=torch.zeros(1, 4, 2)), ValueError, "x"),
        (dict(dt=torch.zeros(1, 4)), ValueError, "dt"),
        (dict(A=torch.zeros(3)), ValueError, "A"),
        (dict(B=torch.zeros(1, 4, 3, 2)), ValueError, "B"),
        (dict(C=torch.zeros(1, 4, 1, 3)), ValueError, "C"),
        (dict(D=torch.zeros(3)), ValueError, "D"),
        (dict(z=torch.zeros(1, 4, 2, 2)), ValueError, "z"),
        (dict(dt_bias=torch.zeros(2, dtype=torch.int64)), TypeError, "dt_bias"),
        (dict(initial_states=torch.zeros(1, 2, 3, 3)), ValueError, "initial_states"),
        (dict(chunk_size=0), ValueError, "chunk_size"),
    ],
)
def test_bad_arguments_name_the_argument(change, error, name):
    good = dict(
        x=torch.zeros(1, 4, 2, 3),
        dt=torch.zeros(1, 4, 2),
        A=torch.zeros(2),
        B=torch.zeros(1, 4, 1, 2),
        C=torch.zeros(1, 4, 1, 2),
        chunk_size=2,
    )
    with pytest.raises(error, match=name):
        ssd_chunked_scan(**(good | change))
