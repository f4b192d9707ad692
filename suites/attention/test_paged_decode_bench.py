"""The paged decode benchmark definitions: sweep shapes, bytes/FLOPs models, split choice, and a CPU run of the
harness (eager mirror, SDPA on contiguous KV and FlexAttention paged checked against it; Triton skipped)."""

from __future__ import annotations

import torch

from bench.attention import paged_decode_inputs as pdi
from bench.registry import FAMILY_MODULES, discover
from suites.bench_runs import cpu_verdicts


def test_definitions():
    ops = discover()
    by_batch, by_context = ops["paged_decode_ctx4096"], ops["paged_decode_batch8"]
    full = {case.label: case for case in by_batch.sweeps["full"]}
    assert [case.x_value for case in full.values()] == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    assert full["B128_L4096"].shape == (128, 4096)
    assert [case.shape for case in by_context.sweeps["full"]] == [(8, 1 << n) for n in range(9, 16)]
    # 2 GiB of K and V at batch 128 x 4k, plus q and out (bf16, 32 x 128 per sequence each)
    assert by_batch.bytes_model(full["B128_L4096"]) == (2 << 30) + 2 * 128 * 32 * 128 * 2
    assert by_batch.flops_model(full["B128_L4096"]) == 4 * 128 * 32 * 4096 * 128
    assert by_batch.headline == (("triton", "sdpa-contiguous"), ("triton", "flex-paged"), ("triton", "memcpy"))
    assert by_batch.cuda_graph and by_batch.baselines == ("reference-mirror",)
    assert by_batch.impl("triton").gated
    assert not by_batch.impl("sdpa-contiguous").gated and not by_batch.impl("flex-paged").gated
    mirror = by_batch.impl("reference-mirror")
    assert mirror.skip_reason(full["B256_L4096"], "cpu") and mirror.skip_reason(full["B256_L4096"], "cuda") is None
    # families run in FAMILY_MODULES order; the many block-FP8 shapes stay last
    assert "bench.attention.paged_decode" in FAMILY_MODULES and FAMILY_MODULES[-1] == "bench.gemm.block_fp8"


def test_split_choice_fills_the_gpu_and_keeps_splits_long():
    assert pdi.num_splits_for(128, 4096) == 1  # 1024 programs already
    assert pdi.num_splits_for(8, 32768) == 8  # 64 x 8 = 512 programs of 256 blocks each
    assert pdi.num_splits_for(1, 4096) == 16  # capped: 256 blocks / 16 splits = MIN_SPLIT_BLOCKS
    assert pdi.num_splits_for(1, 512) == 2


def test_problem_layout():
    p = pdi.make_problem(2, 64, "cpu")
    assert p.q.shape == (2, 32, 128) and p.k_cache.shape == (8, 16, 8, 128)
    assert sorted(p.block_table.flatten().tolist()) == list(range(8)) and p.block_table.dtype == torch.int32
    # K/V-outermost: each plane is one [tokens, Hkv, D] run, so FlexAttention's cache is a view of it
    assert p.k_cache.flatten(0, 1)._base is not None
    k, _ = pdi.contiguous_kv(p)
    assert torch.equal(k[1, 3, 17], p.k_cache[p.block_table[1, 1], 1, 3])


def test_cpu_run_checks_the_peers_against_the_mirror():
    verdicts = cpu_verdicts("paged_decode_batch8", "B2_L64")
    assert verdicts["reference-mirror"] == "baseline"
    assert verdicts["sdpa-contiguous"].startswith("close")
    assert verdicts["flex-paged"].startswith("close")
    assert verdicts["triton"].startswith("skipped: Triton")
