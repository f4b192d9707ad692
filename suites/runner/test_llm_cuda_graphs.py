"""Decode CUDA graphs, the parts that run without a GPU: the static buffers' fill (step rows, then padding
rows that store nothing and attend to nothing), the next-size-up choice against the capture sizes, and the
eager fallback (always on CPU); the replay branch with fake graphs (what a capture records, re-run on the
buffers); and the warm-up step the CUDA KV sizing measures. Real capture and replay need CUDA:
suites/runner/test_llm_gpu.py compares graph and eager tokens there."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from runner.engine.capture_sizes import capture_sizes, padded_batch_size
from runner.engine.cuda_graphs import DecodeGraphs, DecodeInputs, StaticDecodeBuffers
from runner.model.attention import AttentionBatch


def _step(b: int, width: int) -> DecodeInputs:
    return DecodeInputs(
        input_ids=torch.arange(100, 100 + b, dtype=torch.int64),
        positions=torch.arange(10, 10 + b, dtype=torch.int64),
        slot_mapping=torch.arange(50, 50 + b, dtype=torch.int64),
        block_table=torch.arange(1, 1 + b * width, dtype=torch.int32).view(b, width),
        seq_lens=torch.arange(11, 11 + b, dtype=torch.int32),
    )


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


@given(fills=st.lists(st.tuples(st.integers(1, 8), st.integers(1, 4)), min_size=1, max_size=6))
def test_after_any_fills_the_rows_past_the_step_are_padding(fills):
    """Rows are reset only when an earlier, larger step left them; whatever the order of batch sizes and widths,
    the replayed rows are the step's, then padding."""
    buffers = StaticDecodeBuffers(max_batch=8, max_blocks=4, device="cpu")
    for b, width in fills:
        step = _step(b, width)
        buffers.fill(step, 8)
        assert buffers.input_ids.tolist() == step.input_ids.tolist() + [0] * (8 - b)
        assert buffers.positions.tolist() == step.positions.tolist() + [0] * (8 - b)
        assert buffers.slot_mapping.tolist() == step.slot_mapping.tolist() + [-1] * (8 - b)
        assert buffers.seq_lens.tolist() == step.seq_lens.tolist() + [0] * (8 - b)
        table = [row + [0] * (4 - width) for row in step.block_table.tolist()] + [[0] * 4] * (8 - b)
        assert buffers.block_table.tolist() == table


def test_fill_refuses_a_step_that_does_not_fit():
    buffers = StaticDecodeBuffers(max_batch=4, max_blocks=2, device="cpu")
    with pytest.raises(ValueError, match="size"):
        buffers.fill(_step(3, 2), 2)
    with pytest.raises(ValueError, match="block_table"):
        buffers.fill(_step(2, 3), 2)


@pytest.mark.parametrize(
    ("batch", "size"), [(1, 1), (3, 4), (5, 8), (9, 16), (255, 256), (257, 272), (512, 512), (513, None)]
)
def test_replay_picks_the_next_captured_size_up(batch, size):
    from kernels.platform import Platform

    hopper = Platform(
        backend="cuda", device_name="NVIDIA H200", device_count=1, capability=(9, 0), arch="sm_90", family="hopper"
    )
    sizes = capture_sizes(1024, 16384, hopper)
    assert sizes[-1] == 512
    assert padded_batch_size(batch, sizes) == size


def test_cpu_never_captures_and_runs_eager():
    calls = []

    def forward(ids, pos, batch):
        calls.append(batch)
        return torch.ones(ids.shape[0], 4)

    graphs = DecodeGraphs(
        forward, AttentionBatch, [1, 2, 4], max_blocks=4, hidden_size=4, dtype=torch.float32, device="cpu"
    )
    graphs.capture()
    assert not graphs.enabled and not graphs.graphs and graphs.buffers is None
    out = graphs.run(_step(3, 2), lambda: "eager batch")
    assert out.shape == (3, 4) and calls == ["eager batch"]


def test_kv_sizing_warm_up_batch_is_a_valid_prefill():
    from runner.engine.core_build import warmup_batch
    from runner.model.attention import make_batch

    ids, positions, batch, num_blocks = warmup_batch(block_size=16, max_tokens=70, max_model_len=24, device="cpu")
    want = make_batch([[1, 2], [3, 4]], [24, 24], [24, 24], block_size=16)  # 70 tokens: 2 sequences of 24
    assert num_blocks == 5 and ids.shape == positions.shape == (48,)
    assert positions.tolist() == list(range(24)) * 2
    for name in ("slot_mapping", "block_table", "seq_lens", "cu_seqlens_q", "logits_indices"):
        assert getattr(batch, name).tolist() == getattr(want, name).tolist(), name
    assert not batch.is_decode


class _FakeGraph:
    """Stands in for a captured torch.cuda.CUDAGraph of `size`: replay runs what the capture recorded (the
    forward over the static buffers' first `size` rows, into the shared hidden buffer)."""

    def __init__(self, graphs: DecodeGraphs, size: int):
        self.graphs, self.size, self.replays = graphs, size, 0

    def replay(self) -> None:
        g, n = self.graphs, self.size
        g.hidden[:n] = g.forward(g.buffers.input_ids[:n], g.buffers.positions[:n], g.buffers.batch(n, g.make_batch))
        self.replays += 1


def _row_forward(seen: list):
    """hidden row i = (token, position, slot, seq_len, sum of the block-table row) of row i; notes each call's
    batch size and whether it came from the static buffers."""

    def forward(ids, pos, batch):
        seen.append((ids.shape[0], batch.is_decode))
        cols = (ids, pos, batch.slot_mapping, batch.seq_lens, batch.block_table.sum(1))
        return torch.stack([c.to(torch.float32) for c in cols], dim=1)

    return forward


def _fake_captured(sizes: list[int], seen: list) -> DecodeGraphs:
    """DecodeGraphs as capture() leaves it on CUDA (buffers, hidden, one graph a size), built on the CPU."""
    graphs = DecodeGraphs(
        _row_forward(seen), AttentionBatch, sizes, max_blocks=4, hidden_size=5, dtype=torch.float32, device="cpu"
    )
    graphs.sizes = sorted(sizes)
    graphs.buffers = StaticDecodeBuffers(graphs.sizes[-1], 4, "cpu")
    graphs.hidden = torch.zeros(graphs.sizes[-1], 5)
    graphs.graphs = {size: _FakeGraph(graphs, size) for size in graphs.sizes}
    return graphs


def _want(step: DecodeInputs) -> torch.Tensor:
    return _row_forward([])(
        step.input_ids,
        step.positions,
        AttentionBatch(
            slot_mapping=step.slot_mapping,
            block_table=step.block_table,
            seq_lens=step.seq_lens,
            cu_seqlens_q=None,
            is_decode=True,
            logits_indices=None,
        ),
    )


def test_replay_pads_to_the_next_size_and_returns_only_the_real_rows():
    """Batches 5 -> 3 -> 1 -> 9 over graphs of sizes 1, 2, 4, 8: 5 and 3 replay the 8 and 4 graphs with padding
    rows (left by a larger step before: must be reset), 1 replays the 1 graph, 9 (> 8) goes eager."""
    seen = []
    graphs = _fake_captured([1, 2, 4, 8], seen)
    for b, width, size in [(5, 4, 8), (3, 2, 4), (1, 3, 1)]:
        step = _step(b, width)
        before = {s: g.replays for s, g in graphs.graphs.items()}
        out = graphs.run(step, lambda: pytest.fail("eager batch built for a batch a graph covers"))
        assert {s: g.replays - before[s] for s, g in graphs.graphs.items()} == {s: int(s == size) for s in before}
        assert out.shape == (b, 5) and torch.equal(out, _want(step))
        pad = graphs.hidden[b:size]  # what the forward saw in the padding rows: token 0 at 0, slot -1, length 0
        assert torch.equal(pad, torch.tensor([[0.0, 0.0, -1.0, 0.0, 0.0]]).expand(size - b, 5))
    assert [n for n, _ in seen] == [8, 4, 1]
    big = _step(9, 2)
    out = graphs.run(
        big,
        lambda: AttentionBatch(
            slot_mapping=big.slot_mapping,
            block_table=big.block_table,
            seq_lens=big.seq_lens,
            cu_seqlens_q=None,
            is_decode=True,
            logits_indices=None,
        ),
    )
    assert seen[-1] == (9, True) and torch.equal(out, _want(big))
