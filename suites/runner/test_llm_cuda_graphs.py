"""Decode CUDA graphs, the parts that run without a GPU: the static buffers' fill (step rows, then padding
rows that store nothing and attend to nothing), the next-size-up choice against the capture sizes, and the
eager fallback (always on CPU); and the warm-up step the CUDA KV sizing measures. Capture, replay and the
measurement itself need CUDA: the W1 bench exercises them."""

from __future__ import annotations

import pytest
import torch

from runner.engine.capture_sizes import capture_sizes, padded_batch_size
from runner.engine.cuda_graphs import DecodeGraphs, DecodeInputs, StaticDecodeBuffers
from runner.model.attention import AttentionBatch


def _step(b: int, width: int) -> DecodeInputs:
    return DecodeInputs(
        input_ids=torch.arange(100, 100 + b, dtype=torch.int64), positions=torch.arange(10, 10 + b, dtype=torch.int64),
        slot_mapping=torch.arange(50, 50 + b, dtype=torch.int64),
        block_table=torch.arange(1, 1 + b * width, dtype=torch.int32).view(b, width),
        seq_lens=torch.arange(11, 11 + b, dtype=torch.int32))


def test_fill_pads_to_the_size_and_forgets_a_larger_previous_step():
    buffers = StaticDecodeBuffers(max_batch=8, max_blocks=4, device="cpu")
    buffers.fill(_step(7, 4), 8)  # a larger step first: its rows must not survive as live rows
    buffers.fill(_step(3, 2), 4)
    assert buffers.input_ids[:4].tolist() == [100, 101, 102, 0]
    assert buffers.positions[:4].tolist() == [10, 11, 12, 0]
    assert buffers.slot_mapping[:4].tolist() == [50, 51, 52, -1]  # -1: the KV store skips the pad row
    assert buffers.seq_lens[:4].tolist() == [11, 12, 13, 0]  # 0: paged decode reads nothing of it
    assert buffers.block_table[:4].tolist() == [[1, 2, 0, 0], [3, 4, 0, 0], [5, 6, 0, 0], [0, 0, 0, 0]]
    batch = buffers.batch(4, AttentionBatch)
    assert batch.is_decode and batch.cu_seqlens_q.tolist() == [0, 1, 2, 3, 4]
    assert batch.logits_indices.tolist() == [0, 1, 2, 3]
    assert batch.block_table.data_ptr() == buffers.block_table.data_ptr()  # views: a graph reads the buffers


def test_fill_refuses_a_step_that_does_not_fit():
    buffers = StaticDecodeBuffers(max_batch=4, max_blocks=2, device="cpu")
    with pytest.raises(ValueError, match="size"):
        buffers.fill(_step(3, 2), 2)
    with pytest.raises(ValueError, match="block_table"):
        buffers.fill(_step(2, 3), 2)


@pytest.mark.parametrize(("batch", "size"), [(1, 1), (3, 4), (5, 8), (9, 16), (255, 256), (257, 272), (512, 512),
                                             (513, None)])
def test_replay_picks_the_next_captured_size_up(batch, size):
    from kernels.platform import Platform

    hopper = Platform(backend="cuda", device_name="NVIDIA H200", device_count=1, capability=(9, 0), arch="sm_90",
                      family="hopper")
    sizes = capture_sizes(1024, 16384, hopper)
    assert sizes[-1] == 512
    assert padded_batch_size(batch, sizes) == size


def test_cpu_never_captures_and_runs_eager():
    calls = []

    def forward(ids, pos, batch):
        calls.append(batch)
        return torch.ones(ids.shape[0], 4)

    graphs = DecodeGraphs(forward, AttentionBatch, [1, 2, 4], max_blocks=4, hidden_size=4, dtype=torch.float32,
                          device="cpu")
    graphs.capture()
    assert not graphs.enabled and not graphs.graphs and graphs.buffers is None
    out = graphs.run(_step(3, 2), lambda: "eager batch")
    assert out.shape == (3, 4) and calls == ["eager batch"]


def test_kv_sizing_warm_up_batch_is_a_valid_prefill():
    from runner.llm import warmup_batch
    from runner.model.attention import make_batch

    ids, positions, batch, num_blocks = warmup_batch(block_size=16, max_tokens=70, max_model_len=24, device="cpu")
    want = make_batch([[1, 2], [3, 4]], [24, 24], [24, 24], block_size=16)  # 70 tokens: 2 sequences of 24
    assert num_blocks == 5 and ids.shape == positions.shape == (48,)
    assert positions.tolist() == list(range(24)) * 2
    for name in ("slot_mapping", "block_table", "seq_lens", "cu_seqlens_q", "logits_indices"):
        assert getattr(batch, name).tolist() == getattr(want, name).tolist(), name
    assert not batch.is_decode
