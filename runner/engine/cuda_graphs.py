"""Decode-only CUDA graphs: one graph per capture size, replayed with the batch padded up to the next size.

Graphs cover uniform decode steps only (one new token a sequence), as nano-vllm's do; prefill and mixed steps
have their own graphs (runner.engine.prefill_graphs), and a decode batch larger than the largest capture size
runs eagerly. All graphs
read one set of static input buffers sized for the largest capture size and share one memory pool (captured
largest first, so the smaller graphs fit inside the largest one's pool). Replay copies the step's inputs into
the buffers' first rows and pads the rest of the chosen size with rows that do nothing: slot -1 (the KV store
skips it), seq_len 0 (paged decode reads no key of it and writes 0), token 0 at position 0, block-table row of
null blocks (0). The logits are computed outside the graph, from the real rows only.

On CPU (and whenever `enabled` is false) nothing is captured: `run` always goes eager.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import torch

from runner.engine.capture_sizes import padded_batch_size

Forward = Callable[[torch.Tensor, torch.Tensor, object], torch.Tensor]  # (input_ids, positions, batch) -> hidden


@dataclasses.dataclass
class DecodeInputs:
    """One decode step, B rows: token, position, cache slot, block-table row, tokens in cache after the step."""

    input_ids: torch.Tensor  # int64 [B]
    positions: torch.Tensor  # int64 [B]
    slot_mapping: torch.Tensor  # int64 [B]
    block_table: torch.Tensor  # int32 [B, W], W <= the buffers' width
    seq_lens: torch.Tensor  # int32 [B]


def allocate_padding(buffers, rows: int, seqs: int, max_blocks: int, device) -> None:
    """A graph's static inputs, as padding: `rows` token rows (token 0 at position 0, cache slot -1: the KV store
    skips it) and `seqs` sequences (nothing in the cache, block-table rows of the null block 0)."""
    z = dict(device=device)
    buffers.input_ids = torch.zeros(rows, dtype=torch.int64, **z)
    buffers.positions = torch.zeros(rows, dtype=torch.int64, **z)
    buffers.slot_mapping = torch.full((rows,), -1, dtype=torch.int64, **z)
    buffers.block_table = torch.zeros(seqs, max_blocks, dtype=torch.int32, **z)
    buffers.seq_lens = torch.zeros(seqs, dtype=torch.int32, **z)


@torch.inference_mode()
def capture_all(forward: Forward, make_batch, buffers, hidden: torch.Tensor, sizes, device, pool=None):
    """One graph per size, largest first, into `pool` (a new one if None): the forward over the buffers' first
    `size` rows into `hidden`, after one warm-up run outside the capture (Triton compiles there). Returns
    ({size: graph}, pool)."""
    graphs = {}
    for size in sorted(sizes, reverse=True):
        ids, pos = buffers.input_ids[:size], buffers.positions[:size]
        batch = buffers.batch(size, make_batch)
        forward(ids, pos, batch)
        torch.cuda.synchronize(device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            hidden[:size] = forward(ids, pos, batch)
        pool = graph.pool() if pool is None else pool
        graphs[size] = graph
    if graphs:
        torch.cuda.synchronize(device)
    return graphs, pool


class StaticDecodeBuffers:
    """The graphs' input buffers, `max_batch` rows, block tables `max_blocks` wide, always holding either a
    step's rows or padding rows."""

    def __init__(self, max_batch: int, max_blocks: int, device: torch.device | str):
        self.max_batch, self.max_blocks = max_batch, max_blocks
        allocate_padding(self, max_batch, max_batch, max_blocks, device)
        z = dict(device=device)
        # Decode: sequence b's only query is row b, and it is the row sampled from; fixed for every size.
        self.cu_seqlens_q = torch.arange(max_batch + 1, dtype=torch.int32, **z)
        self.logits_indices = torch.arange(max_batch, dtype=torch.int64, **z)
        # Rows [0, live) may hold a step's rows; every row from `live` on is padding. A decode run's batch size
        # seldom changes, so most fills reset no row: 5 tensor ops less a step (each ~5-10 us of host time
        # to launch on CUDA, also when the slice is empty).
        self.live = 0

    def fill(self, step: DecodeInputs, size: int) -> None:
        """Rows [0, B) take the step; rows [B, size) become padding (what a previous larger step left there
        must not be attended to nor stored)."""
        b, width = step.input_ids.shape[0], step.block_table.shape[1]
        if not 1 <= b <= size <= self.max_batch:
            raise ValueError(f"size: need 1 <= batch {b} <= size {size} <= {self.max_batch}")
        if width > self.max_blocks:
            raise ValueError(f"block_table: {width} blocks a row, the buffers hold {self.max_blocks}")
        self.input_ids[:b].copy_(step.input_ids, non_blocking=True)
        self.positions[:b].copy_(step.positions, non_blocking=True)
        self.slot_mapping[:b].copy_(step.slot_mapping, non_blocking=True)
        self.seq_lens[:b].copy_(step.seq_lens, non_blocking=True)
        self.block_table[:b, :width].copy_(step.block_table, non_blocking=True)
        if width < self.max_blocks:
            self.block_table[:b, width:].zero_()
        if self.live > b:  # rows a larger step left, up to `size` read by the replay: padding again
            self.input_ids[b : self.live].zero_()
            self.positions[b : self.live].zero_()
            self.slot_mapping[b : self.live].fill_(-1)
            self.seq_lens[b : self.live].zero_()
            self.block_table[b : self.live].zero_()
        self.live = b

    def batch(self, size: int, make_batch: Callable[..., object]) -> object:
        """The AttentionBatch over the first `size` rows (views: a graph captured with it reads the buffers)."""
        return make_batch(
            slot_mapping=self.slot_mapping[:size],
            block_table=self.block_table[:size],
            seq_lens=self.seq_lens[:size],
            cu_seqlens_q=self.cu_seqlens_q[: size + 1],
            is_decode=True,
            logits_indices=self.logits_indices[:size],
        )


class DecodeGraphs:
    """Captured decode graphs for `sizes` (ascending) over `forward`; `run` replays or falls back to eager."""

    def __init__(
        self,
        forward: Forward,
        make_batch: Callable[..., object],
        sizes: Sequence[int],
        max_blocks: int,
        hidden_size: int,
        dtype: torch.dtype,
        device: torch.device | str,
        enabled: bool = True,
    ):
        self.forward, self.make_batch = forward, make_batch
        self.device = torch.device(device)
        self.enabled = bool(enabled) and self.device.type == "cuda" and len(sizes) > 0
        self.sizes = sorted(set(sizes)) if self.enabled else []
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.buffers = StaticDecodeBuffers(self.sizes[-1], max_blocks, device) if self.enabled else None
        self.hidden = torch.zeros(self.sizes[-1], hidden_size, dtype=dtype, device=device) if self.enabled else None

    def capture(self, pool=None) -> None:
        """Capture every size, largest first, into one pool (`pool`, e.g. the prefill graphs', or a new one).
        The buffers hold padding only, so the warm-up and captured runs store nothing into the cache."""
        if self.enabled:
            self.graphs, _ = capture_all(
                self.forward, self.make_batch, self.buffers, self.hidden, self.sizes, self.device, pool
            )

    def run(self, step: DecodeInputs, eager_batch: Callable[[], object]) -> torch.Tensor:
        """Hidden states [B, hidden] of the step's rows: a replay of the next size up, else the eager forward
        (`eager_batch` builds the step's own AttentionBatch only when needed)."""
        b = step.input_ids.shape[0]
        size = padded_batch_size(b, self.sizes) if self.graphs else None
        if size is None:
            return self.forward(step.input_ids, step.positions, eager_batch())
        self.buffers.fill(step, size)
        self.graphs[size].replay()
        return self.hidden[:b]
