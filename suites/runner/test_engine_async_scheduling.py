"""Asynchronous scheduling in the scheduler (runner.engine.scheduler): step N+1 scheduled before step N's
update, with placeholder rows for tokens still in flight. Unit cases for each exact-semantics rule (the
pending row, a request ended by length not scheduled again, a request finished by a token in flight, a
preemption or an abort while a step is in flight), then a property test: random workloads (EOS and stop
token ids, tiny caches that force preemption, chunked prefill, prefix caching, aborts and late arrivals)
give the same tokens and finish reasons with and without overlap, on the fake model of
test_engine_scheduler (its tokens depend only on what the cache really holds). Negative controls: a
scheduler fed step N-1's tokens instead of N's, and one that frees blocks under a launched step."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runner.engine.kv_cache_manager import cdiv
from runner.engine.sampling_params import SamplingParams
from runner.engine.scheduler import PLACEHOLDER, Scheduler
from runner.engine.sequence import FinishReason, Sequence, SequenceStatus
from suites.runner.test_engine_scheduler import VOCAB, cfg, run, workload


def _async(**kw):
    return cfg(async_scheduling=True, **kw)


def test_pending_row_takes_the_token_of_the_step_in_flight():
    sched = Scheduler(_async(eos_token_ids=(2,)))
    seq = Sequence([5, 6, 7], SamplingParams(temperature=0, max_tokens=5), block_size=4)
    sched.add(seq)
    first = sched.schedule()
    second = sched.schedule()  # before first's update
    (entry,) = second.scheduled
    assert (first.step_id, second.step_id) == (0, 1)
    assert (entry.start, entry.num_new_tokens, entry.token_ids, entry.prev_row, entry.samples) == (
        3,
        1,
        [PLACEHOLDER],
        0,
        True,
    )
    assert (seq.num_computed_tokens, seq.num_inflight_tokens, seq.num_pending_samples) == (0, 4, 2)
    assert entry.slot_mapping == [seq.block_ids[0] * 4 + 3]
    with pytest.raises(RuntimeError, match="update"):
        sched.schedule()  # one step in flight at most
    with pytest.raises(RuntimeError, match="update"):
        sched.update(second, [9])  # steps resolve in order
    sched.update(first, [9])
    assert seq.token_ids == [5, 6, 7, 9] and (seq.num_computed_tokens, seq.num_inflight_tokens) == (3, 1)
    third = sched.schedule()
    assert third.scheduled[0].start == 4 and third.scheduled[0].prev_row == 0  # row 0 of `second`
    sched.update(second, [8])
    sched.update(third, [1])
    assert seq.output_token_ids == [9, 8, 1] and seq.num_computed_tokens == 5


@pytest.mark.parametrize("limit", ["max_tokens", "max_model_len"])
def test_a_request_its_token_in_flight_ends_by_length_is_not_scheduled_again(limit):
    """Its next position may lie past the K/V `add` sized it for; the step would be wasted anyway."""
    max_model_len, max_tokens = (64, 1) if limit == "max_tokens" else (5, 9)
    sched = Scheduler(_async(max_model_len=max_model_len))
    seq = Sequence([1, 2, 3, 4], SamplingParams(max_tokens=max_tokens), block_size=4)
    sched.add(seq)
    first = sched.schedule()
    second = sched.schedule()
    assert second.is_empty and len(sched.unresolved) == 1  # an empty step is nothing to update
    assert sched.update(first, [6]) == [seq] and seq.finish_reason is FinishReason.LENGTH
    assert sched.kv.pool.num_free_blocks == sched.kv.num_usable_blocks


def test_a_request_finished_by_a_token_in_flight_drops_its_next_row_and_holds_its_blocks():
    sched = Scheduler(_async(eos_token_ids=(2,)))
    seq = Sequence([5, 6, 7], SamplingParams(temperature=0, max_tokens=5), block_size=4)
    sched.add(seq)
    first, second = sched.schedule(), sched.schedule()
    free = sched.kv.pool.num_free_blocks
    assert sched.update(first, [2]) == [seq] and seq.finish_reason is FinishReason.STOP
    # `second` still writes slot 3 of the request's block: nobody else may get it before `second` resolved
    assert sched.kv.pool.num_free_blocks == free and not sched.has_unfinished
    sched.check_inflight_writes()
    assert sched.update(second, [4]) == []
    assert seq.output_token_ids == [2]  # the in-flight row's token was discarded
    assert sched.kv.pool.num_free_blocks == sched.kv.num_usable_blocks


def test_preempted_while_its_token_is_in_flight_keeps_the_token():
    """4 usable blocks, two 8-token prompts of 2 blocks each: the second step needs a third block for both, so
    the latest (b) is preempted while the first step still writes its blocks. Those stay held, so a preempts
    itself too; both keep the tokens the first step samples for them, and are recomputed with them."""
    sched = Scheduler(_async(num_blocks=5, max_model_len=12, enable_prefix_caching=True))
    a = Sequence(list(range(8)), SamplingParams(temperature=0, max_tokens=3), block_size=4)
    b = Sequence(list(range(10, 18)), SamplingParams(temperature=0, max_tokens=3), block_size=4)
    sched.add(a)
    sched.add(b)
    first = sched.schedule()
    second = sched.schedule()
    assert second.is_empty and second.preempted == [b, a]
    assert a.status is b.status is SequenceStatus.WAITING and a.num_pending_samples == b.num_pending_samples == 1
    assert sched.kv.pool.num_free_blocks == 0  # every block is written by `first`: held
    sched.check_inflight_writes()
    assert sched.update(first, [1, 2]) == []
    assert a.token_ids == [*range(8), 1] and b.token_ids == [*range(10, 18), 2]
    assert a.num_computed_tokens == 0 and sched.kv.pool.num_free_blocks == 4
    (entry,) = sched.schedule().scheduled  # a returns (first in line) with its token as prompt
    assert entry.seq is a and entry.start == 0 and entry.token_ids == [*range(8), 1] and entry.samples


def test_preempted_request_whose_token_in_flight_finishes_it_leaves_the_queue():
    sched = Scheduler(_async(num_blocks=5, max_model_len=12, eos_token_ids=(2,)))
    a = Sequence(list(range(8)), SamplingParams(temperature=0, max_tokens=3), block_size=4)
    b = Sequence(list(range(10, 18)), SamplingParams(temperature=0, max_tokens=3), block_size=4)
    sched.add(a)
    sched.add(b)
    first = sched.schedule()
    assert sched.schedule().preempted == [b, a]
    assert sched.update(first, [1, 2]) == [b]  # b's token is EOS: it finishes although it was waiting
    assert b.finish_reason is FinishReason.STOP and list(sched.waiting) == [a]


def test_abort_while_in_flight_discards_the_token_and_holds_the_blocks():
    sched = Scheduler(_async())
    seq = Sequence([5, 6, 7], SamplingParams(temperature=0, max_tokens=5), block_size=4)
    sched.add(seq)
    first, second = sched.schedule(), sched.schedule()
    sched.update(first, [9])
    free = sched.kv.pool.num_free_blocks
    sched.abort(seq.request_id)
    assert seq.finish_reason is FinishReason.ABORT and sched.kv.pool.num_free_blocks == free
    sched.check_inflight_writes()
    sched.update(second, [4])
    assert seq.output_token_ids == [9] and sched.kv.pool.num_free_blocks == sched.kv.num_usable_blocks


def test_step_n_plus_one_is_scheduled_before_step_n_is_updated():
    prompts, params = workload(4, 5, 3)

    def before(overlap: bool) -> list[bool]:
        """Per step N: was step N + 1 scheduled before N's update?"""
        order = []
        run(cfg(async_scheduling=overlap), prompts, params, order=order)
        at = {event: i for i, event in enumerate(order)}
        last = max(step for kind, step in order if kind == "schedule")
        return [at[("schedule", n + 1)] < at[("update", n)] for n in range(last)]

    assert len(before(True)) > 5 and all(before(True))
    assert not any(before(False))  # negative control: one step at a time


@st.composite
def workloads(draw):
    """(config, prompts, params, aborts, late): up to 6 requests sharing a random prefix, greedy or seeded
    sampling, EOS (token 3, unless ignore_eos) and random stop token ids; a cache from the tightest that
    `add` accepts up; chunked or whole prefills; some requests aborted after a few tokens, some arriving
    after a few steps."""
    bs = draw(st.sampled_from([2, 4]))
    n = draw(st.integers(1, 6))
    tokens = st.integers(0, VOCAB - 1)
    shared = draw(st.lists(tokens, max_size=10))
    prompts = [shared + draw(st.lists(tokens, min_size=1, max_size=12)) for _ in range(n)]
    params = [
        SamplingParams(
            temperature=draw(st.sampled_from([0.0, 0.8])),
            top_k=draw(st.sampled_from([-1, 5])),
            seed=i,
            max_tokens=draw(st.integers(1, 10)),
            stop_token_ids=draw(st.lists(tokens, max_size=2)),
            ignore_eos=draw(st.booleans()),
        )
        for i in range(n)
    ]
    max_model_len = 64
    need = max(cdiv(min(len(p) + q.max_tokens, max_model_len) - 1, bs) for p, q in zip(prompts, params, strict=True))
    chunked = draw(st.booleans())
    budget = draw(st.integers(2, 16)) if chunked else max_model_len
    config = cfg(
        num_blocks=max(need, 1) + 1 + draw(st.integers(0, 12)),
        block_size=bs,
        max_num_batched_tokens=budget,
        max_num_seqs=draw(st.integers(1, min(8, budget))),
        max_model_len=max_model_len,
        enable_chunked_prefill=chunked,
        enable_prefix_caching=draw(st.booleans()),
        eos_token_ids=(3,),
    )
    aborts = {i: draw(st.integers(1, 5)) for i in draw(st.sets(st.integers(0, n - 1), max_size=2))}
    late = {i: draw(st.integers(1, 6)) for i in draw(st.sets(st.integers(0, n - 1), max_size=2))}
    return config, prompts, params, aborts, late


@given(case=workloads())
def test_async_scheduling_gives_the_synchronous_tokens(case):
    config, prompts, params, aborts, late = case
    want, _, _ = run(config, prompts, params, aborts=aborts, late=late)
    got, _, _ = run(dataclasses.replace(config, async_scheduling=True), prompts, params, aborts=aborts, late=late)
    assert got == want


def test_negative_control_step_n_minus_one_tokens_are_caught():
    """Planted bug: a pending row is fed the request's last known token (step N-1's) instead of the one step N
    samples. The async-vs-sync comparison sees other tokens; the fake model's input check fails too."""
    prompts, params = workload(4, 5, 3)
    want, _, _ = run(cfg(), prompts, params)
    got, _, _ = run(_async(), prompts, params, fault="stale_placeholder", strict=False)
    assert got != want
    with pytest.raises(AssertionError, match="wrong ids"):
        run(_async(), prompts, params, fault="stale_placeholder")


def test_negative_control_blocks_freed_under_a_launched_step_are_caught():
    """Planted bug: a leaving request's blocks go back at once although the next step (already launched)
    writes them; the in-flight check must see it."""
    prompts, params = workload(4, 5, 3)
    params = [dataclasses.replace(p, stop_token_ids=list(range(VOCAB)), max_tokens=4) for p in params]
    run(_async(), prompts, params)  # the first token stops every request: each leaves with a row in flight
    with pytest.raises(AssertionError, match="no longer holds it"):
        run(_async(), prompts, params, fault="early_free")


def test_unknown_fault_is_refused():
    with pytest.raises(ValueError, match="fault"):
        Scheduler(cfg(), fault="nope")
