"""Decode CUDA-graph capture sizes per platform (kernels.platform.current_platform impersonated)."""

from __future__ import annotations

import pytest

import kernels.platform as platform_mod
from runner.engine.capture_sizes import capture_sizes, max_capture_size, padded_batch_size
from suites.harness.test_platform import probe

H200 = platform_mod.detect_platform(probe(cuda=True, name="NVIDIA H200", capability=(9, 0)))
B200 = platform_mod.detect_platform(probe(cuda=True, name="NVIDIA B200", capability=(10, 0)))
RTX5090 = platform_mod.detect_platform(probe(cuda=True, name="NVIDIA GeForce RTX 5090", capability=(12, 0)))
CPU = platform_mod.detect_platform(probe())


@pytest.fixture
def on(monkeypatch):
    def impersonate(platform):
        monkeypatch.setattr(platform_mod, "current_platform", platform, raising=False)

    return impersonate


def test_hopper_caps_at_512_with_vllm_h200_count(on):
    on(H200)
    sizes = capture_sizes(max_num_seqs=1024, max_num_batched_tokens=16384)
    # vLLM on an H200 with the LLM defaults captures 51 graphs
    assert len(sizes) == 51 and sizes[:5] == [1, 2, 4, 8, 16] and sizes[-3:] == [480, 496, 512]
    assert sizes == sorted(set(sizes)) and 248 in sizes and 252 not in sizes and 256 in sizes


@pytest.mark.parametrize("platform", [B200, RTX5090])
def test_blackwell_family_caps_at_1024(on, platform):
    on(platform)
    sizes = capture_sizes(max_num_seqs=2048, max_num_batched_tokens=16384)
    assert sizes[-1] == 1024 and len(sizes) == 3 + 31 + 49
    assert max_capture_size(2048, 16384) == 1024


def test_bounded_by_max_num_seqs_and_token_budget(on):
    on(B200)
    assert capture_sizes(max_num_seqs=100, max_num_batched_tokens=8192)[-3:] == [88, 96, 100]
    assert capture_sizes(max_num_seqs=512, max_num_batched_tokens=300)[-3:] == [272, 288, 300]
    assert capture_sizes(max_num_seqs=1, max_num_batched_tokens=1) == [1]
    assert capture_sizes(max_num_seqs=3, max_num_batched_tokens=64) == [1, 2, 3]
    on(CPU)
    assert capture_sizes(max_num_seqs=4096, max_num_batched_tokens=65536)[-1] == 512
    assert capture_sizes(max_num_seqs=4096, max_num_batched_tokens=65536, platform=B200)[-1] == 1024
    with pytest.raises(ValueError, match="max_num_seqs"):
        capture_sizes(max_num_seqs=0, max_num_batched_tokens=8)


def test_padded_batch_size():
    sizes = [1, 2, 4, 8, 16]
    assert [padded_batch_size(n, sizes) for n in (1, 3, 8, 9, 16, 17)] == [1, 4, 8, 16, 16, None]
    with pytest.raises(ValueError, match="n"):
        padded_batch_size(0, sizes)
