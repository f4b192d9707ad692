"""The engine core: the scheduler and the model runner, stepped. It speaks `runner.engine.messages` only, so the
same object serves in-process (`LLM`) and inside an engine-core process (runner.engine.core_process).

One step = schedule -> run the model -> update (the scheduler appends each sampled token and decides EOS, stop
token ids, max_tokens and max_model_len; finished requests free their blocks and full blocks enter the prefix
cache). The step's `StepOutputs` carry every request's new tokens, with their logprobs where asked for, and
a request's prompt logprobs once, with its first token. Text is not the core's business: stop
strings are matched by the frontend on the text it detokenizes (runner.engine.output_processor), which then
aborts the request here.

Per-step phase times (schedule, prepare, model, sample, postprocess) are summed in `stats` when `time_phases`
is on; on CUDA that synchronizes the device between phases (see model_runner._Clock).
"""

from __future__ import annotations

import dataclasses
import time

from runner.engine.messages import AddRequest, CoreLoad, Ready, RequestDelta, StepOutputs
from runner.engine.model_runner import ModelRunner, StepResult, StepTimes
from runner.engine.scheduler import Scheduler, SchedulerOutput
from runner.engine.sequence import Sequence


@dataclasses.dataclass
class EngineStats(StepTimes):
    steps: int = 0
    decode_steps: int = 0
    schedule_s: float = 0.0
    postprocess_s: float = 0.0
    prompt_chunks: int = 0  # scheduled rows that computed part of a prompt and sampled nothing
    output_tokens: int = 0


class EngineCore:
    def __init__(self, scheduler: Scheduler, runner: ModelRunner, vocab_size: int, time_phases: bool = False):
        self.scheduler, self.runner, self.vocab_size = scheduler, runner, vocab_size
        self.time_phases = time_phases
        self.stats = EngineStats()
        self._live: dict[str, Sequence] = {}

    # --- requests ------------------------------------------------------------------------------------------
    def add_request(self, request: AddRequest) -> None:
        """Queue a request; ValueError/TypeError ("field: why") when it cannot be served (the request is then
        not queued)."""
        if request.request_id in self._live:
            raise ValueError(f"request_id: {request.request_id!r} is already running")
        if any(t >= self.vocab_size for t in request.prompt_token_ids):
            raise ValueError(f"prompt_token_ids: token ids must be < the vocabulary size {self.vocab_size}")
        seq = Sequence(
            list(request.prompt_token_ids),
            request.params,
            request_id=request.request_id,
            block_size=self.scheduler.config.block_size,
        )
        self.scheduler.add(seq)
        self._live[request.request_id] = seq

    def abort(self, request_ids: list[str]) -> None:
        """Drop requests (waiting or running; unknown or finished ids are ignored): their blocks go back to the
        free queue. Called between steps."""
        for request_id in request_ids:
            if self._live.pop(request_id, None) is not None:
                self.scheduler.abort(request_id)

    @property
    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished

    @property
    def live_request_ids(self) -> list[str]:
        return list(self._live)

    # --- state --------------------------------------------------------------------------------------------
    def load(self) -> CoreLoad:
        s = self.scheduler
        return CoreLoad(
            len(s.running),
            len(s.waiting),
            s.kv.num_usable_blocks,
            s.kv.pool.num_free_blocks,
            s.num_prompt_tokens_queried,
            s.num_prompt_tokens_hit,
        )

    def ready(self, device: str) -> Ready:
        cfg = self.scheduler.config
        return Ready(
            cfg.max_model_len,
            self.scheduler.kv.num_usable_blocks,
            cfg.block_size,
            self.vocab_size,
            device,
            list(cfg.eos_token_ids),
            self.load(),
        )

    # --- one step -------------------------------------------------------------------------------------------
    def step(self) -> StepOutputs:
        """Run one step; returns the new tokens of every request that got some, and the finished ones."""
        stats, now = self.stats, time.perf_counter
        started = now()
        output = self.scheduler.schedule()
        if output.is_empty:
            if self.scheduler.has_unfinished:  # cannot happen for requests `add` accepted; never spin
                raise RuntimeError("step: requests are waiting but none could be scheduled")
            return StepOutputs([], self.load())
        scheduled = now()
        result = self.runner.execute(output, stats if self.time_phases else None)
        ran = now()
        finished = self.scheduler.update(output, result.tokens)
        deltas = self._deltas(output, result)
        for seq in finished:
            self._live.pop(seq.request_id, None)
        done = now()
        stats.steps += 1
        stats.decode_steps += output.is_decode
        stats.schedule_s += scheduled - started
        stats.postprocess_s += done - ran
        stats.prompt_chunks += sum(not entry.samples for entry in output.scheduled)
        stats.output_tokens += len(deltas)
        return StepOutputs(deltas, self.load())

    def _deltas(self, output: SchedulerOutput, result: StepResult) -> list[RequestDelta]:
        """The step's new token per live request that sampled one, with its logprobs when asked for, and the
        request's prompt logprobs with its first token (gathered here, chunk by chunk, until then)."""
        rows = output.scheduled
        for row, first, entries in result.prompt_logprobs:
            buffer = rows[row].seq.prompt_logprobs
            if buffer is not None:
                buffer[first : first + len(entries)] = entries
        deltas = []
        for row, (entry, token) in enumerate(zip(rows, result.tokens, strict=True)):
            seq = entry.seq
            if token < 0 or seq.request_id not in self._live:
                continue
            delta = RequestDelta(seq.request_id, [token])
            if (logprobs := result.logprobs.get(row)) is not None:
                delta.new_logprobs = [logprobs]
            if seq.prompt_logprobs is not None:  # its first token: the prompt is scored to the end
                delta.prompt_logprobs, seq.prompt_logprobs = seq.prompt_logprobs, None
            if seq.is_finished:
                delta.finish_reason, delta.stop_reason = seq.finish_reason.value, seq.stop_reason
            deltas.append(delta)
        return deltas
