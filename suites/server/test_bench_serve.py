"""`touchstone bench serve`'s client and summary against the shared server: every request completes, token
counts come from the usage chunk, the timings are ordered as their definitions require (TTFT <= E2EL; one
ITL gap per chunk after the first: one a step, fewer when the server fell behind and sent several steps' tokens
in one chunk, as it does on a busy machine; TPOT = (E2EL - TTFT) / (n - 1))."""

from __future__ import annotations

import asyncio

import pytest

from bench.serve.client import random_prompts, run_point
from bench.serve.stats import summarize


@pytest.mark.parametrize("mode", [{"concurrency": 2}, {"rate": 50.0}])
def test_point_measures_every_request(server, mode):
    prompts = random_prompts(3, 6, seed=1)
    results, seconds = asyncio.run(run_point(server.base_url + "/v1/completions", server.model, prompts, 4, **mode))
    assert [r.ok for r in results] == [True] * 3, [r.error for r in results]
    for r in results:
        assert r.prompt_tokens == 6 and r.output_tokens == 4
        assert 0 < r.ttft <= r.e2el and len(r.itl) <= 3
        assert r.tpot == pytest.approx((r.e2el - r.ttft) / 3)
    row = summarize(results, seconds)
    assert row["completed"] == 3 and row["failed"] == 0 and row["output_tokens"] == 12
    assert row["ttft_p50_ms"] <= row["ttft_p99_ms"]
    if any(r.itl for r in results):  # none when every request's tokens came in one chunk
        assert row["itl_p50_ms"] <= row["itl_p99_ms"]
    assert row["output_tok_per_s"] == pytest.approx(12 / seconds)


def test_random_prompts_are_reproducible_and_distinct():
    a, b = random_prompts(4, 8, seed=3), random_prompts(4, 8, seed=3)
    assert a == b and len({tuple(p[:1]) for p in a}) == 4 and all(len(p) == 8 for p in a)


def test_the_report_carries_the_offline_engine_beside_the_served_one(tmp_path, device):
    """The whole command on the CPU: it launches its own server, then runs the same engine offline on the
    largest point's prompts, and the report has both figures and their ratio."""
    from bench import tables
    from bench.serve.cli import main

    if device != "cpu":
        pytest.skip("the CPU tier runs the whole command (the GPU serving report is made by hand on the H200)")
    server_args = "--threads 1 --kv-cache-bytes 33554432"
    argv = ["--concurrency", "1,2", "--num-prompts", "3", "--input-len", "8", "--output-len", "4"]
    argv += ["--device", "cpu", "--server-args", server_args, "--out", str(tmp_path)]
    assert main(argv) == 0
    (csv,) = tmp_path.glob("*/serve_concurrency.csv")
    frame = tables.read(csv, ["output_tok_per_s", "offline_output_tok_per_s", "served_over_offline"])
    assert list(frame["value"]) == ["1", "2"] and (frame["offline_output_tok_per_s"] > 0).all()
    ratio = frame["output_tok_per_s"] / frame["offline_output_tok_per_s"]
    assert frame["served_over_offline"].tolist() == pytest.approx(ratio.tolist())
    text = csv.with_suffix(".md").read_text()
    assert "served / offline" in text and "best of 3 runs" in text  # the peer: the fastest of 3 timed runs
