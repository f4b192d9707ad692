"""The scheduler's decode fast path (runner.engine.decode_schedule, decode_update) against its general path.

Differential: before every `schedule()` and `update()` of a run, a deep copy of the scheduler takes the
general path on the same state; the step (row for row, block table included) and the whole state after it
(every request's counters, tokens, hashes and blocks, the pool's free queue, ref counts and prefix-cache
map, the persistent block table, the held blocks) must be equal, whether the fast path took the step or gave
up on it part way (a preemption due). End to end: random workloads that decode for long stretches, cross a
block boundary every 2 or 4 tokens and run out of blocks mid-decode give the same tokens with the fast path
on and off, synchronous and asynchronous, on the fake model of test_engine_scheduler (its tokens depend only
on what the cache really holds). Negative control: a fast path that stores each row's K/V one block further on
(the planted `decode_slot` fault) is caught by the fake model's read-back and by the comparison."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from runner.engine.block_pool import KVCacheBlock
from runner.engine.kv_cache_manager import cdiv
from runner.engine.sampling_params import SamplingParams
from runner.engine.scheduler import Scheduler
from suites.runner.test_engine_scheduler import VOCAB, cfg, run


def _state(sched: Scheduler, name) -> dict:
    """Everything a step changes, with requests named by `name(seq)` (the same request in a copy: the same)."""

    def seq_state(seq):
        return (
            name(seq),
            seq.status,
            list(seq.token_ids),
            list(seq.block_hashes),
            seq.num_computed_tokens,
            seq.num_inflight_tokens,
            seq.num_pending_samples,
            seq.last_step,
            seq.last_row,
            list(seq.block_ids),
            [b.block_id for b in seq.block_table],
            seq.num_cached_blocks,
            seq.table_row,
            seq.table_synced,
            seq.finish_reason,
            seq.stop_reason,
        )

    pool = sched.kv.pool
    return dict(
        running=[seq_state(s) for s in sched.running],
        waiting=[seq_state(s) for s in sched.waiting],
        free=[b.block_id for b in pool.free_queue],
        blocks=[(b.ref_cnt, b.block_hash) for b in pool.blocks],
        cached=sorted((h, b.block_id) for h, b in pool.cached.items()),
        table=sched.tables.table.tolist(),
        free_rows=list(sched.tables._free_rows),
        held={step: [[b.block_id for b in blocks] for blocks in held] for step, held in sched._held.items()},
        counters=(sched._next_step, sched.num_preemptions, sched.num_prompt_tokens_queried, len(sched.unresolved)),
    )


def _copy_blocks(sched: Scheduler, memo: dict) -> None:
    """Copies of the pool's blocks (and the free queue's sentinels) into `memo`, links included: deepcopy
    would follow the free queue's links one recursion level per block (past Python's limit at ~200 blocks)."""
    queue = sched.kv.pool.free_queue
    blocks = [queue._head, queue._tail, *sched.kv.pool.blocks]
    for block in blocks:
        memo[id(block)] = KVCacheBlock(block.block_id)
    for block in blocks:
        twin = memo[id(block)]
        twin.ref_cnt, twin.block_hash, twin.is_null = block.ref_cnt, block.block_hash, block.is_null
        twin.prev_free = memo[id(block.prev_free)] if block.prev_free is not None else None
        twin.next_free = memo[id(block.next_free)] if block.next_free is not None else None


def _twin(sched: Scheduler) -> tuple[Scheduler, dict]:
    """A deep copy that takes the general path, and a name for each request valid in both."""
    memo = {}
    _copy_blocks(sched, memo)
    for seq in _seqs(sched):  # shared, not copied: the twin samples nothing, and deepcopy of a torch.Generator
        if seq._generator is not None:  # drops a reference to None each time (torch 2.13): Python aborts
            memo[id(seq._generator)] = seq._generator  # after enough of them (a nightly hypothesis run)
    twin = copy.deepcopy(sched, memo)
    twin.config = dataclasses.replace(sched.config, decode_fast_path=False)
    twin.tables._rows = twin.tables.table.numpy()  # deepcopy copies the table's numpy view apart from it
    back = {id(copied): original for original, copied in ((o, memo[id(o)]) for o in _seqs(sched))}
    return twin, back


def _seqs(sched: Scheduler) -> list:
    rows = [e.seq for out in sched.unresolved for e in out.scheduled]
    return list({id(s): s for s in [*sched.running, *sched.waiting, *rows]}.values())


def _rows(out, name) -> list[tuple]:
    return [
        (name(e.seq), e.start, e.num_new_tokens, e.token_ids, e.slot_mapping, e.samples, e.prev_row)
        for e in out.scheduled
    ]


class Differential:
    """Wraps a scheduler's schedule and update: each call is checked against a general-path twin."""

    def __init__(self):
        self.fast_steps = self.fast_blocks = self.gave_up = 0

    def __call__(self, sched: Scheduler) -> None:
        schedule, update = sched.schedule, sched.update

        def checked_schedule():
            twin, back = _twin(sched)
            pure_before = [s.num_pending_samples for s in sched.running]
            blocks_before = sum(len(s.block_ids) for s in sched.running)
            out = schedule()
            want = Scheduler.schedule(twin)

            def same(s):  # a twin's request -> the original
                return back.get(id(s), s)

            assert _rows(out, id) == _rows(want, lambda s: id(same(s)))
            assert torch.equal(out.block_table, want.block_table)
            assert (out.num_batched_tokens, out.step_id, out.is_decode) == (
                want.num_batched_tokens,
                want.step_id,
                want.is_decode,
            )
            assert [id(s) for s in out.preempted] == [id(same(s)) for s in want.preempted]
            assert _state(sched, id) == _state(twin, lambda s: id(same(s)))
            if out.decode is not None:
                self.fast_steps += 1
                self.fast_blocks += sum(len(e.seq.block_ids) for e in out.scheduled) > blocks_before
            elif out.preempted and pure_before and out.is_decode:
                self.gave_up += 1  # a pure decode step that needed a preemption: the general path took it
            return out

        def checked_update(out, tokens):
            twin, back = _twin(sched)
            twin_out = twin.unresolved[0]
            if twin_out.decode is not None:  # the twin updates the same step through the general path
                twin_out._scheduled, twin_out.decode = twin_out.decode.entries(), None
            finished = update(out, tokens)
            want = Scheduler.update(twin, twin_out, tokens)

            def same(s):
                return back.get(id(s), s)

            assert [id(s) for s in finished] == [id(same(s)) for s in want]
            assert [(s.finish_reason, s.stop_reason) for s in finished] == [
                (s.finish_reason, s.stop_reason) for s in want
            ]
            assert _state(sched, id) == _state(twin, lambda s: id(same(s)))
            return finished

        sched.schedule, sched.update = checked_schedule, checked_update


@st.composite
def decode_workloads(draw):
    """(config, prompts, params, aborts, late): up to 6 requests of short prompts (sharing a prefix) that
    generate up to 40 tokens each (greedy or seeded), blocks of 2 or 4 tokens, EOS (token 3, unless
    ignore_eos) and random stop token ids, a cache from the tightest that `add` accepts up (preemption
    mid-decode), chunked or whole prefills, aborts and late arrivals."""
    bs = draw(st.sampled_from([2, 4]))
    n = draw(st.integers(1, 6))
    tokens = st.integers(0, VOCAB - 1)
    shared = draw(st.lists(tokens, max_size=6))
    prompts = [shared + draw(st.lists(tokens, min_size=1, max_size=8)) for _ in range(n)]
    params = [
        SamplingParams(
            temperature=draw(st.sampled_from([0.0, 0.8])),
            seed=i,
            max_tokens=draw(st.integers(1, 40)),
            stop_token_ids=draw(st.lists(tokens, max_size=1)),
            ignore_eos=draw(st.booleans()),
        )
        for i in range(n)
    ]
    max_model_len = 64
    need = max(cdiv(min(len(p) + q.max_tokens, max_model_len) - 1, bs) for p, q in zip(prompts, params, strict=True))
    chunked = draw(st.booleans())
    budget = draw(st.integers(6, 16)) if chunked else max_model_len
    config = cfg(
        num_blocks=max(need, 1) + 1 + draw(st.integers(0, 24)),
        block_size=bs,
        max_num_batched_tokens=budget,
        max_num_seqs=draw(st.integers(1, 6)),
        max_model_len=max_model_len,
        enable_chunked_prefill=chunked,
        enable_prefix_caching=draw(st.booleans()),
        eos_token_ids=(3,),
    )
    aborts = {i: draw(st.integers(1, 30)) for i in draw(st.sets(st.integers(0, n - 1), max_size=2))}
    late = {i: draw(st.integers(1, 20)) for i in draw(st.sets(st.integers(0, n - 1), max_size=2))}
    return config, prompts, params, aborts, late


@given(case=decode_workloads())
def test_the_fast_path_gives_the_general_paths_tokens(case):
    config, prompts, params, aborts, late = case
    want, _, _ = run(dataclasses.replace(config, decode_fast_path=False), prompts, params, aborts=aborts, late=late)
    for overlap in (False, True):
        mode = dataclasses.replace(config, async_scheduling=overlap)
        assert run(mode, prompts, params, aborts=aborts, late=late)[0] == want, overlap
        off = dataclasses.replace(mode, decode_fast_path=False)
        assert run(off, prompts, params, aborts=aborts, late=late)[0] == want, overlap


@given(case=decode_workloads())
def test_every_step_equals_the_general_paths_step_on_the_same_state(case):
    config, prompts, params, aborts, late = case
    for overlap in (False, True):
        mode = dataclasses.replace(config, async_scheduling=overlap)
        run(mode, prompts, params, aborts=aborts, late=late, hook=Differential())


def _long_decodes(num_blocks: int, **kw):
    """Five requests of 5 tokens that generate 30 each (greedy and seeded) in blocks of 4."""
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, VOCAB, (5,), generator=g).tolist() for _ in range(5)]
    params = [
        SamplingParams(temperature=0.0 if i % 2 else 0.8, seed=i, max_tokens=30, ignore_eos=True) for i in range(5)
    ]
    return cfg(num_blocks=num_blocks, **kw), prompts, params


@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "async"])
def test_the_checks_really_take_the_fast_path_cross_blocks_and_give_up(overlap):
    """Not vacuous: most steps take the fast path, some of them allocate a block, and with a cache too small
    for every request at once the fast path meets a pure decode step that needs a preemption."""
    config, prompts, params = _long_decodes(64, async_scheduling=overlap)
    check = Differential()
    run(config, prompts, params, hook=check)
    assert check.fast_steps >= 25 and check.fast_blocks >= 5
    config, prompts, params = _long_decodes(16, async_scheduling=overlap)  # 15 usable blocks; each needs 9
    check = Differential()
    run(config, prompts, params, hook=check)
    assert check.fast_steps >= 10 and check.gave_up >= 1


@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "async"])
def test_negative_control_a_fast_path_slot_one_block_off_is_caught(overlap):
    """The runs of the equivalence test see it (a slot in a block the request does not hold; K/V read back at
    other positions), and so does the step-by-step comparison (the step's slots differ)."""
    config, prompts, params = _long_decodes(64, async_scheduling=overlap)
    run(config, prompts, params)
    with pytest.raises(AssertionError, match=r"no longer holds it|reads K/V of other positions|wrong context"):
        run(config, prompts, params, fault="decode_slot")
    with pytest.raises(AssertionError, match=r"assert \[\("):  # the rows differ from the general path's
        run(config, prompts, params, fault="decode_slot", hook=Differential())
