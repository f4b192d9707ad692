"""The conv1d-update benchmark definitions: sweep, bytes model, problem layout, and a CPU run of the harness (the
compiled peer checked against the mirror; Triton skipped on the CPU)."""

from __future__ import annotations

import torch

from bench.mamba import conv1d_update as bench_op
from bench.registry import discover
from suites.bench_runs import cpu_verdicts


def test_definitions():
    op = discover()["mamba_conv1d_update"]
    full = {case.label: case for case in op.sweeps["full"]}
    assert [case.x_value for case in full.values()] == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
    # batch 256: 3 state rows read and written + x + out of 6144 bf16 channels a request, weight 4 taps + bias
    assert op.bytes_model(full["B256"]) == (256 * (2 * 3 + 2) * 6144 + 6144 * 5) * 2 + 256 * 4
    assert op.roof == "memcpy" and op.cuda_graph and op.baselines == ("reference-mirror",)
    assert op.impl("triton").gated and not op.impl("reference-compiled").gated


def test_problem_layout():
    p = bench_op.make_problem(3, "cpu")
    assert p["x"].shape == (3, 6144) and p["conv_state"].shape == (3, 3, 6144) and p["weight"].shape == (6144, 4)
    assert p["conv_state"].dtype == torch.bfloat16 and p["activation"] == "silu"
    assert sorted(p["state_indices"].tolist()) == [0, 1, 2]


def test_compiled_math_matches_the_mirror_state_bit_for_bit():
    """The peer's state update is a copy (window shift): its new state must equal the mirror's exactly."""
    p = bench_op.make_problem(4, "cpu")
    mine, ref = (dict(p, conv_state=p["conv_state"].clone()) for _ in range(2))
    bench_op._compiled_math(**mine)
    bench_op.causal_conv1d_update(**ref)
    assert torch.equal(mine["conv_state"], ref["conv_state"])


def test_cpu_run_checks_the_compiled_peer_against_the_mirror():
    verdicts = cpu_verdicts("mamba_conv1d_update", "B2")
    assert verdicts["reference-mirror"] == "baseline"
    assert verdicts["reference-compiled"].startswith("close")
    assert verdicts["triton"].startswith("skipped: Triton")
