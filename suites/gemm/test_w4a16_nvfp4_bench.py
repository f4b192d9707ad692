"""The W4A16 NVFP4 GEMM benchmark definition: sweep shapes, bytes/FLOPs models, and a CPU run of the harness
(eager mirror and bf16 matmul; the Triton rows are recorded skips on CPU)."""

from __future__ import annotations

from bench.registry import discover
from suites.bench_runs import cpu_verdicts


def test_definition():
    op = discover()["w4a16_nvfp4_gemm"]
    full = {case.label: case for case in op.sweeps["full"]}
    assert list(full) == ["M1", "M4", "M16", "M64", "M128", "M1024"]
    assert full["M1"].shape == (1, 8192, 8192)
    # 32 MiB of codes + 4 MiB of E4M3 scales (one per 16 weights) + x and y
    assert op.bytes_model(full["M1"]) == (32 << 20) + (4 << 20) + 8192 * 2 + 8192 * 2
    assert op.flops_model(full["M1024"]) == 2 * 1024 * 8192 * 8192
    assert op.impl("triton").gated
    assert not any(op.impl(name).gated for name in ("bf16-matmul", "dequantize-matmul", "reference-compiled"))
    triton = op.impl("triton")
    assert triton.skip_reason(full["M1"], "cpu") and triton.skip_reason(full["M1"], "cuda") is None


def test_cpu_run_checks_the_peer_against_the_mirror():
    verdicts = cpu_verdicts("w4a16_nvfp4_gemm", "M1", impls=["reference-eager", "bf16-matmul", "triton"])
    assert verdicts["reference-eager"] == "baseline"
    assert verdicts["bf16-matmul"].startswith("close")
    assert verdicts["triton"].startswith("skipped: Triton")
