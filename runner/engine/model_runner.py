"""The model runner: one scheduled step in, one sampled token per sampling request out.

`execute(output)` flattens the SchedulerOutput into the model's inputs (input ids, positions and a
runner.model.attention.AttentionBatch; runner.engine.step_tensors, two host-to-device copies), runs the
model (a decode step through the CUDA graph of the next size up where graphs are captured, else eagerly),
computes the logits of the rows that sample (each sampling request's last new token; a prompt chunk that is
not the last samples nothing, so a seeded request's generator never advances on it) and samples them
(runner.engine.sampler).

The KV cache is one buffer for all layers (reference.kv.allocate with a FullAttentionSpec in the model
dtype, NHD, K then V in each block); kv_caches[i] = (K view, V view) of layer i. Block 0 is the block
pool's null block: never handed out, it is what padded block-table entries point at.
"""

from __future__ import annotations

import dataclasses
import time

import torch

from reference.kv.allocate import KVCache, allocate_kv_cache
from reference.kv.attention import FullAttentionSpec
from runner.engine.cuda_graphs import DecodeGraphs, DecodeInputs
from runner.engine.sampler import SamplingBatch, is_greedy, sample
from runner.engine.scheduler import SchedulerOutput, StepInputs
from runner.engine.step_tensors import StepPacker
from runner.model.attention import AttentionBatch


def cache_spec(config, block_size: int, dtype: torch.dtype) -> FullAttentionSpec:
    """The model's per-layer KV block: its KV heads and head size, in the model dtype, NHD."""
    return FullAttentionSpec(
        block_size=block_size, num_kv_heads=config.num_key_value_heads, head_size=config.head_dim, dtype=dtype
    )


def allocate_kv(
    config, num_blocks: int, block_size: int, dtype: torch.dtype, device: torch.device | str
) -> tuple[KVCache, list[tuple[torch.Tensor, torch.Tensor]]]:
    cache = allocate_kv_cache(
        cache_spec(config, block_size, dtype), num_blocks, config.num_hidden_layers, device=device
    )
    return cache, [(view["k"], view["v"]) for view in cache.views]


def attention_batch(inputs: StepInputs) -> AttentionBatch:
    return AttentionBatch(
        slot_mapping=inputs.slot_mapping,
        block_table=inputs.block_table,
        seq_lens=inputs.seq_lens,
        cu_seqlens_q=inputs.cu_seqlens_q,
        is_decode=inputs.is_decode,
        logits_indices=inputs.logits_indices,
    )


@dataclasses.dataclass
class StepTimes:
    """Seconds spent per phase of the step, summed over steps (the engine adds schedule/postprocess)."""

    prepare_s: float = 0.0
    model_s: float = 0.0
    sample_s: float = 0.0


class ModelRunner:
    def __init__(
        self,
        model,
        config,
        *,
        num_blocks: int,
        block_size: int,
        dtype: torch.dtype,
        device: torch.device | str,
        max_model_len: int,
        capture_sizes: list[int] | tuple[int, ...] = (),
        enforce_eager: bool = False,
    ):
        self.model, self.config = model, config
        self.device = torch.device(device)
        self.block_size = block_size
        self.cache, self.kv_caches = allocate_kv(config, num_blocks, block_size, dtype, self.device)
        self.max_blocks = -(-max_model_len // block_size)
        self.packer = StepPacker(self.device)
        self.graphs = DecodeGraphs(
            self._forward,
            AttentionBatch,
            () if enforce_eager else capture_sizes,
            self.max_blocks,
            config.hidden_size,
            dtype,
            self.device,
        )
        self.graphs.capture()

    def _forward(self, input_ids: torch.Tensor, positions: torch.Tensor, batch: AttentionBatch) -> torch.Tensor:
        return self.model(input_ids, positions, batch, self.kv_caches)

    @torch.inference_mode()
    def execute(self, output: SchedulerOutput, times: StepTimes | None = None) -> list[int]:
        """One token per scheduled row (in `output.scheduled` order); -1 where the row does not sample."""
        clock = _Clock(self.device, times)
        rows = output.scheduled
        # Always max_blocks wide, not the step's widest table: the attention kernels then see one table stride
        # for the whole run (a new stride could recompile them, ~1 s, inside a timed run).
        inputs = self.packer.pack(output, self.max_blocks)
        sampling = [i for i, entry in enumerate(rows) if entry.samples]
        some = None if len(sampling) == len(rows) else torch.tensor(sampling, dtype=torch.int64, device=self.device)
        # Built before the model runs: these are pageable copies, which block the host until the stream gets to
        # them (after the whole forward, were they queued behind it). An all-greedy batch needs none of them.
        seqs = [rows[i].seq for i in sampling]
        batch = (
            None
            if all(is_greedy(s.params) for s in seqs)
            else SamplingBatch.from_sequences(seqs, self.config.vocab_size, self.device)
        )
        clock.lap("prepare_s")
        if inputs.is_decode:  # one token a row: hidden row i is sequence i's token
            step = DecodeInputs(
                inputs.input_ids, inputs.positions, inputs.slot_mapping, inputs.block_table, inputs.seq_lens
            )
            hidden = self.graphs.run(step, lambda: attention_batch(inputs))
            hidden = hidden if some is None else hidden[some]  # a 1-token prompt chunk that is not the last
        else:
            hidden = self._forward(inputs.input_ids, inputs.positions, attention_batch(inputs))
            hidden = hidden[inputs.logits_indices if some is None else inputs.logits_indices[some]]
        tokens = [-1] * len(rows)
        if not sampling:
            clock.lap("model_s")
            return tokens
        logits = self.model.compute_logits(hidden)
        clock.lap("model_s")
        sampled = sample(logits, batch)
        for i, token in zip(sampling, sampled.tolist(), strict=True):
            tokens[i] = token
        clock.lap("sample_s")
        return tokens


class _Clock:
    """Phase timer; on CUDA it synchronizes at each lap so a phase is charged its own kernels (only when
    timing is asked for: it costs a host-device round trip a phase)."""

    def __init__(self, device: torch.device, times: StepTimes | None):
        self.now, self.times, self.device = time.perf_counter, times, device
        self.last = self.now() if times is not None else 0.0

    def lap(self, name: str) -> None:
        if self.times is None:
            return
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        now = self.now()
        setattr(self.times, name, getattr(self.times, name) + now - self.last)
        self.last = now
