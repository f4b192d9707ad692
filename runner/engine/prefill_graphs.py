"""Prefill and mixed-step CUDA graphs: one graph per token-count bucket, replayed with the step padded up to the
next bucket. Eagerly, a step with prompt tokens launches every kernel of the forward from Python (~150
launches for SmolLM2-135M); an 8,192-token prefill step of that model spent ~33 ms of host work on the H200
against ~7 ms of GPU work, so a server's prefill waves stalled the decode steps queued behind them. A replay
is one launch. vLLM captures such steps too (piecewise graphs around its attention; here the attention
kernels read all their metadata from device tensors and take their grids from the padded shapes, so the
whole forward is captured).

Every graph covers `max_seqs` sequences and its bucket's `size` token rows; a step of B sequences and T rows is
written into the first rows of one set of static buffers and the rest made padding:
- rows [T, size): token 0 at position 0, cache slot -1 (the KV store skips it). They belong to no sequence, so
  paged prefill never writes their attention output; every other op of the forward is row by row, so what
  those rows hold stays in them, and the logits are taken from the real rows only.
- sequences [B, max_seqs): no new token (cu_seqlens_q = T), no token in the cache (seq_len 0), a block-table
  row of the null block: the prefill kernel's programs for them return at once.
Sizes: 512 tokens, then 1.5x and 2x steps (512, 768, 1024, 1536, ...) up to the token budget, which is always a
size; a step larger than the budget cannot happen, and padding wastes at most a third of a step's rows. The
graphs are captured largest first into one memory pool that the decode graphs then share: the pool holds
one forward of the whole token budget, which the KV sizing already reserves (runner.engine.kv_sizing).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from runner.engine.cuda_graphs import Forward, allocate_padding, capture_all

SMALLEST = 512


def prefill_capture_sizes(max_tokens: int) -> list[int]:
    """Token buckets, ascending: 512 * 2**i and 768 * 2**i below `max_tokens`, then `max_tokens` itself."""
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise ValueError(f"max_num_batched_tokens: must be an int >= 1, got {max_tokens!r}")
    sizes, base = set(), SMALLEST
    while base < max_tokens:
        sizes.update(s for s in (base, base * 3 // 2) if s < max_tokens)
        base *= 2
    return sorted(sizes | {max_tokens})


class StaticPrefillBuffers:
    """The graphs' inputs: `max_tokens` rows, `max_seqs` sequences, block tables `max_blocks` wide."""

    def __init__(self, max_tokens: int, max_seqs: int, max_blocks: int, device: torch.device | str):
        self.max_tokens, self.max_seqs, self.max_blocks = max_tokens, max_seqs, max_blocks
        allocate_padding(self, max_tokens, max_seqs, max_blocks, device)
        z = dict(device=device)
        self.cu_seqlens_q = torch.zeros(max_seqs + 1, dtype=torch.int32, **z)
        self.logits_indices = torch.zeros(max_seqs, dtype=torch.int64, **z)  # unread by the forward
        self.rows = self.seqs = 0  # rows [0, rows) and sequences [0, seqs) may hold the last step's values

    def fill(self, inputs, size: int) -> None:
        """Rows [0, T) and sequences [0, B) take the step (`inputs`: runner.engine.scheduler_output.StepInputs);
        what a previous larger step left beyond them becomes padding again."""
        t, b = inputs.input_ids.shape[0], inputs.seq_lens.shape[0]
        width = inputs.block_table.shape[1]
        if not 1 <= t <= size <= self.max_tokens or not 1 <= b <= self.max_seqs:
            raise ValueError(
                f"size: need 1 <= tokens {t} <= size {size} <= {self.max_tokens} and 1 <= sequences {b} <= "
                f"{self.max_seqs}"
            )
        if width > self.max_blocks:
            raise ValueError(f"block_table: {width} blocks a row, the buffers hold {self.max_blocks}")
        self.input_ids[:t].copy_(inputs.input_ids, non_blocking=True)
        self.positions[:t].copy_(inputs.positions, non_blocking=True)
        self.slot_mapping[:t].copy_(inputs.slot_mapping, non_blocking=True)
        if self.rows > t:
            self.input_ids[t : self.rows].zero_()
            self.positions[t : self.rows].zero_()
            self.slot_mapping[t : self.rows].fill_(-1)
        self.seq_lens[:b].copy_(inputs.seq_lens, non_blocking=True)
        self.block_table[:b, :width].copy_(inputs.block_table, non_blocking=True)
        if width < self.max_blocks:
            self.block_table[:b, width:].zero_()
        if self.seqs > b:
            self.seq_lens[b : self.seqs].zero_()
            self.block_table[b : self.seqs].zero_()
        self.cu_seqlens_q[: b + 1].copy_(inputs.cu_seqlens_q, non_blocking=True)
        self.cu_seqlens_q[b + 1 :].fill_(t)  # the padding sequences start (and end) after the last real row
        self.rows, self.seqs = t, b

    def batch(self, size: int, make_batch: Callable[..., object]) -> object:
        """The AttentionBatch of a `size`-row graph (views of the buffers: the graph reads them at replay)."""
        return make_batch(
            slot_mapping=self.slot_mapping[:size],
            block_table=self.block_table,
            seq_lens=self.seq_lens,
            cu_seqlens_q=self.cu_seqlens_q,
            is_decode=False,
            logits_indices=self.logits_indices,
        )


class PrefillGraphs:
    """Captured prefill graphs for token buckets `sizes`; `run` replays the next size up or runs eagerly."""

    def __init__(
        self,
        forward: Forward,
        make_batch: Callable[..., object],
        sizes: Sequence[int],
        max_seqs: int,
        max_blocks: int,
        hidden_size: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ):
        self.forward, self.make_batch = forward, make_batch
        self.device = torch.device(device)
        self.sizes = sorted(set(sizes)) if self.device.type == "cuda" else []
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.buffers = self.hidden = None
        if self.sizes:
            self.buffers = StaticPrefillBuffers(self.sizes[-1], max_seqs, max_blocks, device)
            self.hidden = torch.zeros(self.sizes[-1], hidden_size, dtype=dtype, device=device)

    def capture(self, pool=None):
        """Capture every size, largest first, into `pool` (a new one if None); returns the pool. The buffers hold
        padding only (no sequence, every slot -1), so the warm-up and captured runs store nothing."""
        if not self.sizes:
            return pool
        self.graphs, pool = capture_all(
            self.forward, self.make_batch, self.buffers, self.hidden, self.sizes, self.device, pool
        )
        return pool

    def run(self, inputs, eager_batch: Callable[[], object]) -> torch.Tensor:
        """Hidden states [T, hidden] of the step's rows: a replay of the next size up, else the eager forward."""
        t = inputs.input_ids.shape[0]
        size = next((s for s in self.sizes if s >= t), None) if self.graphs else None
        if size is None or inputs.seq_lens.shape[0] > self.buffers.max_seqs:
            return self.forward(inputs.input_ids, inputs.positions, eager_batch())
        self.buffers.fill(inputs, size)
        self.graphs[size].replay()
        return self.hidden[:t]
