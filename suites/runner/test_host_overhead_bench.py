"""bench.llm.host_overhead runs the real engine loop with its stand-in model: every timed call is one
rows-row decode step launched and one resolved, each phase was timed, the stand-in's greedy token is what
every request generates, and the command prints a row per scheduling mode (no speed is asserted)."""

from __future__ import annotations

import pytest
import torch

from bench.llm import host_overhead


@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("fast", [True, False], ids=["fast-path", "general-path"])
def test_timed_calls_are_steady_decode_steps(overlap, fast):
    calls = host_overhead.measure(rows=6, steps=4, warmup=2, async_scheduling=overlap, fast_path=fast)
    assert len(calls) == 4
    for call in calls:
        assert call.steps == [(6, True), (6, True)]
        assert all(call.seconds[phase] > 0 for phase in ("schedule", "launch", "update", "deltas", "output"))
        assert call.total >= sum(call.seconds.values())
    ms = host_overhead.summary(calls)
    assert set(ms) == {*host_overhead.PHASES, "other", "total", "median"}


def test_stand_in_samples_its_fixed_token():
    config = host_overhead.stand_in_config()
    model = host_overhead.StandInModel(config, max_tokens=8, max_rows=4)
    ids = torch.zeros(3, dtype=torch.int64)
    logits = model.compute_logits(model(ids, ids, None, []))
    assert logits.argmax(dim=-1).tolist() == [host_overhead.TOKEN] * 3


def test_command_prints_both_modes(capsys):
    assert host_overhead.main(["--rows", "4", "--steps", "3", "--warmup", "1"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("host ms per 4-row decode step") and [line.split()[0] for line in out[2:]] == [
        "sync",
        "async",
    ]
