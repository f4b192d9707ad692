"""Scheduler: token budget, max sequences, decode-first mixed steps, chunked prefill, preemption by
recompute, finishing rules, and the step tensors the model runner turns into an AttentionBatch.

The fake model stores each new token id at its slot (its "K/V"), then reads every sampling row's whole
context back through the block table and must find the request's tokens there: a wrong slot, a wrong prefix
hit or a lost block after preemption fails at once. Its logits are a function of that context, so the
tokens of a run depend only on what the cache really holds: prefix caching on/off, chunked/unchunked and
forced preemption must all give the same tokens (greedy and seeded sampling alike)."""

from __future__ import annotations

import dataclasses
import hashlib
from collections import deque

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import runner.engine.sequence as sequence_mod
from runner.engine.sampler import SamplingBatch, sample
from runner.engine.sampling_params import SamplingParams
from runner.engine.scheduler import PLACEHOLDER, Scheduler, SchedulerConfig
from runner.engine.sequence import FinishReason, Sequence, SequenceStatus

VOCAB = 32


class FakeModel:
    """Runs a step at once (the "device"): rows with a placeholder take the token the previous step sampled
    for them (prev_row), as the model runner does on the GPU. Each row's context is read back through the
    block table and kept: it is checked against the request's tokens once the step is resolved (under
    asynchronous scheduling the placeholder's token is only known to the scheduler then)."""

    def __init__(self, config: SchedulerConfig):
        self.bs = config.block_size
        self.cache = torch.full((config.num_blocks * config.block_size,), -1, dtype=torch.int64)
        self.cache_pos = self.cache.clone()  # the position each slot was written for (real K/V carry RoPE)

    def __call__(self, out, prev_tokens=None, strict: bool = True) -> tuple[torch.Tensor, list[list[int]]]:
        inp = out.step_inputs()
        ids, at = inp.input_ids.clone(), 0
        for s in out.scheduled:
            if s.prev_row >= 0:
                assert s.token_ids == [PLACEHOLDER] and prev_tokens is not None
                ids[at] = prev_tokens[s.prev_row]
            elif strict:  # the known tokens, as the scheduler knows them
                assert s.token_ids == s.seq.token_ids[s.positions.start : s.positions.stop], f"{s.seq}: wrong ids"
            at += s.num_new_tokens
        assert not bool((inp.block_table[:, :1] == 0).any()), "a scheduled row has no block"
        self.cache[inp.slot_mapping] = ids
        self.cache_pos[inp.slot_mapping] = inp.positions
        logits = torch.empty(len(out.scheduled), VOCAB)
        contexts = []
        for b, s in enumerate(out.scheduled):
            pos = torch.arange(int(inp.seq_lens[b]))
            slots = inp.block_table[b, pos // self.bs].long() * self.bs + pos % self.bs
            ctx = self.cache[slots]
            assert torch.equal(self.cache_pos[slots], pos), f"{s.seq} reads K/V of other positions"
            contexts.append(ctx.tolist())
            seed = int.from_bytes(hashlib.sha256(str(ctx.tolist()).encode()).digest()[:6], "little")
            logits[b] = torch.randn(VOCAB, generator=torch.Generator().manual_seed(seed)) * 3
        return logits, contexts


def _sample(out, logits) -> list[int]:
    # Only rows whose last token is the request's last sample: a prompt chunk must not advance a seed.
    rows = [i for i, s in enumerate(out.scheduled) if s.samples]
    tokens = [0] * len(out.scheduled)
    if rows:
        batch = SamplingBatch.from_sequences([out.scheduled[i].seq for i in rows], VOCAB, "cpu")
        for i, t in zip(rows, sample(logits[rows], batch).tolist(), strict=True):
            tokens[i] = t
    return tokens


def run(
    config,
    prompts,
    params,
    stop_checker=None,
    *,
    fault=None,
    strict=True,
    aborts=None,
    late=None,
    order=None,
    hook=None,
):
    """Serve `prompts` to the end as the engine core does (one step at a time, or under asynchronous scheduling
    step N+1 scheduled and run before step N's update); checks per-step limits, pool invariants and that no
    block a launched step writes was freed. `aborts` {request index: n}: abort it (as a frontend's stop string
    would) once it has n output tokens; `late` {request index: k}: add it after k resolved steps; `order`
    collects ("schedule" | "update", step id); `hook(scheduler)` runs once the scheduler is built (tests wrap
    its methods). Returns ((output tokens, finish reason, stop reason) per request, scheduler, steps)."""
    sched = Scheduler(config, stop_checker, fault)
    if hook is not None:
        hook(sched)
    seqs = [Sequence(p, q, block_size=config.block_size) for p, q in zip(prompts, params, strict=True)]
    late = dict(late or {})
    for i, s in enumerate(seqs):
        if i not in late:
            sched.add(s)
    model, steps, inflight = FakeModel(config), [], deque()

    def launch() -> bool:
        out = sched.schedule()
        if not out.scheduled:
            assert inflight, "a step with requests left scheduled nothing"
            return False
        if order is not None:
            order.append(("schedule", out.step_id))
        assert out.num_batched_tokens == sum(s.num_new_tokens for s in out.scheduled)
        assert out.num_batched_tokens <= config.max_num_batched_tokens
        assert len(sched.running) <= config.max_num_seqs
        assert not {id(s) for s in out.preempted} & {id(s.seq) for s in out.scheduled}
        assert all(s.status is SequenceStatus.WAITING and s.block_table == [] for s in out.preempted)
        for s in out.scheduled:  # hashes cover known tokens only (the sequence's own hash function)
            assert s.seq.block_hashes == sequence_mod.extend_block_hashes([], s.seq.token_ids, config.block_size)
        sched.check_inflight_writes()
        logits, contexts = model(out, inflight[-1][1] if inflight else None, strict)
        inflight.append((out, _sample(out, logits), contexts))
        return True

    def resolve() -> None:
        out, tokens, contexts = inflight.popleft()
        if order is not None:
            order.append(("update", out.step_id))
        sched.update(out, tokens)
        if strict:
            for s, ctx in zip(out.scheduled, contexts, strict=True):
                assert ctx == s.seq.token_ids[: s.seq_len], f"{s.seq} read a wrong context"
        sched.kv.pool.check_invariants()
        sched.check_inflight_writes()
        steps.append(out)
        for i, n in (aborts or {}).items():
            if seqs[i].num_output_tokens >= n and not seqs[i].is_finished:
                sched.abort(seqs[i].request_id)

    while True:
        idle = not sched.has_unfinished and not inflight
        for i, k in list(late.items()):  # arrivals between steps (all of them, rather than idle)
            if len(steps) >= k or idle:
                sched.add(seqs[i])
                del late[i]
        if not sched.has_unfinished and not inflight:
            break
        if not config.async_scheduling:
            assert launch()
        elif not inflight:
            assert launch()
            launch()
        else:
            launch()
        resolve()
        assert len(steps) < 2000
    pool = sched.kv.pool
    assert all(b.ref_cnt == 0 for b in pool.blocks) and pool.num_free_blocks == pool.num_blocks - 1
    assert not sched.tables.table.any()  # every block-table row was released and zeroed
    return [(s.output_token_ids, s.finish_reason, s.stop_reason) for s in seqs], sched, steps


def workload(num, shared, seed):
    g = torch.Generator().manual_seed(seed)
    prefix = torch.randint(0, VOCAB, (shared,), generator=g).tolist()
    prompts = [
        prefix + torch.randint(0, VOCAB, (int(torch.randint(1, 12, (1,), generator=g)),), generator=g).tolist()
        for _ in range(num)
    ]
    params = [
        SamplingParams(
            temperature=0.0 if i % 2 == 0 else 0.8, top_k=8 if i % 3 == 0 else -1, seed=i, max_tokens=6 + i % 5
        )
        for i in range(num)
    ]
    return prompts, params


def cfg(**kw):
    base = dict(
        num_blocks=64,
        block_size=4,
        max_num_batched_tokens=64,
        max_num_seqs=8,
        max_model_len=64,
        enable_chunked_prefill=False,
        enable_prefix_caching=False,
    )
    return SchedulerConfig(**{**base, **kw})


@given(num=st.integers(2, 6), shared=st.integers(0, 13), seed=st.integers(0, 2**16))
def test_same_tokens_with_caching_chunking_and_preemption(num, shared, seed):
    """Every configuration, with synchronous and asynchronous scheduling, gives the tokens of the plain
    synchronous run."""
    prompts, params = workload(num, shared, seed)
    want, _, _ = run(cfg(), prompts, params)
    # A prompt of <= 24 tokens + <= 10 generated needs <= 9 blocks: 10 (9 usable) is the tightest cache.
    for config in (
        cfg(),
        cfg(enable_prefix_caching=True),
        cfg(enable_chunked_prefill=True, max_num_batched_tokens=8),
        cfg(enable_chunked_prefill=True, enable_prefix_caching=True, max_num_batched_tokens=8, max_num_seqs=3),
        cfg(num_blocks=10, enable_prefix_caching=True),  # 9 usable blocks: preemption is forced
        cfg(num_blocks=10, enable_chunked_prefill=True, max_num_batched_tokens=8),
    ):
        for overlap in (False, True):
            got, _, _ = run(dataclasses.replace(config, async_scheduling=overlap), prompts, params)
            assert got == want, (config, overlap)


@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "async"])
def test_the_equivalence_runs_really_hit_chunk_and_preempt(overlap):
    prompts, params = workload(6, 9, 7)
    _, cached, _ = run(cfg(enable_prefix_caching=True, max_num_seqs=2, async_scheduling=overlap), prompts, params)
    assert cached.num_prompt_tokens_hit >= 8 * 4  # later prompts reuse the 2 full shared blocks
    _, _, steps = run(
        cfg(enable_chunked_prefill=True, max_num_batched_tokens=8, async_scheduling=overlap), prompts, params
    )
    assert any(not s.samples for out in steps for s in out.scheduled)  # some prompt was split
    _, tight, steps = run(cfg(num_blocks=10, async_scheduling=overlap), prompts, params)
    assert tight.num_preemptions > 0 and any(out.preempted for out in steps)
    if overlap:  # some decode row really ran on a token its scheduler did not know yet
        assert any(s.prev_row >= 0 for out in steps for s in out.scheduled)


def test_negative_control_unchained_hashes_serve_a_wrong_prefix(monkeypatch):
    """A planted bug the suite must catch: block hashes without the parent link let a block of equal tokens
    at another position (after another prefix) hit."""
    from runner.engine.hashing import hash_block_tokens

    def unchained(hashes, token_ids, block_size):
        for j in range(len(hashes), len(token_ids) // block_size):
            hashes.append(hash_block_tokens(None, token_ids[j * block_size : (j + 1) * block_size]))
        return hashes

    prompts = [[1, 1, 1, 1, 2, 2, 2, 2, 3], [2, 2, 2, 2, 2, 2, 2, 2, 4]]
    params = [SamplingParams(temperature=0, max_tokens=2)] * 2
    config = cfg(enable_prefix_caching=True, max_num_seqs=1)
    run(config, prompts, params)  # chained: no false hit
    monkeypatch.setattr(sequence_mod, "extend_block_hashes", unchained)
    with pytest.raises(AssertionError, match="other positions"):
        run(config, prompts, params)


def test_max_num_seqs_caps_running_and_fcfs_order():
    prompts = [[1, 2, 3]] * 5
    params = [SamplingParams(temperature=0, max_tokens=3)] * 5
    _, _, steps = run(cfg(max_num_seqs=2), prompts, params)
    assert max(len(out.scheduled) for out in steps) == 2
    first_step = [s.seq.arrival for s in steps[0].scheduled]
    assert first_step == sorted(first_step) and len(first_step) == 2


def test_decodes_first_then_prefill_chunks_fill_the_budget():
    sched = Scheduler(cfg(enable_chunked_prefill=True, max_num_batched_tokens=8, max_num_seqs=4))
    early = Sequence([5, 6, 7], SamplingParams(temperature=0, max_tokens=10), block_size=4)
    sched.add(early)
    out = sched.schedule()
    sched.update(out, [9])  # early is decoding now
    long = Sequence(list(range(20)), SamplingParams(max_tokens=2), block_size=4)
    sched.add(long)
    out = sched.schedule()
    assert [(s.seq, s.num_new_tokens, s.samples) for s in out.scheduled] == [(early, 1, True), (long, 7, False)]
    assert out.num_batched_tokens == 8 and not out.is_decode
    sched.update(out, [3, 0])
    out = sched.schedule()
    assert [(s.seq, s.start, s.num_new_tokens) for s in out.scheduled] == [(early, 4, 1), (long, 7, 7)]
    assert long.output_token_ids == []  # a chunk samples nothing


def test_unchunked_prompt_waits_for_budget_in_fcfs_order():
    sched = Scheduler(cfg(max_num_batched_tokens=16, max_model_len=16))
    big = Sequence(list(range(10)), block_size=4)
    small = Sequence([1, 2], block_size=4)
    bigger = Sequence(list(range(12)), block_size=4)
    for s in (big, bigger, small):
        sched.add(s)
    out = sched.schedule()
    assert [s.seq for s in out.scheduled] == [big]  # bigger does not fit the 6 left; small may not jump it
    assert [s.status for s in (big, bigger, small)] == [
        SequenceStatus.RUNNING,
        SequenceStatus.WAITING,
        SequenceStatus.WAITING,
    ]


def test_preemption_takes_the_latest_arrival_and_recomputes_its_tokens():
    # 4 usable blocks of 4 tokens; two requests of 8 prompt tokens hold 2 (full, cached) blocks each.
    sched = Scheduler(cfg(num_blocks=5, max_model_len=12, enable_prefix_caching=True))
    a = Sequence(list(range(8)), SamplingParams(temperature=0, max_tokens=5), block_size=4)
    b = Sequence(list(range(10, 18)), SamplingParams(temperature=0, max_tokens=5), block_size=4)
    sched.add(a)
    sched.add(b)
    out = sched.schedule()
    assert len(out.scheduled) == 2 and sched.kv.pool.num_free_blocks == 0
    sched.update(out, [1, 2])  # both at 9 tokens: the K/V of the 9th needs a third block each
    out = sched.schedule()
    assert out.preempted == [b] and [s.seq for s in out.scheduled] == [a]
    assert b.status is SequenceStatus.WAITING and b.num_computed_tokens == 0 and b.block_table == []
    assert b.token_ids == [*range(10, 18), 2] and b.num_preemptions == 1 and sched.waiting[0] is b
    # b's blocks went back tail first, so a's new block evicted b's second block and kept its first.
    sched.update(out, [3])
    sched.abort(a.request_id)
    out = sched.schedule()  # b returns: its first block is a hit, its generated token is "prompt" now
    (entry,) = out.scheduled
    assert entry.seq is b and entry.start == 4 and entry.num_new_tokens == 5 and entry.samples
    assert entry.token_ids == [14, 15, 16, 17, 2]
    assert a.finish_reason is FinishReason.ABORT


def test_finish_rules():
    def step(sched, token):
        out = sched.schedule()
        return sched.update(out, [token] * len(out.scheduled))

    def new(params, eos=(2,), max_model_len=64, checker=None):
        sched = Scheduler(cfg(eos_token_ids=eos, max_model_len=max_model_len), checker)
        seq = Sequence([7, 8], params, block_size=4)
        sched.add(seq)
        return sched, seq

    sched, seq = new(SamplingParams(max_tokens=5))
    assert step(sched, 4) == [] and step(sched, 2) == [seq]
    assert (seq.finish_reason, seq.stop_reason, seq.output_token_ids) == (FinishReason.STOP, 2, [4, 2])
    sched, seq = new(SamplingParams(max_tokens=3, ignore_eos=True))
    assert step(sched, 2) == [] and step(sched, 2) == [] and step(sched, 2) == [seq]
    assert seq.finish_reason is FinishReason.LENGTH and seq.output_token_ids == [2, 2, 2]
    sched, seq = new(SamplingParams(max_tokens=9, ignore_eos=True, stop_token_ids=[5]))
    assert step(sched, 5) == [seq] and (seq.finish_reason, seq.stop_reason) == (FinishReason.STOP, 5)
    sched, seq = new(SamplingParams(max_tokens=9), max_model_len=4)
    assert step(sched, 3) == [] and step(sched, 3) == [seq] and seq.num_tokens == 4
    assert seq.finish_reason is FinishReason.LENGTH
    # stop strings: the API's hook sees the request and returns the matched string
    text = {3: "ab", 4: "c!", 6: "d"}
    checker = lambda s: "c!" if "c!" in "".join(text[t] for t in s.output_token_ids) else None
    sched, seq = new(SamplingParams(max_tokens=9, stop=["c!"]), checker=checker)
    assert step(sched, 3) == [] and step(sched, 4) == [seq] and seq.stop_reason == "c!"
    sched, seq = new(SamplingParams(max_tokens=2), checker=checker)  # no stop strings: hook not consulted
    assert step(sched, 4) == [] and step(sched, 4) == [seq] and seq.finish_reason is FinishReason.LENGTH


def test_step_inputs_match_the_attention_contract():
    sched = Scheduler(cfg(enable_chunked_prefill=True, max_num_batched_tokens=8))
    a = Sequence([1, 2, 3, 4, 5], SamplingParams(max_tokens=4), block_size=4)
    sched.add(a)
    sched.update(sched.schedule(), [6])
    b = Sequence(list(range(10)), block_size=4)
    sched.add(b)
    out = sched.schedule()
    inp = out.step_inputs(block_table_width=5)
    assert inp.input_ids.tolist() == [6, *range(7)] and inp.positions.tolist() == [5, *range(7)]
    assert inp.cu_seqlens_q.tolist() == [0, 1, 8] and inp.logits_indices.tolist() == [0, 7]
    assert inp.seq_lens.tolist() == [6, 7] and inp.sample_mask.tolist() == [True, False]
    assert inp.block_table.shape == (2, 5) and inp.block_table[0].tolist() == [*a.block_ids, 0, 0, 0]
    assert inp.slot_mapping[0] == a.block_ids[1] * 4 + 1
    assert (inp.input_ids.dtype, inp.slot_mapping.dtype, inp.block_table.dtype, inp.cu_seqlens_q.dtype) == (
        torch.int64,
        torch.int64,
        torch.int32,
        torch.int32,
    )
    with pytest.raises(ValueError, match="block_table_width"):
        out.step_inputs(block_table_width=1)
    sched.update(out, [0, 0])
    out = sched.schedule()
    assert not out.is_decode  # b still has 3 prompt tokens
    sched.update(out, [0, 0])
    assert sched.schedule().is_decode


def test_boundary_errors():
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        SchedulerConfig(num_blocks=8, max_num_batched_tokens=4, max_num_seqs=8)
    with pytest.raises(ValueError, match=r"max_num_batched_tokens.*max_model_len"):
        SchedulerConfig(
            num_blocks=8, max_num_batched_tokens=64, max_num_seqs=8, max_model_len=128, enable_chunked_prefill=False
        )
    with pytest.raises(ValueError, match="block_size"):
        SchedulerConfig(num_blocks=8, block_size=0)
    sched = Scheduler(cfg(num_blocks=4, max_model_len=20))
    with pytest.raises(ValueError, match="max_model_len"):
        sched.add(Sequence(list(range(20)), block_size=4))
    with pytest.raises(ValueError, match="blocks"):  # 13 + 4 - 1 tokens need 4 blocks, 3 usable
        sched.add(Sequence(list(range(13)), SamplingParams(max_tokens=4), block_size=4))
    with pytest.raises(ValueError, match="block_size"):
        sched.add(Sequence([1], block_size=8))
    sched.add(Sequence([1, 2], SamplingParams(max_tokens=2), block_size=4))
    out = sched.schedule()
    with pytest.raises(RuntimeError, match="update"):
        sched.schedule()
    with pytest.raises(ValueError, match="sampled_token_ids"):
        sched.update(out, [])
