"""The W4A16 MXFP4 GEMM benchmark definition: sweep shapes, bytes/FLOPs models, and a CPU run of the harness
(eager mirror and bf16 matmul; the Triton row is a recorded skip on CPU)."""

from __future__ import annotations

from bench.registry import discover
from suites.bench_runs import cpu_verdicts


def test_definition():
    op = discover()["w4a16_mxfp4_gemm"]
    full = {case.label: case for case in op.sweeps["full"]}
    assert list(full) == ["M1", "M4", "M16", "M64", "M128", "M1024"]
    assert full["M1"].shape == (1, 8192, 8192)
    # 32 MiB of codes + 2 MiB of scales + x and y
    assert op.bytes_model(full["M1"]) == (32 << 20) + (2 << 20) + 8192 * 2 + 8192 * 2
    assert op.flops_model(full["M1024"]) == 2 * 1024 * 8192 * 8192
    assert all(op.impl(name).gated for name in ("triton", "triton-prepared", "triton-fragments"))
    assert not op.impl("bf16-matmul").gated
    for name in ("triton", "triton-prepared", "triton-fragments"):
        triton = op.impl(name)
        assert triton.skip_reason(full["M1"], "cpu") and triton.skip_reason(full["M1"], "cuda") is None


def test_cpu_run_checks_the_peer_against_the_mirror():
    verdicts = cpu_verdicts("w4a16_mxfp4_gemm", "M1", impls=["reference-eager", "bf16-matmul", "triton"])
    assert verdicts["reference-eager"] == "baseline"
    assert verdicts["bf16-matmul"].startswith("close")
    assert verdicts["triton"].startswith("skipped: Triton")
