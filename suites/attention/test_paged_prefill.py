"""Paged prefill: the Triton varlen causal kernel against `reference.attention.paged` (the KV-tiled fp32 mirror
and the fp64 ideal, through the ("paged_prefill", dtype) rows of kernels.tolerances), over drawn block sizes,
GQA groups, head sizes, ragged (query count, cached prefix) per sequence (prefix 0 and one query included),
block tables with holes (every byte the sequences do not own is NaN) and shared prefixes; named cases with
exact outputs; argument checks; one opcheck; a negative control. The cache and block-table builder is
suites/attention/paged_cases.py, shared with the decode suite."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kernels.tolerances import assert_lossy, families
from reference.attention import paged as ref
from suites.attention.paged_cases import DTYPES, build, dominant_key, equal_keys, fixed, named, on

kernel = pytest.importorskip("kernels.paged_prefill")


@st.composite
def prefill_problems(draw):
    seqs = draw(st.integers(1, 3))
    news = [draw(st.one_of(st.just(1), st.integers(1, 40))) for _ in range(seqs)]
    prefixes = [draw(st.one_of(st.just(0), st.integers(1, 100))) for _ in range(seqs)]
    return dict(
        dtype=draw(st.sampled_from(DTYPES)),
        block_size=draw(st.sampled_from([16, 32, 64])),
        kv_heads=draw(st.integers(1, 2)),
        group=draw(st.sampled_from([1, 2, 4])),
        head=draw(st.sampled_from([64, 128])),
        news=news,
        seq_lens=[n + c for n, c in zip(news, prefixes, strict=True)],
        num_splits=1,
        share_prefix=draw(st.booleans()),
        extra_width=draw(st.integers(0, 2)),
        spare_blocks=draw(st.integers(1, 3)),
        unused=draw(st.sampled_from(["minus_one", "garbage"])),
        sharpness=draw(st.sampled_from([1.0, 4.0])),
        seed=draw(st.integers(0, 2**31 - 1)),
    )


def build_prefill(p: dict):
    """(q, k_cache, v_cache, block_table, seq_lens, cu_seqlens, scale): the decode suite's cache (the new tokens
    already stored: they are the last p["news"][b] of each sequence's seq_lens[b]) and p["news"] query rows a
    sequence."""
    _, k_cache, v_cache, table, lens, scale = build(p)
    gen = torch.Generator().manual_seed(p["seed"] + 1)
    q = torch.randn(sum(p["news"]), p["kv_heads"] * p["group"], p["head"], generator=gen) * p["sharpness"]
    cu = torch.tensor([0, *torch.tensor(p["news"]).cumsum(0).tolist()], dtype=torch.int32)
    return q.to(p["dtype"]), k_cache, v_cache, table, lens, cu, scale


def check(p: dict, device: str, fault: str = "none") -> None:
    q, k_cache, v_cache, table, lens, cu, scale = build_prefill(p)
    mirror = ref.paged_prefill_mirror(q, k_cache, v_cache, table, lens, cu, scale, kernel.kv_tile(device))
    ideal = ref.paged_attention_ideal(q, k_cache, v_cache, table, lens, scale, cu_seqlens=cu)
    got = kernel.launch_paged_prefill(*on(device, q, k_cache, v_cache, table, lens, cu), scale, fault)
    assert_lossy(families.PAGED_PREFILL, got.cpu(), mirror, ideal, f"paged prefill {p}")


@given(p=prefill_problems())
def test_paged_prefill_matches_references(p, device):
    check(p, device)


# ---- named cases: outputs known exactly ----
def run_both(q, k_cache, v_cache, table, lens, cu, scale, device):
    mirror = ref.paged_prefill_mirror(q, k_cache, v_cache, table, lens, cu, scale, kernel.kv_tile(device))
    got = kernel.paged_prefill(*on(device, q, k_cache, v_cache, table, lens, cu), scale=scale)
    return got.cpu(), mirror


def fill(cache, blocks, gen, dtype):
    for block in blocks:
        cache[block] = torch.randn(cache[block].shape, generator=gen).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_first_position_returns_its_value_row(dtype, device):
    """No prefix, 20 new tokens: the query at position 0 sees only key 0, weight exactly 1, so every head of a
    group returns V row 0 bit for bit, whatever the scores; a lone query with no prefix likewise (second
    sequence, sharing block 4 is harmless: it reads only position 0)."""
    k_cache, v_cache, table, scale = named(dtype)
    gen = torch.Generator().manual_seed(7)
    for cache in (k_cache, v_cache):
        fill(cache, [4, 1], gen, dtype)
    q = torch.randn(21, 4, 64, generator=gen).to(dtype) * 30
    lens, cu = torch.tensor([20, 1], dtype=torch.int32), torch.tensor([0, 20, 21], dtype=torch.int32)
    for out in run_both(q, k_cache, v_cache, table.expand(2, 4).contiguous(), lens, cu, scale, device):
        want = v_cache[4, 0].repeat_interleave(2, dim=0)
        for row in (0, 20):
            assert torch.equal(out[row], want), f"row {row}: max diff {(out[row].float() - want.float()).abs().max()}"


def test_equal_keys_give_running_means(device):
    """48 equal keys (20 cached, 28 new) and V[t, d] = t + d: every weight is exactly 1, the sums are exact
    integers in fp32, so the query at position t outputs the mean t / 2 + d exactly (in bf16 up to 86.5)."""
    gen = torch.Generator().manual_seed(8)
    k_cache, v_cache, table, scale = equal_keys(gen)
    q = torch.randn(28, 4, 64, generator=gen).bfloat16()
    lens, cu = torch.tensor([48], dtype=torch.int32), torch.tensor([0, 28], dtype=torch.int32)
    pos = torch.arange(20, 48, dtype=torch.float32)[:, None, None]
    want = (pos / 2 + torch.arange(64, dtype=torch.float32)).bfloat16().expand(28, 4, 64)
    for out in run_both(q, k_cache, v_cache, table, lens, cu, scale, device):
        assert torch.equal(out, want), f"max diff {(out.float() - want.float()).abs().max()}"


def test_dominant_key_is_seen_only_from_its_position(device):
    """Key 37 (a new token; 30 cached, 20 new) scores 200 above the rest: the queries at positions 37..49 output
    V row 37 exactly (the others weigh e^-200 = 0 in fp32); the queries at 30..36 must not see it at all."""
    k_cache, v_cache, table, scale = dominant_key(torch.Generator().manual_seed(9))
    q = torch.ones(20, 4, 64, dtype=torch.bfloat16)
    lens, cu = torch.tensor([50], dtype=torch.int32), torch.tensor([0, 20], dtype=torch.int32)
    want = v_cache[5, 5].expand(4, 64)
    for out in run_both(q, k_cache, v_cache, table, lens, cu, scale, device):
        assert torch.equal(out[7:], want.expand(13, 4, 64)), f"max diff {(out[7:].float() - want.float()).abs().max()}"
        leaked = [i for i in range(7) if torch.equal(out[i], want)]
        assert not leaked, f"rows {leaked} (positions before 37) saw key 37"


# ---- the mirror itself ----
@pytest.mark.parametrize("tile_n", [16, 64])
def test_mirror_is_close_to_the_ideal(tile_n):
    """The mirror alone (got = mirror) holds the table's SQNR floor against the ideal, at two KV tilings."""
    p = fixed(news=[40, 1], sharpness=4.0, seed=11)
    q, k_cache, v_cache, table, lens, cu, scale = build_prefill(p)
    mirror = ref.paged_prefill_mirror(q, k_cache, v_cache, table, lens, cu, scale, tile_n)
    ideal = ref.paged_attention_ideal(q, k_cache, v_cache, table, lens, scale, cu_seqlens=cu)
    assert_lossy(families.PAGED_PREFILL, mirror, mirror, ideal)


# ---- arguments ----
def _args(**change):
    k_cache, v_cache = torch.zeros(4, 16, 2, 64, dtype=torch.bfloat16), torch.zeros(4, 16, 2, 64, dtype=torch.bfloat16)
    args = dict(
        q=torch.zeros(5, 4, 64, dtype=torch.bfloat16),
        k_cache=k_cache,
        v_cache=v_cache,
        block_table=torch.zeros(2, 4, dtype=torch.int32),
        seq_lens=torch.full((2,), 9, dtype=torch.int32),
        cu_seqlens=torch.tensor([0, 2, 5], dtype=torch.int32),
        scale=0.125,
    )
    return args | change


@pytest.mark.parametrize(
    ("change", "error", "name"),
    [
        (dict(q=torch.zeros(5, 4, 64)), TypeError, "q: dtype"),
        (dict(q=torch.zeros(5, 3, 64, dtype=torch.bfloat16)), ValueError, "q: 3 query heads"),
        (dict(cu_seqlens=None), TypeError, "cu_seqlens"),
        (dict(cu_seqlens=torch.tensor([0, 5], dtype=torch.int32)), TypeError, "cu_seqlens"),
        (dict(k_cache=torch.zeros(4, 16, 2, 128, dtype=torch.bfloat16)[..., ::2]), ValueError, "k_cache: last dim"),
        (dict(block_table=torch.zeros(2, 4, dtype=torch.int64)), TypeError, "block_table"),
        (dict(scale=-1.0), ValueError, "scale"),
    ],
    ids=["q-dtype", "q-heads", "cu-none", "cu-shape", "k-stride", "table-dtype", "scale"],
)
def test_bad_arguments_name_the_argument(change, error, name):
    a = _args(**change)
    with pytest.raises(error, match=name):
        ref.paged_prefill_mirror(**a, tile_n=16)
    with pytest.raises(error, match=name):
        kernel.launch_paged_prefill(**a)


def test_reference_checks_query_counts():
    with pytest.raises(ValueError, match="cu_seqlens: must run from 0 to the 5"):
        ref.paged_prefill_mirror(**_args(cu_seqlens=torch.tensor([0, 2, 4], dtype=torch.int32)), tile_n=16)
    with pytest.raises(ValueError, match="seq_lens: sequence 1"):  # 3 queries, 2 tokens
        ref.paged_prefill_mirror(**_args(seq_lens=torch.tensor([9, 2], dtype=torch.int32)), tile_n=16)
    with pytest.raises(ValueError, match="tile_n"):
        ref.paged_prefill_mirror(**_args(), tile_n=0)


def test_opcheck(device):
    p = fixed(kv_heads=2, group=2, news=[3, 1], seq_lens=[20, 1], extra_width=1, seed=3)
    q, k_cache, v_cache, table, lens, cu, scale = build_prefill(p)
    k_cache, v_cache = k_cache.nan_to_num(0.0), v_cache.nan_to_num(0.0)  # opcheck compares inputs with ==
    torch.library.opcheck(
        torch.ops.touchstone.paged_prefill.default, (*on(device, q, k_cache, v_cache, table, lens, cu), scale)
    )


# ---- negative control: the planted block-table off-by-one must be caught ----
def test_negative_control_block_table_off_by_one(device):
    """Logical block j read through entry j + 1: the next block's data, and past a sequence's last block an
    unused entry (here any block id, NaN spares included)."""
    p = fixed(group=2, news=[12, 7], seq_lens=[40, 7], extra_width=1, spare_blocks=2, unused="garbage", seed=4)
    with pytest.raises(AssertionError, match="paged prefill"):
        check(p, device, fault="block_table_off_by_one")
    check(p, device)
