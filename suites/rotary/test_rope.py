"""RoPE (rotate-half): the in-place Triton kernel against `reference.rotary.rope.apply_rope` (bit-exact: both
compute in fp32 and round once), on strided q/k views into a fused qkv buffer whose v part and row padding
must stay untouched; the reference against transformers' Llama RoPE (fp32, bit for bit); named cases
with expected values; opcheck; a negative control (GPT-J pairing)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kernels.tolerances import assert_exact
from reference.rotary import rope as ref

kernel = pytest.importorskip("kernels.rope")
BASE = 10000.0
MAX_POSITIONS = 4096
CACHES: dict[int, torch.Tensor] = {}


def cache(head_dim: int) -> torch.Tensor:
    if head_dim not in CACHES:
        CACHES[head_dim] = ref.rope_cos_sin_cache(head_dim, BASE, MAX_POSITIONS)
    return CACHES[head_dim]


@st.composite
def problems(draw):
    return dict(
        tokens=draw(st.one_of(st.just(1), st.integers(2, 40))),
        heads=draw(st.sampled_from([(9, 3), (4, 1), (2, 2), (8, 2), (6, 3), (1, 1)])),
        head_dim=draw(st.sampled_from([64, 128, 32, 80])),
        dtype=draw(st.sampled_from(ref.DTYPES)),
        seed=draw(st.integers(0, 2**31 - 1)),
        pad=draw(st.sampled_from([0, 8])),  # extra columns at the end of each fused row
        strided_positions=draw(st.booleans()),
    )


def make_problem(p: dict):
    """A fused qkv buffer [T, (Hq + 2 Hkv) D + pad] and q, k views into it, positions with 0 and the table's last
    row in them."""
    g = torch.Generator().manual_seed(p["seed"])
    (hq, hkv), d, t = p["heads"], p["head_dim"], p["tokens"]
    qkv = (torch.randn(t, (hq + 2 * hkv) * d + p["pad"], generator=g) * 4).to(p["dtype"])
    positions = torch.randint(0, MAX_POSITIONS, (2 * t,), generator=g)
    positions[0], positions[-2] = 0, MAX_POSITIONS - 1
    positions = positions[::2] if p["strided_positions"] else positions[:t].clone()
    return qkv, positions


def views(qkv: torch.Tensor, p: dict) -> tuple[torch.Tensor, torch.Tensor]:
    (hq, hkv), d = p["heads"], p["head_dim"]
    t = qkv.shape[0]
    return qkv[:, : hq * d].view(t, hq, d), qkv[:, hq * d : (hq + hkv) * d].view(t, hkv, d)


def check_rope(qkv, positions, p, device, rope=kernel.rope_) -> None:
    q, k = views(qkv, p)
    want_q, want_k = ref.apply_rope(q, k, positions, cache(p["head_dim"]))
    want = qkv.clone()
    wq, wk = views(want, p)
    wq.copy_(want_q)
    wk.copy_(want_k)
    buf = qkv.to(device)
    rope(*views(buf, p), positions.to(device), cache(p["head_dim"]).to(device))
    got_q, got_k = views(buf.cpu(), p)
    assert_exact(got_q, want_q, "q")
    assert_exact(got_k, want_k, "k")
    assert_exact(buf.cpu(), want, "fused buffer (v part and padding must be unchanged)")


@given(p=problems())
def test_rope_matches_reference(p, device):
    check_rope(*make_problem(p), p, device)


def _hf_llama_rope(head_dim: int):
    """transformers' own Llama rotary embedding (an independent implementation of the same spec)."""
    pytest.importorskip("transformers", reason="the HF oracle needs transformers (the runner extra installs it)")
    from transformers import LlamaConfig
    from transformers.models.llama import modeling_llama

    config = LlamaConfig(
        hidden_size=4 * head_dim,
        num_attention_heads=4,
        head_dim=head_dim,
        rope_theta=BASE,
        max_position_embeddings=MAX_POSITIONS,
    )
    return modeling_llama.LlamaRotaryEmbedding(config), modeling_llama.apply_rotary_pos_emb


def test_cache_is_hf_llamas_cos_sin():
    """fp32 table rows equal transformers' LlamaRotaryEmbedding cos/sin bit for bit, at every position."""
    for head_dim in (64, 128):
        emb, _ = _hf_llama_rope(head_dim)
        positions = torch.arange(MAX_POSITIONS)
        cos, sin = emb(torch.zeros(1, MAX_POSITIONS, head_dim), positions[None])
        table, half = cache(head_dim), head_dim // 2
        assert_exact(table[:, :half], cos[0, :, :half], "cos half")
        assert_exact(table[:, half:], sin[0, :, half:], "sin half")


def test_reference_is_hf_llamas_rope_in_fp32():
    """For fp32 activations the mirror is transformers' apply_rotary_pos_emb result, bit for bit (and so is the
    runner's RotaryEmbedding on the CPU, which calls the mirror)."""
    from runner.model.layers import RotaryEmbedding

    p = dict(tokens=33, heads=(9, 3), head_dim=64, dtype=torch.float32, seed=3, pad=0, strided_positions=False)
    qkv, positions = make_problem(p)
    q, k = views(qkv, p)
    emb, apply_hf = _hf_llama_rope(64)
    cos, sin = emb(torch.zeros(1, len(positions), 64), positions[None])
    want_q, want_k = apply_hf(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos, sin)  # HF: [1, H, T, D]
    got_q, got_k = ref.apply_rope(q, k, positions, cache(64))
    assert_exact(got_q, want_q[0].transpose(0, 1), "q")
    assert_exact(got_k, want_k[0].transpose(0, 1), "k")
    runner_q, runner_k = RotaryEmbedding(64, BASE, MAX_POSITIONS, "cpu")(positions, q, k)
    assert_exact(runner_q, got_q, "runner q")
    assert_exact(runner_k, got_k, "runner k")


def rope_both(q, k, positions, table, device):
    """(reference outputs, kernel outputs) for q and k."""
    want = ref.apply_rope(q, k, positions, table)
    q_dev, k_dev = q.to(device), k.to(device)
    kernel.rope_(q_dev, k_dev, positions.to(device), table.to(device))
    return want, (q_dev.cpu(), k_dev.cpu())


@pytest.mark.parametrize("dtype", ref.DTYPES)
def test_one_hot_dims_pair_i_with_i_plus_half(dtype, device):
    """x = e_i (i < D/2) -> out[i] = cos_i, out[i + D/2] = sin_i; x = e_(i + D/2) -> -sin_i and cos_i; every other
    dim 0 (compared by value: the zeros' signs follow the signs of cos and sin, see the -0 named case)."""
    d, half, pos = 64, 32, 1000
    q = torch.eye(d).reshape(d, 1, d).to(dtype)  # token j has the one-hot head e_j
    k = q[:, :, :].clone()
    table = cache(d)
    cos, sin = table[pos, :half].to(dtype), table[pos, half:].to(dtype)
    expected = torch.zeros(d, d, dtype=dtype)
    idx = torch.arange(half)
    expected[idx, idx], expected[idx, idx + half] = cos, sin
    expected[idx + half, idx], expected[idx + half, idx + half] = -sin, cos
    outs = rope_both(q, k, torch.full((d,), pos), table, device)
    for name, (out_q, out_k) in zip(("reference", "kernel"), outs, strict=True):
        assert torch.equal(out_q[:, 0], expected), f"{name} q: {(out_q[:, 0] != expected).nonzero()[:4]}"
        assert torch.equal(out_k[:, 0], expected), f"{name} k: {(out_k[:, 0] != expected).nonzero()[:4]}"


def test_position_zero_is_the_identity_on_finite_values(device):
    q = torch.randn(3, 4, 64, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    q[0, 0, 5] = 0.0
    for out_q, _ in rope_both(q, q[:, :2].clone(), torch.zeros(3, dtype=torch.int64), cache(64), device):
        assert_exact(out_q, q, "position 0")


@pytest.mark.parametrize(
    ("value", "position", "partner"),
    [
        (math.nan, 7, math.nan),  # NaN poisons its pair
        (math.inf, 0, math.nan),  # sin(0) = 0: the partner gets Inf * 0
        (-0.0, 0, 0.0),  # -0 * 1 + x[partner] * 0 = +0 (partner is +0 here): the documented -0 policy
    ],
)
def test_special_values(value, position, partner, device):
    """x[3] = value in one head (the rest 0): out[3 + D/2] (its partner) as expected, other dims of every head
    finite."""
    q = torch.zeros(1, 2, 64, dtype=torch.float16)
    q[0, 0, 3] = value
    for out_q, _ in rope_both(q, q[:, :1].clone(), torch.tensor([position]), cache(64), device):
        got = out_q[0, 0, 35].item()
        assert (math.isnan(got) and math.isnan(partner)) or (got == partner and math.copysign(1, got) == 1), got
        others = torch.ones(2, 64, dtype=torch.bool)
        others[0, [3, 35]] = False
        assert torch.isfinite(out_q[0][others]).all()


def test_opcheck(device):
    p = dict(tokens=3, heads=(4, 2), head_dim=64, dtype=torch.bfloat16, seed=5, pad=0, strided_positions=False)
    qkv, positions = make_problem(p)
    q, k = views(qkv.to(device), p)
    torch.library.opcheck(
        torch.ops.touchstone.rope.default, (q.contiguous(), k.contiguous(), positions.to(device), cache(64).to(device))
    )


def _args(**changes):
    args = dict(
        q=torch.zeros(2, 4, 64),
        k=torch.zeros(2, 2, 64),
        positions=torch.zeros(2, dtype=torch.int64),
        cos_sin_cache=cache(64),
    )
    return args | changes


@pytest.mark.parametrize(
    ("changes", "error", "message"),
    [
        (dict(q=torch.zeros(2, 4, 64, dtype=torch.int32)), TypeError, "q: dtype"),
        (dict(k=torch.zeros(2, 2, 64, dtype=torch.float16)), TypeError, "k: dtype"),
        (dict(q=torch.zeros(2, 256)), ValueError, "q: must be 3-D"),
        (dict(k=torch.zeros(3, 2, 64)), ValueError, "k: tokens and head_dim"),
        (dict(q=torch.zeros(2, 4, 63), k=torch.zeros(2, 2, 63)), ValueError, "q: head_dim must be a positive even"),
        (dict(cos_sin_cache=cache(64).double()), TypeError, "cos_sin_cache: dtype"),
        (dict(cos_sin_cache=cache(128)), ValueError, "cos_sin_cache: must be"),
        (dict(positions=torch.zeros(2, dtype=torch.int32)), TypeError, "positions: dtype"),
        (dict(positions=torch.zeros(3, dtype=torch.int64)), ValueError, "positions: shape"),
    ],
)
def test_bad_arguments(changes, error, message, device):
    args = _args(**changes)
    for impl, dev in ((ref.apply_rope, "cpu"), (kernel.rope_, device)):
        with pytest.raises(error, match=message):
            impl(**{name: t.to(dev) for name, t in args.items()})


def test_reference_checks_position_range():
    with pytest.raises(ValueError, match=r"positions: must lie in \[0, 4096\)"):
        ref.apply_rope(**_args(positions=torch.tensor([0, MAX_POSITIONS])))


def test_kernel_rejects_a_strided_last_dim(device):
    q = torch.zeros(2, 4, 128, device=device)[:, :, ::2]
    with pytest.raises(ValueError, match="q: last dim must have stride 1"):
        kernel.rope_(**{**{n: t.to(device) for n, t in _args().items()}, "q": q})


def test_negative_control_gptj_pairing(device):
    """The kernel with GPT-J's (2i, 2i + 1) pairing planted must fail the parity check; the clean one passes."""
    p = dict(tokens=4, heads=(2, 1), head_dim=64, dtype=torch.bfloat16, seed=9, pad=0, strided_positions=False)

    def faulty(fault):
        return lambda q, k, positions, table: kernel.launch_rope(q, k, positions, table, fault=fault)

    with pytest.raises(AssertionError, match="q: not bit-exact"):
        check_rope(*make_problem(p), p, device, faulty("gptj_pairs"))
    check_rope(*make_problem(p), p, device, faulty("none"))
