"""The engine loop: add requests, then step until none is left. One step = schedule -> run the model ->
postprocess (the scheduler appends each sampled token and decides finishing; stop strings are checked
here, on text detokenized incrementally; finished requests have freed their blocks and full blocks entered
the prefix cache inside `Scheduler.update`). Finished requests come back as RequestOutputs.

Per-step phase times (schedule, prepare, model, sample, postprocess) are summed in `stats` when
`time_phases` is on; on CUDA that synchronizes the device between phases (see model_runner._Clock).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence as Seq

from runner.engine.detokenizer import Detokenizer
from runner.engine.model_runner import ModelRunner, StepTimes
from runner.engine.sampling_params import SamplingParams
from runner.engine.scheduler import Scheduler
from runner.engine.sequence import Sequence


@dataclasses.dataclass
class RequestOutput:
    request_id: int | str
    prompt: str | None
    prompt_token_ids: list[int]
    token_ids: list[int]  # generated tokens (a token that completed a stop string included)
    text: str  # generated text, special tokens skipped, cut before a matched stop string
    finish_reason: str  # "stop" | "length" | "abort"
    stop_reason: int | str | None  # the EOS / stop token id or stop string that finished it


@dataclasses.dataclass
class EngineStats(StepTimes):
    steps: int = 0
    decode_steps: int = 0
    schedule_s: float = 0.0
    postprocess_s: float = 0.0
    computed_tokens: int = 0  # tokens run through the model (prefix-cache hits excluded)
    prompt_chunks: int = 0  # scheduled rows that computed part of a prompt and sampled nothing
    output_tokens: int = 0


@dataclasses.dataclass(frozen=True)
class EngineLoad:
    """A read-only snapshot for the API server's /metrics (runner.server): request counts, KV blocks and the
    prefix cache's prompt-token counters. Blocks in use = usable - free (cached blocks nobody holds are free:
    they sit in the free queue, evictable)."""

    running: int
    waiting: int
    blocks_usable: int
    blocks_free: int
    prefix_queried_tokens: int
    prefix_hit_tokens: int


class LLMEngine:
    def __init__(self, scheduler: Scheduler, runner: ModelRunner, tokenizer, time_phases: bool = False):
        self.scheduler, self.runner, self.tokenizer = scheduler, runner, tokenizer
        self.scheduler.stop_checker = self._stop_checker
        self.time_phases = time_phases
        self.stats = EngineStats()
        self._prompts: dict[int | str, str | None] = {}
        self._detokenizers: dict[int | str, Detokenizer] = {}

    def add_request(
        self,
        prompt_token_ids: Seq[int],
        params: SamplingParams,
        prompt: str | None = None,
        request_id: int | str | None = None,
    ) -> Sequence:
        if params.stop and self.tokenizer is None:
            raise ValueError("params: stop strings need a tokenizer; this model has none")
        seq = Sequence(
            list(prompt_token_ids), params, request_id=request_id, block_size=self.scheduler.config.block_size
        )
        self.scheduler.add(seq)
        self._prompts[seq.request_id] = prompt
        return seq

    @property
    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished

    def abort(self, request_id: int | str) -> bool:
        """Drop a request (waiting or running): its blocks go back to the free queue, its per-request state
        here is forgotten. Call it between steps. False if no unfinished request has that id."""
        seq = self.scheduler.abort(request_id)
        self._prompts.pop(request_id, None)
        self._detokenizers.pop(request_id, None)
        return seq is not None

    def load(self) -> EngineLoad:
        s = self.scheduler
        return EngineLoad(
            len(s.running),
            len(s.waiting),
            s.kv.num_usable_blocks,
            s.kv.pool.num_free_blocks,
            s.num_prompt_tokens_queried,
            s.num_prompt_tokens_hit,
        )

    def _stop_checker(self, seq: Sequence) -> str | None:
        detok = self._detokenizers.get(seq.request_id)
        if detok is None:
            detok = self._detokenizers[seq.request_id] = Detokenizer(
                self.tokenizer, seq.prompt_token_ids, seq.params.stop
            )
        detok.add(seq.token_ids[-1])
        return detok.stopped_by

    def step(self) -> list[RequestOutput]:
        """Run one step; returns the requests that finished in it."""
        stats, now = self.stats, time.perf_counter
        started = now()
        output = self.scheduler.schedule()
        if output.is_empty:
            if self.scheduler.has_unfinished:  # cannot happen for requests `add` accepted; never spin
                raise RuntimeError("step: requests are waiting but none could be scheduled")
            return []
        scheduled = now()
        tokens = self.runner.execute(output, stats if self.time_phases else None)
        ran = now()
        finished = self.scheduler.update(output, tokens)
        results = [self._output(seq) for seq in finished]
        done = now()
        stats.steps += 1
        stats.decode_steps += output.is_decode
        stats.schedule_s += scheduled - started
        stats.postprocess_s += done - ran
        stats.computed_tokens += output.num_batched_tokens
        stats.prompt_chunks += sum(not entry.samples for entry in output.scheduled)
        stats.output_tokens += sum(t >= 0 for t in tokens)
        return results

    def _output(self, seq: Sequence) -> RequestOutput:
        detok = self._detokenizers.pop(seq.request_id, None)
        if detok is not None and detok.stopped_by is not None:
            text = detok.text
        elif self.tokenizer is None:
            text = ""
        else:
            text = self.tokenizer.decode(seq.output_token_ids, skip_special_tokens=True)
        reason = seq.finish_reason.value if seq.finish_reason is not None else "abort"
        return RequestOutput(
            seq.request_id,
            self._prompts.pop(seq.request_id, None),
            seq.prompt_token_ids,
            seq.output_token_ids,
            text,
            reason,
            seq.stop_reason,
        )
