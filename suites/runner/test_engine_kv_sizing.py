"""KV-cache block count from a memory fraction, and the memory-in-use figure it starts from."""

from __future__ import annotations

import pytest
import torch

from reference.kv.attention import FullAttentionSpec
from runner.engine import kv_sizing


def test_kv_blocks_from_memory_fraction():
    # SmolLM2-135M: 30 layers, 3 KV heads of 64, bf16, 16-token blocks: K + V = 12288 bytes a layer's block
    spec = FullAttentionSpec(block_size=16, num_kv_heads=3, head_size=64, dtype=torch.bfloat16)
    per_block = kv_sizing.bytes_per_block(spec, num_layers=30)
    assert per_block == 30 * 2 * 16 * 3 * 64 * 2 == 368_640
    total, used = 140 * 2**30, 10 * 2**30  # an H200's worth, 10 GiB weights + activations + context
    blocks = kv_sizing.num_kv_blocks(total, used, 0.9, per_block)
    assert blocks == (int(total * 0.9) - used) // per_block == 337_874
    assert kv_sizing.num_kv_blocks(total, used, 0.9, per_block, max_blocks=1000) == 1000
    with pytest.raises(ValueError, match=r"memory_fraction: 0\.05"):
        kv_sizing.num_kv_blocks(total, used, 0.05, per_block)  # 7 GiB < the 10 GiB in use
    with pytest.raises(ValueError, match="memory_fraction"):
        kv_sizing.num_kv_blocks(total, used, 1.5, per_block)
    with pytest.raises(ValueError, match="block_bytes"):
        kv_sizing.num_kv_blocks(total, used, 0.9, 0)


def test_measured_usage_counts_other_processes_and_the_peak(monkeypatch):
    gib = 2**30
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (100 * gib, 140 * gib))
    monkeypatch.setattr(
        torch.cuda,
        "memory_stats",
        lambda device: {
            "reserved_bytes.all.current": 30 * gib,
            "allocated_bytes.all.peak": 12 * gib,
            "allocated_bytes.all.current": 2 * gib,
        },
    )
    # 40 GiB not free: 30 reserved by torch (of which only the 12 GiB peak counts) + 10 held elsewhere
    assert kv_sizing.measured_usage("cuda:0") == (140 * gib, 22 * gib)


def test_measured_usage_reserves_the_warm_up_activations_again_for_the_graph_pool(monkeypatch):
    gib = 2**30
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (100 * gib, 140 * gib))
    monkeypatch.setattr(
        torch.cuda,
        "memory_stats",
        lambda device: {"reserved_bytes.all.current": 30 * gib, "allocated_bytes.all.peak": 12 * gib},
    )
    # weights 2 GiB allocated before the warm-up: its activation peak (10 GiB) is counted twice
    assert kv_sizing.measured_usage("cuda:0", graph_reserve_from=2 * gib) == (140 * gib, 32 * gib)
    assert kv_sizing.measured_usage("cuda:0", graph_reserve_from=None) == (140 * gib, 22 * gib)
