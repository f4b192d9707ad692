"""Paged decode: the Triton split-K kernel against `reference.attention.paged` (the fp32 split-K mirror and
the fp64 ideal, through the ("paged_decode", dtype) rows of kernels.tolerances), over drawn block sizes, GQA
groups, head sizes, ragged lengths, split counts, block tables with holes (every byte of the cache the
sequences do not own is NaN, so a wrong gather shows) and shared prefixes, on bf16/fp16 caches and on FP8
caches filled through the FP8 store reference (per-(slot, KV head) scales; the same rows bound both: the FP8
path's own loss is measured in their `why`); named cases with exact outputs; the reference against a dense
fp64 attention; argument checks; one opcheck (bf16: opcheck cannot compare float8 tensors); a negative
control on both paths. The cache and block-table builder is suites/attention/paged_cases.py, shared with the
prefill suite."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kernels.tolerances import assert_lossy, families
from reference.attention import paged as ref
from reference.kv.store import store_kv
from suites.attention.paged_cases import (
    DTYPES,
    build,
    build_fp8,
    dominant_key,
    equal_keys,
    fixed,
    make_cache,
    named,
    on,
)

kernel = pytest.importorskip("kernels.paged_decode")


@st.composite
def decode_problems(draw):
    return dict(
        dtype=draw(st.sampled_from(DTYPES)),
        block_size=draw(st.sampled_from([16, 32])),
        kv_heads=draw(st.integers(1, 2)),
        group=draw(st.sampled_from([1, 2, 4, 8, 16])),
        head=draw(st.sampled_from([64, 128])),
        seq_lens=draw(st.lists(st.integers(1, 300), min_size=1, max_size=3)),
        num_splits=draw(st.sampled_from([1, 2, 3, 8])),
        share_prefix=draw(st.booleans()),
        extra_width=draw(st.integers(0, 2)),
        spare_blocks=draw(st.integers(1, 4)),
        unused=draw(st.sampled_from(["minus_one", "garbage"])),
        sharpness=draw(st.sampled_from([1.0, 4.0])),
        seed=draw(st.integers(0, 2**31 - 1)),
    )


def check(p: dict, device: str, fault: str = "none") -> None:
    """p with a "spread" key: over FP8 caches (build_fp8)."""
    q, k_cache, v_cache, table, lens, scale, k_scale, v_scale = (
        build_fp8(p) if "spread" in p else (*build(p), None, None)
    )
    mirror = ref.paged_decode_mirror(q, k_cache, v_cache, table, lens, scale, p["num_splits"], k_scale, v_scale)
    ideal = ref.paged_attention_ideal(q, k_cache, v_cache, table, lens, scale, k_scale=k_scale, v_scale=v_scale)
    scales = on(device, k_scale, v_scale) if k_scale is not None else (None, None)
    got = kernel.launch_paged_decode(
        *on(device, q, k_cache, v_cache, table, lens), scale, p["num_splits"], *scales, fault=fault
    )
    assert_lossy(families.PAGED_DECODE, got.cpu(), mirror, ideal, f"paged decode {p}")


@given(p=decode_problems())
def test_paged_decode_matches_references(p, device):
    check(p, device)


@given(p=decode_problems(), spread=st.sampled_from([0.0, 4.0]))
def test_paged_decode_fp8_cache_matches_references(p, spread, device):
    """FP8 caches: each (token, head) row scaled by 2**u, |u| <= spread, before the store quantizes it, so the
    scales differ across slots and heads and a scale read from the wrong slot or head shows."""
    check(p | dict(spread=spread), device)


# ---- named cases: outputs known exactly ----
def run_both(q, k_cache, v_cache, table, lens, scale, num_splits, device):
    mirror = ref.paged_decode_mirror(q, k_cache, v_cache, table, lens, scale, num_splits)
    got = kernel.paged_decode(*on(device, q, k_cache, v_cache, table, lens), scale=scale, num_splits=num_splits)
    return got.cpu(), mirror


@pytest.mark.parametrize("dtype", DTYPES)
def test_seq_len_one_returns_its_value_row(dtype, device):
    """One token: its weight is exactly 1, so every query head of a group returns that token's V row, bit
    for bit, whatever the scores; the rest of its block (NaN) is never read."""
    k_cache, v_cache, table, scale = named(dtype)
    gen = torch.Generator().manual_seed(7)
    k_cache[4, 0] = torch.randn(2, 64, generator=gen).to(dtype)
    v_cache[4, 0] = torch.randn(2, 64, generator=gen).to(dtype)
    q = torch.randn(1, 4, 64, generator=gen).to(dtype) * 30
    for out in run_both(q, k_cache, v_cache, table, torch.tensor([1], dtype=torch.int32), scale, 3, device):
        want = v_cache[4, 0].repeat_interleave(2, dim=0)[None]
        assert torch.equal(out, want), f"max diff {(out.float() - want.float()).abs().max()}"


def test_equal_keys_give_uniform_weights(device):
    """48 equal keys (3 blocks) and V[t, d] = t + d: every weight is exactly 1 (scores equal, p = 2^0), the
    sums are exact integers in fp32, so the output is the mean 23.5 + d exactly, over 2 splits."""
    gen = torch.Generator().manual_seed(8)
    k_cache, v_cache, table, scale = equal_keys(gen)
    q = torch.randn(1, 4, 64, generator=gen).bfloat16()
    want = (23.5 + torch.arange(64, dtype=torch.float32)).bfloat16().expand(1, 4, 64)
    for out in run_both(q, k_cache, v_cache, table, torch.tensor([48], dtype=torch.int32), scale, 2, device):
        assert torch.equal(out, want), f"max diff {(out.float() - want.float()).abs().max()}"


def test_one_dominant_key_takes_all_weight(device):
    """Token 37 (block 2 of 4, the middle split of 3) scores 200 above the rest: the others weigh e^-200 = 0
    in fp32, so the output is token 37's V row exactly; the other splits' partials must be weighed 0."""
    k_cache, v_cache, table, scale = dominant_key(torch.Generator().manual_seed(9))
    q = torch.ones(1, 4, 64, dtype=torch.bfloat16)
    for out in run_both(q, k_cache, v_cache, table, torch.tensor([50], dtype=torch.int32), scale, 3, device):
        want = v_cache[5, 5].expand(1, 4, 64)
        assert torch.equal(out, want), f"max diff {(out.float() - want.float()).abs().max()}"


def test_fp8_dominant_key_by_its_scale_alone(device):
    """FP8: every key row is constant, so every code is 448 (e4m3's max) and only the scales tell the keys
    apart: 0.25 / 448 everywhere but token 37's (block 5, row 5) 25 / 448. A query of ones scores it
    64 * (25 - 0.25) / 8 = 198 above the rest (e^-198 = 0 in fp32), so its weight is 1 and the output is token
    37's V row as the fold computes it: the weight times v_scale rounded to fp16 (a normal fp16 here), times
    each code (exact in fp32), rounded to bf16, exactly; a kernel ignoring k_scale would average 50 rows."""
    k_cache, v_cache = make_cache(16, 1, 64, torch.float8_e4m3fn, 6)
    k_scale, v_scale = torch.full((6, 16, 1), torch.nan), torch.full((6, 16, 1), torch.nan)
    table = torch.tensor([[4, 1, 5, 0]], dtype=torch.int32)
    keys = torch.full((50, 1, 64), 0.25, dtype=torch.bfloat16)
    keys[37] = 25.0
    values = torch.randn(50, 1, 64, generator=torch.Generator().manual_seed(10)).bfloat16()
    slots = table[0].long().repeat_interleave(16)[:50] * 16 + torch.arange(50) % 16
    store_kv(keys, values, k_cache, v_cache, slots, k_scale=k_scale, v_scale=v_scale)
    assert k_cache[5, 5].view(torch.uint8).eq(0x7E).all() and k_cache[4, 0].view(torch.uint8).eq(0x7E).all()
    q = torch.ones(1, 4, 64, dtype=torch.bfloat16)
    lens = torch.tensor([50], dtype=torch.int32)
    assert 2**-14 < v_scale[5, 5].item() < 2**15  # so its fp16 rounding is the 11-bit one
    want = (v_cache[5, 5].float() * v_scale[5, 5, :, None].half().float()).bfloat16().expand(1, 4, 64)
    mirror = ref.paged_decode_mirror(q, k_cache, v_cache, table, lens, 0.125, 3, k_scale, v_scale)
    got = kernel.paged_decode(
        *on(device, q, k_cache, v_cache, table, lens),
        scale=0.125,
        num_splits=3,
        k_scale=k_scale.to(device),
        v_scale=v_scale.to(device),
    ).cpu()
    for out in (got, mirror):
        assert torch.equal(out, want), f"max diff {(out.float() - want.float()).abs().max()}"


# ---- the references themselves ----
def test_ideal_prefill_matches_dense_causal_attention():
    """paged_attention_ideal with a cached prefix (3 new tokens after 37 cached; 5 and 9 new with no prefix)
    equals fp64 SDPA on the gathered contiguous K/V with the query rows at the sequence's last positions."""
    p = fixed(
        dtype=torch.float16,
        kv_heads=2,
        group=2,
        seq_lens=[40, 5, 9],
        share_prefix=True,
        extra_width=1,
        spare_blocks=2,
        unused="garbage",
        seed=5,
    )
    _, k_cache, v_cache, table, lens, scale = build(p)
    news = [3, 5, 9]
    q = torch.randn(sum(news), 4, 64, generator=torch.Generator().manual_seed(1)).half()
    cu = torch.tensor([0, 3, 8, 17], dtype=torch.int32)
    got = ref.paged_attention_ideal(q, k_cache, v_cache, table, lens, scale, cu_seqlens=cu)
    for b, (n, length) in enumerate(zip(news, lens.tolist(), strict=True)):
        k, v = (ref.gather_kv(c, table[b], length).double().transpose(0, 1) for c in (k_cache, v_cache))
        qs = q[cu[b] : cu[b + 1]].double().transpose(0, 1)
        mask = torch.arange(length)[None, :] <= torch.arange(length - n, length)[:, None]
        want = torch.nn.functional.scaled_dot_product_attention(qs, k, v, attn_mask=mask, scale=scale, enable_gqa=True)
        torch.testing.assert_close(got[cu[b] : cu[b + 1]], want.transpose(0, 1), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
@pytest.mark.parametrize("num_splits", [1, 4])
def test_mirror_is_close_to_the_ideal(num_splits, fp8):
    """The mirror alone (got = mirror) holds the table's SQNR floor against the ideal, at one and four splits,
    on a bf16 cache and on an FP8 one (whose ideal is on the exactly dequantized K/V)."""
    p = fixed(num_splits=num_splits, sharpness=4.0, seed=11)
    q, k_cache, v_cache, table, lens, scale, k_scale, v_scale = (
        build_fp8(p | dict(spread=4.0)) if fp8 else (*build(p), None, None)
    )
    mirror = ref.paged_decode_mirror(q, k_cache, v_cache, table, lens, scale, num_splits, k_scale, v_scale)
    ideal = ref.paged_attention_ideal(q, k_cache, v_cache, table, lens, scale, k_scale=k_scale, v_scale=v_scale)
    assert_lossy(families.PAGED_DECODE, mirror, mirror, ideal)


# ---- arguments ----
def _fp8():
    return torch.zeros(4, 16, 2, 64, dtype=torch.float8_e4m3fn)


def _scale():
    return torch.ones(4, 16, 2)


def _args(**change):
    k_cache, v_cache = torch.zeros(4, 16, 2, 64, dtype=torch.bfloat16), torch.zeros(4, 16, 2, 64, dtype=torch.bfloat16)
    args = dict(
        q=torch.zeros(2, 4, 64, dtype=torch.bfloat16),
        k_cache=k_cache,
        v_cache=v_cache,
        block_table=torch.zeros(2, 4, dtype=torch.int32),
        seq_lens=torch.ones(2, dtype=torch.int32),
        scale=0.125,
        num_splits=2,
    )
    return args | change


@pytest.mark.parametrize(
    ("change", "error", "name"),
    [
        (dict(q=torch.zeros(2, 4, 64)), TypeError, "q: dtype"),
        (dict(q=torch.zeros(2, 3, 64, dtype=torch.bfloat16)), ValueError, "q: 3 query heads"),
        (dict(q=torch.zeros(3, 4, 64, dtype=torch.bfloat16)), ValueError, "q: decode"),
        (dict(v_cache=torch.zeros(4, 16, 2, 64, dtype=torch.float16)), TypeError, "v_cache: dtype"),
        (dict(k_cache=torch.zeros(4, 16, 2, 128, dtype=torch.bfloat16)[..., ::2]), ValueError, "k_cache: last dim"),
        (dict(block_table=torch.zeros(2, 4, dtype=torch.int64)), TypeError, "block_table"),
        (dict(seq_lens=torch.ones(3, dtype=torch.int32)), TypeError, "seq_lens"),
        (dict(scale=0.0), ValueError, "scale"),
        (dict(num_splits=0), ValueError, "num_splits"),
        (dict(k_cache=_fp8(), v_cache=_fp8(), v_scale=_scale()), ValueError, "k_scale: a torch.float8_e4m3fn cache"),
        (dict(k_scale=_scale(), v_scale=_scale()), ValueError, "k_scale: only a torch.float8_e4m3fn cache"),
        (dict(k_cache=_fp8(), k_scale=_scale(), v_scale=_scale()), TypeError, "v_cache: dtype"),
        (
            dict(k_cache=_fp8(), v_cache=_fp8(), k_scale=_scale(), v_scale=_scale().double()),
            TypeError,
            "v_scale: dtype",
        ),
        (dict(k_cache=_fp8(), v_cache=_fp8(), k_scale=_scale()[:3], v_scale=_scale()), ValueError, "k_scale: shape"),
    ],
    ids=[
        "q-dtype",
        "q-heads",
        "q-rows",
        "v-dtype",
        "k-stride",
        "table-dtype",
        "lens-shape",
        "scale",
        "splits",
        "fp8-no-k-scale",
        "bf16-with-scales",
        "fp8-k-only",
        "v-scale-dtype",
        "k-scale-shape",
    ],
)
def test_bad_arguments_name_the_argument(change, error, name):
    a = _args(**change)
    with pytest.raises(error, match=name):
        ref.paged_decode_mirror(**a)
    with pytest.raises(error, match=name):
        kernel.launch_paged_decode(**a)


def test_kernel_refuses_strided_lengths():
    """The kernel reads seq_lens[b] at ptr + b: a strided slice must be refused, not misread."""
    strided = torch.ones(4, dtype=torch.int32)[::2]
    with pytest.raises(ValueError, match="seq_lens: must be contiguous"):
        kernel.launch_paged_decode(**_args(seq_lens=strided))


def test_reference_checks_lengths_and_table_values():
    a = _args(seq_lens=torch.tensor([1, 65], dtype=torch.int32))
    with pytest.raises(ValueError, match="seq_lens: sequence 1"):
        ref.paged_decode_mirror(**a)
    a = _args(block_table=torch.tensor([[0, -1, -1, -1], [4, 0, 0, 0]], dtype=torch.int32))
    with pytest.raises(ValueError, match="block_table: sequence 1"):
        ref.paged_decode_mirror(**a)


def test_opcheck(device):
    p = fixed(kv_heads=2, group=2, seq_lens=[20, 3], num_splits=2, extra_width=1, seed=3)
    q, k_cache, v_cache, table, lens, scale = build(p)
    k_cache, v_cache = k_cache.nan_to_num(0.0), v_cache.nan_to_num(0.0)  # opcheck compares inputs with ==
    # One opcheck, on the bf16 path (k_scale = v_scale = None): opcheck compares float8 tensors with ops torch lacks.
    torch.library.opcheck(
        torch.ops.touchstone.paged_decode.default, (*on(device, q, k_cache, v_cache, table, lens), scale, 2)
    )


# ---- negative control: the planted block-table off-by-one must be caught ----
@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_negative_control_block_table_off_by_one(fp8, device):
    """Logical block j read through entry j + 1: the next block's data, and past a sequence's last block an
    unused entry (here a never-owned NaN block); on the FP8 path the scales come through the same entry."""
    p = fixed(group=2, seq_lens=[40, 7], num_splits=2, extra_width=1, spare_blocks=2, unused="garbage", seed=4)
    p = p | dict(spread=4.0) if fp8 else p
    with pytest.raises(AssertionError, match="paged decode"):
        check(p, device, fault="block_table_off_by_one")
    check(p, device)
