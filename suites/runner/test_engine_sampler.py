"""Sampler: greedy ties, top-k / top-p masks against a per-row reference (ties included), the nucleus
boundary, top-p after top-k renormalisation, sampled frequencies on a known distribution, seeds that make a
request's tokens independent of its batch."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from runner.engine.sampler import SamplingBatch, apply_top_k_top_p, sample
from runner.engine.sampling_params import SamplingParams
from runner.engine.sequence import Sequence


def batch(params, vocab, generators=None):
    return SamplingBatch.build(params, vocab, "cpu", generators)


def kept_reference(row: list[float], k: int, p: float) -> set[int]:
    """Per-row spec: order by (-logit, id); keep the first k; renormalise; keep while the mass before < p."""
    order = sorted(range(len(row)), key=lambda i: (-row[i], i))
    if 0 < k < len(row):
        order = order[:k]
    if p >= 1:
        return set(order)
    top = row[order[0]]
    weights = [math.exp(row[i] - top) for i in order]
    total, before, kept = sum(weights), 0.0, set()
    for i, w in zip(order, weights, strict=True):
        if before >= p * total and kept:
            break
        kept.add(i)
        before += w
    return kept


@given(rows=st.integers(1, 6), vocab=st.integers(2, 40), seed=st.integers(0, 2**16), data=st.data())
def test_top_k_top_p_masks_match_the_per_row_spec(rows, vocab, seed, data):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randint(-4, 4, (rows, vocab), generator=g).float() / 2  # coarse values: many ties
    ks = data.draw(st.lists(st.sampled_from([-1, 0, 1, 2, 3, vocab, vocab + 5]), min_size=rows, max_size=rows))
    ps = data.draw(st.lists(st.sampled_from([0.05, 0.3, 0.5, 0.77, 0.95, 1.0]), min_size=rows, max_size=rows))
    b = batch([SamplingParams(top_k=k, top_p=p) for k, p in zip(ks, ps, strict=True)], vocab)
    masked = apply_top_k_top_p(logits, b.top_k, b.top_p)
    for r in range(rows):
        kept = set(torch.isfinite(masked[r]).nonzero().flatten().tolist())
        assert kept == kept_reference(logits[r].tolist(), ks[r], ps[r]), (ks[r], ps[r], logits[r])
        assert torch.equal(masked[r][list(kept)], logits[r][list(kept)])


def test_nucleus_keeps_the_crossing_token_and_applies_after_top_k():
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    for p, want in [(1e-6, [0]), (0.4, [0]), (0.6, [0, 1]), (0.9, [0, 1, 2]), (0.99, [0, 1, 2, 3])]:
        masked = apply_top_k_top_p(logits, None, torch.tensor([p]))
        assert torch.isfinite(masked[0]).nonzero().flatten().tolist() == want, p
    # top-k 2 renormalises to (0.625, 0.375): p = 0.6 is crossed by the first token alone
    masked = apply_top_k_top_p(logits, torch.tensor([2]), torch.tensor([0.6]))
    assert torch.isfinite(masked[0]).nonzero().flatten().tolist() == [0]


def test_greedy_takes_the_lowest_id_among_ties_in_a_mixed_batch():
    logits = torch.tensor([[1.0, 5.0, 5.0, 2.0], [0.0, 0.0, 9.0, 9.0], [3.0, 3.0, 3.0, 3.0]])
    params = [SamplingParams(temperature=0), SamplingParams(temperature=0.7, top_k=1), SamplingParams(temperature=0)]
    assert sample(logits, batch(params, 4)).tolist() == [1, 2, 0]
    assert sample(logits, batch([SamplingParams(temperature=0)] * 3, 4)).tolist() == [1, 2, 0]
    flat = torch.randn(64, 16, generator=torch.Generator().manual_seed(3)) * 0.1  # near-uniform rows
    params = [SamplingParams(temperature=0 if r % 8 else 1.0) for r in range(64)]
    got = sample(flat, batch(params, 16))
    greedy_rows = [r for r in range(64) if r % 8]
    assert got[greedy_rows].tolist() == flat[greedy_rows].argmax(-1).tolist()


@pytest.mark.parametrize(("temperature", "top_k"), [(1.0, -1), (2.0, -1), (1.0, 2)])
def test_sampled_frequencies_follow_the_distribution(temperature, top_k):
    p = torch.tensor([0.5, 0.3, 0.15, 0.05])
    n = 4000
    logits = p.log().expand(n, 4).contiguous()
    want = p ** (1 / temperature)
    if top_k > 0:
        want[top_k:] = 0
    want = want / want.sum()
    with torch.random.fork_rng():
        torch.manual_seed(1234)
        tokens = sample(logits, batch([SamplingParams(temperature=temperature, top_k=top_k)] * n, 4))
    freq = torch.bincount(tokens, minlength=4).double() / n
    bound = 4 * (want * (1 - want) / n).sqrt() + 1e-12  # 4 sigma of a binomial proportion
    assert ((freq - want).abs() <= bound).all(), (freq, want)


def test_seeded_request_is_independent_of_its_batch():
    vocab = 50
    g = torch.Generator().manual_seed(0)
    steps = [torch.randn(5, vocab, generator=g) for _ in range(6)]
    params = SamplingParams(temperature=1.0, top_p=0.9, seed=42)

    def tokens_of(row, others):
        seq = Sequence([1], params)
        mates = [Sequence([1], q) for q in others]
        out = []
        for logits in steps:
            seqs = [*mates[:row], seq, *mates[row:]]
            got = sample(
                logits[: len(seqs)].clone().index_copy_(0, torch.tensor([row]), logits[4:5]),
                SamplingBatch.from_sequences(seqs, vocab, "cpu"),
            )
            out.append(int(got[row]))
        return out

    alone = tokens_of(0, [])
    crowded = tokens_of(
        2,
        [
            SamplingParams(temperature=0.5, seed=7),
            SamplingParams(),
            SamplingParams(top_k=3),
            SamplingParams(temperature=0),
        ],
    )
    assert alone == crowded
    assert tokens_of(0, []) == alone  # a fresh request with the same seed: the same tokens
    assert len(set(alone)) > 1


def test_boundary_errors():
    b = batch([SamplingParams()], 4)
    with pytest.raises(TypeError, match="logits"):
        sample(torch.zeros(1, 4, dtype=torch.float16), b)
    with pytest.raises(ValueError, match="logits: 2 rows"):
        sample(torch.zeros(2, 4), b)
    with pytest.raises(ValueError, match="generators"):
        batch([SamplingParams()], 4, [None, None])
