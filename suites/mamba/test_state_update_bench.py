"""The selective-state-update benchmark definitions: sweeps, bytes model, problem layout, and a CPU run of the
harness (the compiled peer checked against the mirror; Triton skipped on the CPU)."""

from __future__ import annotations

import torch

from bench.mamba import state_update_inputs as inputs
from bench.registry import FAMILY_MODULES, discover
from suites.bench_runs import cpu_verdicts


def test_definitions():
    ops = discover()
    fp32, bf16 = ops["mamba_state_update_fp32state"], ops["mamba_state_update_bf16state"]
    full = {case.label: case for case in fp32.sweeps["full"]}
    assert [case.x_value for case in full.values()] == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
    # batch 256: 256 x 64 x 64 x 128 fp32 = 512 MiB of state read and written, plus bf16 x/z/out, dt, B, C
    small = 3 * 256 * 64 * 64 * 2 + 256 * 64 * 2 + 2 * 256 * 8 * 128 * 2 + 3 * 64 * 4 + 256 * 4
    assert fp32.bytes_model(full["B256"]) == 2 * (512 << 20) + small
    assert bf16.bytes_model(full["B256"]) == 2 * (256 << 20) + small
    for op in (fp32, bf16):
        assert op.roof == "memcpy" and op.cuda_graph and op.baselines == ("reference-mirror",)
        assert op.impl("triton").gated and not op.impl("reference-compiled").gated
        assert ("triton", "memcpy") in op.headline
    assert "bench.mamba.state_update" in FAMILY_MODULES and FAMILY_MODULES[-1] == "bench.gemm.block_fp8"


def test_problem_layout():
    p = inputs.make_problem(3, torch.float32, "cpu")
    assert p["state"].shape == (3, 64, 64, 128) and p["state"].dtype == torch.float32
    assert p["x"].dtype == torch.bfloat16 and p["B"].shape == (3, 8, 128)
    assert sorted(p["state_indices"].tolist()) == [0, 1, 2] and p["state_indices"].dtype == torch.int32
    assert bool((p["A"] < 0).all())


def test_cpu_run_checks_the_compiled_peer_against_the_mirror():
    verdicts = cpu_verdicts("mamba_state_update_bf16state", "B1")
    assert verdicts["reference-mirror"] == "baseline"
    assert verdicts["reference-compiled"].startswith("close")
    assert verdicts["triton"].startswith("skipped: Triton")
