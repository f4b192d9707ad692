"""The model runner: one scheduled step in, one sampled token per sampling request out.

`execute(output)` flattens the SchedulerOutput into the model's inputs (input ids, positions and a
runner.model.attention.AttentionBatch; runner.engine.step_tensors, two host-to-device copies), runs the
model (a decode step through the decode CUDA graph of the next size up, a step with prompt tokens through the
prefill graph of the next token bucket up, where graphs are captured; else eagerly),
computes the logits of the rows that sample (each sampling request's last new token; a prompt chunk that is
not the last samples nothing, so a seeded request's generator never advances on it) and samples them
(runner.engine.sampler). Rows whose request asked for logprobs get them from the same logits
(runner.engine.logprobs); a row of a request that asked for prompt logprobs also gets the logits of each of
its prompt positions (runner.engine.prompt_logprobs). `launch` queues all of it and starts the copies of
the results to the host; `collect` waits for them.

The KV cache is one buffer for all layers (reference.kv.allocate with a FullAttentionSpec in the model
dtype, NHD, K then V in each block); kv_caches[i] = (K view, V view) of layer i. Block 0 is the block
pool's null block: never handed out, it is what padded block-table entries point at.
"""

from __future__ import annotations

import bisect
import dataclasses
import operator
import time

import numpy as np
import torch

from reference.kv.allocate import KVCache, allocate_kv_cache
from reference.kv.attention import FullAttentionSpec
from runner.engine import prompt_logprobs
from runner.engine.cuda_graphs import DecodeGraphs, DecodeInputs
from runner.engine.host_copy import to_device
from runner.engine.logprobs import LogprobTensors, token_logprobs
from runner.engine.messages import TokenLogprobs
from runner.engine.prefill_graphs import PrefillGraphs
from runner.engine.sampler import SamplingBatch, is_greedy, sample
from runner.engine.scheduler import SchedulerOutput, StepInputs
from runner.engine.step_tensors import StepPacker
from runner.model.attention import AttentionBatch

_PLAIN_GREEDY = operator.attrgetter("plain_greedy")  # Sequence.plain_greedy: greedy, no logprobs


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


@dataclasses.dataclass
class StepResult:
    """What one step gave, on the host: a token per scheduled row (-1 where the row does not sample), the
    logprobs of the sampled tokens of the rows that asked, and the prompt logprobs the step scored."""

    tokens: list[int]
    logprobs: dict[int, TokenLogprobs] = dataclasses.field(default_factory=dict)  # row -> its token's
    prompt_logprobs: list[tuple[int, int, list[TokenLogprobs]]] = dataclasses.field(default_factory=list)
    # (row, position of the first scored prompt token, one entry per scored token)


@dataclasses.dataclass
class LaunchedStep:
    """A step queued on the device: its outputs being copied to the host, valid once `done` completed."""

    output: SchedulerOutput
    sampling: list[int]  # rows that sample, in order: row sampling[j]'s token is sampled[j]
    sampled: torch.Tensor | None  # int64 [S] on the device
    host_tokens: torch.Tensor | None  # its host copy
    logprob_rows: list[int]  # rows whose sampled token's logprobs were asked for
    logprobs: LogprobTensors | None  # host copies, one position per logprob row
    spans: list[prompt_logprobs.PromptSpan]
    prompt: LogprobTensors | None  # host copies, the spans' positions in order
    done: torch.cuda.Event | None  # recorded after the copies (CUDA only)
    started: torch.cuda.Event | None = None  # recorded before the step's first kernel (with gpu_timing only)


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
        prefill_sizes: list[int] | tuple[int, ...] = (),
        max_num_seqs: int = 256,
        enforce_eager: bool = False,
        max_logits_rows: int = 256,
    ):
        self.model, self.config = model, config
        self.device = torch.device(device)
        self.block_size = block_size
        self.max_logits_rows = max_logits_rows  # logits computed at once for prompt logprobs (max_num_seqs)
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
        self.prefill_graphs = PrefillGraphs(
            self._forward,
            AttentionBatch,
            () if enforce_eager or not self.graphs.enabled else prefill_sizes,
            max_num_seqs,
            self.max_blocks,
            config.hidden_size,
            dtype,
            self.device,
        )
        # Prefill graphs first (the largest forward), the decode graphs in the same pool
        self.graphs.capture(self.prefill_graphs.capture())
        self._last: LaunchedStep | None = None  # the step launched last (its sampled tokens feed the next)
        # CUDA: time every step's device work with a pair of timing events (the step profile of bench.llm.w1)
        self.gpu_timing = False

    def _forward(self, input_ids: torch.Tensor, positions: torch.Tensor, batch: AttentionBatch) -> torch.Tensor:
        return self.model(input_ids, positions, batch, self.kv_caches)

    def execute(self, output: SchedulerOutput, times: StepTimes | None = None) -> StepResult:
        """Run one step and wait for it: `launch` then `collect`."""
        return self.collect(self.launch(output, times))

    @torch.inference_mode()
    def launch(self, output: SchedulerOutput, times: StepTimes | None = None) -> LaunchedStep:
        """Queue the step on the device (nothing here waits for the device on CUDA); `collect` reads it."""
        clock = _Clock(self.device, times)
        device = self.device
        timed = self.gpu_timing and device.type == "cuda"
        started = torch.cuda.Event(enable_timing=True) if timed else None
        if started is not None:
            started.record(torch.cuda.current_stream(device))
        # Always max_blocks wide, not the step's widest table: the attention kernels then see one table stride
        # for the whole run (a new stride could recompile them, ~1 s, inside a timed run).
        inputs = self.packer.pack(output, self.max_blocks)
        self._take_pending_tokens(output, inputs.input_ids)
        if output.decode is not None:  # a pure decode step's columns: every row samples
            seqs = output.decode.seqs
            sampling = list(range(len(seqs)))
            # A decode row samples: its position is the request's last token, so it scores no prompt token.
            spans = []
        else:
            rows = output.scheduled
            sampling = [i for i, entry in enumerate(rows) if entry.samples]
            seqs = [rows[i].seq for i in sampling]
            spans = prompt_logprobs.spans(rows)
        some = None if len(sampling) == output.num_rows else to_device(sampling, torch.int64, device)
        # Built before the model runs (an all-greedy batch needs none of it): its host-to-device copies are
        # then queued ahead of the forward.
        if all(map(_PLAIN_GREEDY, seqs)):  # the common batch: one attribute a row
            batch, logprob_rows = None, []
        else:
            batch = (
                None
                if all(is_greedy(s.params) for s in seqs)
                else SamplingBatch.from_sequences(seqs, self.config.vocab_size, device)
            )
            logprob_rows = [j for j, s in enumerate(seqs) if s.params.logprobs is not None]  # among sampling rows
        clock.lap("prepare_s")
        if inputs.is_decode:  # one token a row: hidden row i is sequence i's token
            step = DecodeInputs(
                inputs.input_ids, inputs.positions, inputs.slot_mapping, inputs.block_table, inputs.seq_lens
            )
            every = self.graphs.run(step, lambda: attention_batch(inputs))
            hidden = every if some is None else every[some]  # a 1-token prompt chunk that is not the last
        else:
            every = self.prefill_graphs.run(inputs, lambda: attention_batch(inputs))
            hidden = every[inputs.logits_indices if some is None else inputs.logits_indices[some]]
        copy = device.type == "cuda"
        prompt = None
        if spans:
            prompt = prompt_logprobs.compute(
                self.model.compute_logits,
                every,
                to_device(prompt_logprobs.hidden_rows(spans), torch.int64, device),
                to_device(prompt_logprobs.targets(output.scheduled, spans), torch.int64, device),
                max(s.k for s in spans),
                self.max_logits_rows,
            ).to_host(non_blocking=copy)
        sampled = host_tokens = logprobs = None
        if sampling:
            logits = self.model.compute_logits(hidden)
            clock.lap("model_s")
            sampled = sample(logits, batch)
            if logprob_rows:
                pick = to_device(logprob_rows, torch.int64, device)
                k = max(seqs[j].params.logprobs for j in logprob_rows)
                logprobs = token_logprobs(logits[pick], sampled[pick], k).to_host(non_blocking=copy)
            host_tokens = sampled.to("cpu", non_blocking=copy)
            clock.lap("sample_s")
        else:
            clock.lap("model_s")
        done = None
        if copy:
            done = torch.cuda.Event(enable_timing=timed)
            done.record(torch.cuda.current_stream(device))
        self._last = LaunchedStep(
            output,
            sampling,
            sampled,
            host_tokens,
            [sampling[j] for j in logprob_rows],
            logprobs,
            spans,
            prompt,
            done,
            started,
        )
        return self._last

    def _take_pending_tokens(self, output: SchedulerOutput, input_ids: torch.Tensor) -> None:
        """Asynchronous scheduling: rows whose token the previous step (still running) samples carry a
        placeholder; write that step's sampled tokens into them, on the device (queued after the previous
        step's sampling, before this step's forward or graph replay reads the ids: no host round trip)."""
        if output.decode is not None:
            self._take_pending_decode_tokens(output, input_ids)
            return
        dst, src, offset = [], [], 0
        prev = self._last
        for entry in output.scheduled:
            if entry.prev_row >= 0:
                if prev is None or prev.output.step_id != output.step_id - 1 or prev.sampled is None:
                    raise RuntimeError(f"launch: step {output.step_id} needs the tokens of the step launched before")
                # rows that sample are prev.sampling, ascending (every row, in a pure decode step)
                every = len(prev.sampling) == prev.output.num_rows
                at = entry.prev_row if every else bisect.bisect_left(prev.sampling, entry.prev_row)
                if at >= len(prev.sampling) or prev.sampling[at] != entry.prev_row:
                    raise RuntimeError(f"launch: row {entry.prev_row} of step {prev.output.step_id} sampled nothing")
                dst.append(offset)
                src.append(at)
            offset += entry.num_new_tokens
        if dst:
            index = to_device(dst + src, torch.int64, self.device)
            input_ids[index[: len(dst)]] = prev.sampled[index[len(dst) :]]

    def _take_pending_decode_tokens(self, output: SchedulerOutput, input_ids: torch.Tensor) -> None:
        """`_take_pending_tokens` for a pure decode step's columns (one token a row), without a loop over the
        rows. In a steady decode every row takes the token of its own row of the step before (the same
        requests in the same order): one device copy."""
        prev_rows = output.decode.prev_rows
        if max(prev_rows) < 0:
            return  # every token is known (synchronous scheduling)
        prev = self._last
        if prev is None or prev.output.step_id != output.step_id - 1 or prev.sampled is None:
            raise RuntimeError(f"launch: step {output.step_id} needs the tokens of the step launched before")
        n = len(prev_rows)
        if n == len(prev.sampling) == prev.output.num_rows and prev_rows == list(range(n)):
            input_ids.copy_(prev.sampled)
            return
        wanted = np.asarray(prev_rows)
        dst = np.flatnonzero(wanted >= 0)
        # rows that sample are prev.sampling, ascending: the position of a wanted row among them is its token's
        sampling = np.asarray(prev.sampling)
        at = np.minimum(np.searchsorted(sampling, wanted[dst]), len(sampling) - 1)  # prev sampled: not empty
        if (missing := np.flatnonzero(sampling[at] != wanted[dst])).size:
            row = wanted[dst][missing[0]]
            raise RuntimeError(f"launch: row {row} of step {prev.output.step_id} sampled nothing")
        index = to_device(np.concatenate([dst, at]), torch.int64, self.device)
        input_ids[index[: len(dst)]] = prev.sampled[index[len(dst) :]]

    def collect(self, step: LaunchedStep) -> StepResult:
        """Wait for the step's copies and read them."""
        if step.done is not None:
            step.done.synchronize()
        output = step.output
        num_rows = output.num_rows
        if step.host_tokens is not None and len(step.sampling) == num_rows:  # every row sampled
            tokens = step.host_tokens.tolist()
        else:
            tokens = [-1] * num_rows
            if step.host_tokens is not None:
                for i, token in zip(step.sampling, step.host_tokens.tolist(), strict=True):
                    tokens[i] = token
        result = StepResult(tokens)
        if step.logprobs is not None:
            seqs = output.decode.seqs if output.decode is not None else [e.seq for e in output.scheduled]
            ks = [seqs[i].params.logprobs for i in step.logprob_rows]
            result.logprobs = dict(zip(step.logprob_rows, step.logprobs.entries(ks), strict=True))
        if step.prompt is not None:
            entries = step.prompt.entries([s.k for s in step.spans for _ in range(s.count)])
            at = 0
            for s in step.spans:
                result.prompt_logprobs.append((s.row, s.first, entries[at : at + s.count]))
                at += s.count
        return result


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
