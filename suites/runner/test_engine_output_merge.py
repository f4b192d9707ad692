"""Merging the engine core's StepOutputs when a frontend fell behind (runner.engine.output_merge), and the core
without a model that measures the frontend (runner.engine.ideal_core) in a real engine-core process.

The oracle of the merge is the output processor itself: the requests' tokens, texts (the real SmolLM2
tokenizer, multi-byte characters included), finish reasons and logprobs come out the same whether the steps are
processed one by one or merged in any grouping. Negative control: a merge that keeps only the last step's
tokens of a request is caught. The process test starts the ideal core through TOUCHSTONE_CORE_FACTORY, lets
steps queue, and reads them merged from `AsyncProcessClient.outputs()`."""

from __future__ import annotations

import asyncio
import os
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runner.engine import messages as m
from runner.engine.output_merge import merge_step_outputs
from runner.engine.output_processor import OutputProcessor
from runner.engine.sampling_params import SamplingParams
from suites.runner.conftest import require_model_packages

LOAD = m.CoreLoad(0, 0, 10, 10, 0, 0)


@pytest.fixture(scope="module")
def tokenizer():
    require_model_packages()
    from runner.model import load_frontend

    return load_frontend("smollm2-135m-instruct")[0]


def _lp(token: int) -> m.TokenLogprobs:
    return m.TokenLogprobs(token, -0.5 * (token % 7), 1 + token % 3)


@st.composite
def step_runs(draw):
    """Steps of up to 3 requests: each gets 1-3 tokens a step (ids of a multi-byte script among them: a
    character split over steps), request 1 asks for logprobs, each finishes with "length" at its last step."""
    lengths = [draw(st.integers(1, 6)) for _ in range(3)]
    steps, produced = [], [0, 0, 0]
    for s in range(max(lengths)):
        deltas = []
        for r in range(3):
            if s >= lengths[r]:
                continue
            ids = draw(st.lists(st.sampled_from([28, 1675, 30, 17829, 4090, 9, 216, 5315]), min_size=1, max_size=3))
            produced[r] += len(ids)
            last = s == lengths[r] - 1
            deltas.append(
                m.RequestDelta(
                    f"r{r}", ids, "length" if last else None, None, [_lp(t) for t in ids] if r == 1 else None
                )
            )
        steps.append(m.StepOutputs(deltas, m.CoreLoad(3, 0, 10, 10 - s, 0, 0, s), [f"r{s}"] if s < 3 else []))
    cuts = sorted(draw(st.sets(st.integers(1, max(1, len(steps) - 1)), max_size=len(steps))))
    groups = [steps[a:b] for a, b in zip([0, *cuts], [*cuts, len(steps)], strict=True) if steps[a:b]]
    return steps, groups


def _process(tokenizer, batches: list[m.StepOutputs]) -> dict:
    processor = OutputProcessor(tokenizer)
    for r in range(3):
        processor.add(f"r{r}", [1, 2], SamplingParams(max_tokens=64, logprobs=2 if r == 1 else None))
    got = {}
    for step in batches:
        updates, stopped = processor.process(step)
        assert stopped == []
        for u in updates:
            text, ids, lps, _ = got.get(u.request_id, ("", [], [], None))
            got[u.request_id] = (
                text + u.text,
                ids + list(u.new_token_ids),
                lps + list(u.new_logprobs or []),
                u.finish_reason,
            )
    return got


@settings(deadline=None)
@given(step_runs())
def test_merged_steps_give_what_the_steps_give_one_by_one(tokenizer, run):
    steps, groups = run
    merged = [merge_step_outputs(g) for g in groups]
    assert _process(tokenizer, merged) == _process(tokenizer, steps)
    assert [r for s in merged for r in s.accepted] == [r for s in steps for r in s.accepted]
    assert merged[-1].load == steps[-1].load


def test_negative_control_keeping_the_last_steps_tokens_is_caught(tokenizer):
    steps = [
        m.StepOutputs([m.RequestDelta("r0", [28, 1675])], LOAD),
        m.StepOutputs([m.RequestDelta("r0", [30], "length")], LOAD),
    ]
    bad = m.StepOutputs([m.RequestDelta("r0", [30], "length")], LOAD)  # what a merge that overwrites gives
    assert _process(tokenizer, [bad]) != _process(tokenizer, steps)
    assert _process(tokenizer, [merge_step_outputs(steps)]) == _process(tokenizer, steps)


def test_ideal_core_schedules_like_the_engine():
    """Budget 8, 2 seats: a 6-token and a 5-token prompt (chunked over two steps), then a third that waits for a
    seat; first tokens in the step that finishes a prompt, one a step after, "length" at max_tokens."""
    from runner.engine.core_build import EngineConfig
    from runner.engine.ideal_core import IdealCore

    core = IdealCore(EngineConfig(model="smollm2-135m", max_num_batched_tokens=8, max_num_seqs=2), 0.0, 0.0)
    params = SamplingParams(max_tokens=2, ignore_eos=True)
    for i, n in enumerate((6, 5, 3)):
        core.add_request(m.AddRequest(f"q{i}", [1] * n, params))
    steps = []
    while core.has_unfinished:
        steps.append([(d.request_id, len(d.new_token_ids), d.finish_reason) for d in core.step().deltas])
    assert steps == [
        [("q0", 1, None)],  # q0's 6 tokens and 2 of q1's
        [("q0", 1, "length"), ("q1", 1, None)],  # q1's last 3
        [("q1", 1, "length"), ("q2", 1, None)],  # q2 takes the freed seat
        [("q2", 1, "length")],
    ]
    with pytest.raises(ValueError, match="max_tokens"):
        core.add_request(m.AddRequest("big", [1] * 4095, params))


def test_core_factory_names_a_bad_spec():
    from runner.engine.core_process import core_factory

    with pytest.raises(ValueError, match="TOUCHSTONE_CORE_FACTORY: must be package"):
        core_factory({"TOUCHSTONE_CORE_FACTORY": "runner.engine.ideal_core"})
    assert callable(core_factory({}))


def test_a_frontend_behind_the_core_reads_its_steps_merged():
    """The ideal core (1 ms a step) in its own process: 4 requests of 40 tokens, read only after 0.3 s, arrive in
    far fewer StepOutputs than steps, every token once and in order."""
    from runner.engine.core_build import EngineConfig
    from runner.engine.core_client import AsyncProcessClient
    from runner.engine.ideal_core import TOKEN_BASE

    env = dict(os.environ, TOUCHSTONE_CORE_FACTORY="runner.engine.ideal_core:build", TOUCHSTONE_IDEAL_DECODE_MS="1")

    async def run():
        client = AsyncProcessClient(EngineConfig(model="smollm2-135m", max_model_len=128), env)
        await client.start()
        params = SamplingParams(max_tokens=40, ignore_eos=True)
        for i in range(4):
            client.send(m.AddRequest(f"q{i}", [1, 2, 3], params))
        time.sleep(0.3)  # the frontend busy elsewhere: the core's steps queue up
        tokens, messages = {f"q{i}": [] for i in range(4)}, 0
        async for out in client.outputs():
            messages += 1
            for d in out.deltas:
                tokens[d.request_id] += d.new_token_ids
            if all(len(t) == 40 for t in tokens.values()):
                break
        await client.close()
        return tokens, messages

    tokens, messages = asyncio.run(run())
    assert all(len(t) == 40 and min(t) >= TOKEN_BASE for t in tokens.values())
    assert messages < 20  # 40 steps, merged 16 at a time while they were queued
