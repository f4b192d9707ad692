"""Asynchronous scheduling through the engine core (runner.engine.core) on a tiny dummy Llama on the CPU: the
overlap is real (step N+1 is scheduled and launched before step N is collected and updated; one step at a
time is the negative control), an abort of a request whose next step is in flight gives none of that step's
tokens, requests added between steps get the synchronous engine's tokens, and an idle core holds nothing in
flight. The identical-tokens checks on the real model are test_llm_generate's (parametrized by overlap)."""

from __future__ import annotations

import pytest

from runner import LLM, SamplingParams
from runner.engine.core_build import EngineConfig, build_core
from runner.engine.messages import AddRequest
from suites.runner import tiny_llama
from suites.runner.tiny_llama import TINY

pytestmark = pytest.mark.usefixtures("single_thread")

GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
PROMPTS = [[1, 2, 3], list(range(10, 30)), [40, 41, 42, 43, 44]]


@pytest.fixture(scope="module")
def tiny():
    return tiny_llama.model(TINY)


def _core(tiny, **kwargs):
    base = dict(device="cpu", block_size=4, max_model_len=64, max_num_batched_tokens=16, max_num_seqs=4)
    core, _ = build_core(EngineConfig(**{**base, **kwargs}), (tiny, None, TINY))
    return core


def _serve(core, requests: dict[str, tuple[list[int], SamplingParams]], between=None) -> dict[str, list[int]]:
    """Step the core until idle; `between(core, step index, outputs)` runs after each step (aborts, adds)."""
    tokens = {rid: [] for rid in requests}
    for rid, (prompt, params) in requests.items():
        core.add_request(AddRequest(rid, prompt, params))
    i = 0
    while core.has_unfinished:
        out = core.step()
        for delta in out.deltas:
            tokens.setdefault(delta.request_id, []).extend(delta.new_token_ids)
        if between is not None:
            between(core, i, out)
        i += 1
        assert i < 500
    return tokens


def _recorded(core) -> list[tuple[str, int]]:
    """(call, step id) of the scheduler's schedule / update and the runner's launch / collect, in order."""
    events, sched, runner = [], core.scheduler, core.runner
    schedule, update, launch, collect = sched.schedule, sched.update, runner.launch, runner.collect

    def on_schedule():
        out = schedule()
        if out.scheduled:
            events.append(("schedule", out.step_id))
        return out

    def on_update(out, tokens):
        events.append(("update", out.step_id))
        return update(out, tokens)

    def on_launch(out, times=None):
        events.append(("launch", out.step_id))
        return launch(out, times)

    def on_collect(step):
        events.append(("collect", step.output.step_id))
        return collect(step)

    sched.schedule, sched.update, runner.launch, runner.collect = on_schedule, on_update, on_launch, on_collect
    return events


@pytest.mark.parametrize("overlap", [True, False], ids=["async", "sync-negative-control"])
def test_step_n_plus_one_is_launched_before_step_n_is_resolved(tiny, overlap):
    core = _core(tiny, async_scheduling=overlap)
    events = _recorded(core)
    _serve(core, {str(i): (p, GREEDY) for i, p in enumerate(PROMPTS)})
    at = {event: i for i, event in enumerate(events)}
    last = max(step for kind, step in events if kind == "launch")
    assert last >= 8
    ahead = [
        at[("schedule", n + 1)] < at[("launch", n + 1)] < at[("collect", n)] < at[("update", n)] for n in range(last)
    ]
    assert all(ahead) if overlap else not any(ahead)
    if not overlap:  # one step at a time: N is resolved before N + 1 is scheduled
        assert all(at[("update", n)] < at[("schedule", n + 1)] for n in range(last))


def test_abort_of_a_request_in_flight_gives_none_of_its_later_tokens(tiny):
    """As a frontend's stop string does: the request is aborted after its first token, when its second step is
    already launched. That step's token for it must not appear; the other requests go on."""
    core = _core(tiny)

    def stop_after_first(core, i, out):
        if any(d.request_id == "b" for d in out.deltas):
            assert core.scheduler.unresolved and "b" in [
                s.seq.request_id for s in core.scheduler.unresolved[0].scheduled
            ]
            core.abort(["b"])

    got = _serve(core, {rid: (p, GREEDY) for rid, p in zip("abc", PROMPTS, strict=True)}, stop_after_first)
    assert len(got["b"]) == 1 and len(got["a"]) == len(got["c"]) == 8
    want = _serve(
        _core(tiny, async_scheduling=False), {rid: (p, GREEDY) for rid, p in zip("abc", PROMPTS, strict=True)}
    )
    assert got["a"] == want["a"] and got["c"] == want["c"] and got["b"] == want["b"][:1]
    pool = core.scheduler.kv.pool
    assert pool.num_free_blocks == pool.num_blocks - 1 and not core.has_unfinished


def test_requests_added_between_steps_get_the_synchronous_tokens(tiny):
    params = [
        GREEDY,
        SamplingParams(temperature=0.8, top_k=20, seed=5, max_tokens=8, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=6, stop_token_ids=[17, 52], ignore_eos=True),
    ]
    outputs = {}
    for overlap in (False, True):
        core = _core(tiny, async_scheduling=overlap)

        def arrive(core, i, out):
            if i in (1, 3):  # while the first request's next step is in flight (async)
                rid = f"late{i}"
                core.add_request(AddRequest(rid, PROMPTS[(i + 1) % 3], params[(i + 1) % 3]))

        outputs[overlap] = _serve(core, {"first": (PROMPTS[0], params[1])}, arrive)
        assert not core.has_unfinished
    assert outputs[True] == outputs[False] and set(outputs[True]) == {"first", "late1", "late3"}


def test_an_idle_core_holds_nothing_in_flight(tiny):
    llm = LLM(
        device="cpu",
        loaded=(tiny, None, TINY),
        block_size=4,
        max_model_len=64,
        max_num_batched_tokens=16,
        max_num_seqs=4,
    )
    params = [GREEDY, SamplingParams(temperature=0.0, max_tokens=1), SamplingParams(max_tokens=3, stop_token_ids=[5])]
    llm.generate(PROMPTS, params, use_tqdm=False)
    core = llm.engine
    pool = core.scheduler.kv.pool
    assert not core.has_unfinished and not core.scheduler.unresolved
    assert pool.num_free_blocks == pool.num_blocks - 1
    assert core.stats.steps == core.scheduler._next_step  # every launched step was resolved


def test_llm_takes_async_scheduling_off(tiny):
    kw = dict(
        device="cpu",
        loaded=(tiny, None, TINY),
        block_size=4,
        max_model_len=64,
        max_num_batched_tokens=16,
        max_num_seqs=4,
    )
    on, off = LLM(**kw), LLM(**kw, async_scheduling=False)
    assert on.engine.async_scheduling and not off.engine.async_scheduling
    assert [o.token_ids for o in on.generate(PROMPTS, GREEDY, use_tqdm=False)] == [
        o.token_ids for o in off.generate(PROMPTS, GREEDY, use_tqdm=False)
    ]
