"""The paged prefill benchmark definitions: sweep shapes, FLOPs/bytes models, problem layout, and a CPU run of
the harness (eager mirror and SDPA on contiguous q/K/V checked against it; Triton skipped)."""

from __future__ import annotations

import torch

from bench.attention import paged_decode_inputs as pdi
from bench.registry import FAMILY_MODULES, discover
from suites.bench_runs import cpu_verdicts


def test_definitions():
    op = discover()["paged_prefill_causal"]
    full = {case.label: case for case in op.sweeps["full"]}
    assert [case.shape for case in full.values()] == [(8, 512), (8, 1024), (8, 2048), (8, 4096)]
    assert [case.x_value for case in full.values()] == [512, 1024, 2048, 4096]
    bar = full["B8_S2048"]
    # causal: 2048 * 2049 / 2 (query, key) pairs a head, 4 * 128 FLOPs each, 8 sequences x 32 heads
    assert op.flops_model(bar) == 4 * 128 * 8 * 32 * (2048 * 2049 // 2)
    # K and V (8 heads) plus q and out (32 heads), bf16, every token once
    assert op.bytes_model(bar) == 2 * 8 * 2048 * 8 * 128 * 2 + 2 * 8 * 2048 * 32 * 128 * 2
    assert op.roof == "gemm" and op.compare_to == "sdpa-flash"
    assert op.headline == (("triton", "sdpa-flash"), ("triton", "sdpa-flash-expanded"), ("triton", "gemm"))
    assert op.cuda_graph and op.baselines == ("reference-mirror",)
    assert op.impl("triton").gated and not op.impl("sdpa-flash").gated and not op.impl("sdpa-flash-expanded").gated
    mirror = op.impl("reference-mirror")
    assert mirror.skip_reason(bar, "cpu") and mirror.skip_reason(full["B8_S4096"], "cuda") is None
    # right after the decode bench; the many block-FP8 shapes stay last
    decode = FAMILY_MODULES.index("bench.attention.paged_decode")
    assert FAMILY_MODULES[decode + 1] == "bench.attention.paged_prefill"
    assert FAMILY_MODULES[-1] == "bench.gemm.block_fp8"


def test_problem_layout():
    p = pdi.make_prefill_problem(2, 32, "cpu")
    assert p.q.shape == (64, 32, 128) and p.q.dtype == torch.bfloat16 and p.k_cache.shape == (4, 16, 8, 128)
    assert p.cu_seqlens.tolist() == [0, 32, 64] and p.seq_lens.tolist() == [32, 32]
    assert sorted(p.block_table.flatten().tolist()) == list(range(4)) and p.block_table.dtype == torch.int32
    k, _ = pdi.contiguous_kv(p)
    assert torch.equal(k[1, 3, 17], p.k_cache[p.block_table[1, 1], 1, 3])


def test_cpu_run_checks_sdpa_against_the_mirror():
    verdicts = cpu_verdicts("paged_prefill_causal", "B2_S64")
    assert verdicts["reference-mirror"] == "baseline"
    assert verdicts["sdpa-flash"].startswith("close") and verdicts["sdpa-flash-expanded"].startswith("close")
    assert verdicts["triton"].startswith("skipped: Triton")
