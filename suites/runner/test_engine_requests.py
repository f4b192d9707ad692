"""Request-side pieces: SamplingParams validation, Sequence state, chained block hashes."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runner.engine.hashing import NONE_HASH, block_hashes, extend_block_hashes, hash_block_tokens
from runner.engine.sampling_params import SamplingParams
from runner.engine.sequence import FinishReason, Sequence, SequenceStatus


def test_hash_is_the_documented_encoding_and_reproducible():
    def spec(parent, tokens):
        return hashlib.sha256(parent + b"".join(t.to_bytes(8, "little", signed=True) for t in tokens)).digest()

    assert NONE_HASH == hashlib.sha256(b"touchstone-none-hash").digest()
    first = hash_block_tokens(None, [1, 2, 3, 4])
    assert first == spec(NONE_HASH, [1, 2, 3, 4])
    assert first.hex() == "880eb8b6dc7d3f67ae0d7989d00853ef9ef2df1ed1610c5f0e4c634f4cce88de"  # any process
    assert hash_block_tokens(first, [5, 6, 7, 8]) == spec(first, [5, 6, 7, 8])
    assert block_hashes([1, 2, 3, 4, 5, 6, 7, 8, 9], 4) == [first, spec(first, [5, 6, 7, 8])]  # partial: none
    with pytest.raises(ValueError, match="parent"):
        hash_block_tokens(b"short", [1])
    with pytest.raises(ValueError, match="token_ids"):
        hash_block_tokens(None, [2**63])


@given(
    tokens=st.lists(st.integers(0, 3), min_size=8, max_size=24),
    block_size=st.integers(1, 5),
    where=st.integers(0, 23),
    cut=st.integers(0, 24),
)
def test_hashes_chain_and_extend_incrementally(tokens, block_size, where, cut):
    where %= len(tokens)
    full = block_hashes(tokens, block_size)
    assert extend_block_hashes(block_hashes(tokens[:cut], block_size), tokens, block_size) == full
    changed = list(tokens)
    changed[where] += 1
    other = block_hashes(changed, block_size)
    j = where // block_size  # the block holding the change: it and every later block hash differently
    assert other[:j] == full[:j]
    assert all(a != b for a, b in zip(other[j:], full[j:], strict=True))


def test_sampling_params_defaults_and_validation():
    p = SamplingParams()
    assert (p.temperature, p.top_p, p.top_k, p.seed, p.max_tokens, p.stop, p.stop_token_ids, p.ignore_eos) == (
        1.0,
        1.0,
        -1,
        None,
        16,
        [],
        [],
        False,
    )
    assert SamplingParams(temperature=0).greedy and not p.top_k_enabled and SamplingParams(top_k=5).top_k_enabled
    assert SamplingParams(stop="###").stop == ["###"]
    for kwargs, field in [
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"stop": [""]}, "stop"),
        ({"stop_token_ids": [-1]}, "stop_token_ids"),
    ]:
        with pytest.raises(ValueError, match=field):
            SamplingParams(**kwargs)
    for kwargs, field in [
        ({"top_k": 2.5}, "top_k"),
        ({"seed": "7"}, "seed"),
        ({"max_tokens": True}, "max_tokens"),
        ({"ignore_eos": 1}, "ignore_eos"),
        ({"temperature": "hot"}, "temperature"),
    ]:
        with pytest.raises(TypeError, match=field):
            SamplingParams(**kwargs)


def test_sequence_state_and_recompute_keeps_generated_tokens():
    seq = Sequence([3, 4, 5], SamplingParams(seed=9), block_size=2)
    assert (seq.status, seq.num_tokens, seq.num_prompt_tokens, len(seq.block_hashes)) == (
        SequenceStatus.WAITING,
        3,
        3,
        1,
    )
    seq.append_token(6)
    assert seq.output_token_ids == [6] and seq.prompt_token_ids == [3, 4, 5] and len(seq.block_hashes) == 2
    assert seq.block_hashes == block_hashes([3, 4, 5, 6], 2)
    seq.num_computed_tokens = 3
    seq.reset_for_recompute()
    assert (seq.num_computed_tokens, seq.num_tokens, seq.num_preemptions, seq.status) == (
        0,
        4,
        1,
        SequenceStatus.WAITING,
    )
    g = seq.generator("cpu")
    assert g is seq.generator("cpu") and g.initial_seed() == 9
    assert Sequence([1]).generator("cpu") is None
    seq.finish(FinishReason.STOP, "###")
    assert seq.is_finished and seq.finish_reason == "stop" and seq.stop_reason == "###"
    with pytest.raises(ValueError, match="prompt_token_ids"):
        Sequence([])
    with pytest.raises(ValueError, match="prompt_token_ids"):
        Sequence([1, -2])
    with pytest.raises(TypeError, match="params"):
        Sequence([1], {"temperature": 0})
