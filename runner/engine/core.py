"""The engine core: the scheduler and the model runner, stepped. It speaks `runner.engine.messages` only, so the
same object serves in-process (`LLM`) and inside an engine-core process (runner.engine.core_process).

One step = schedule -> run the model -> update (the scheduler appends each sampled token and decides EOS, stop
token ids, max_tokens and max_model_len; finished requests free their blocks and full blocks enter the prefix
cache). The step's `StepOutputs` carry every request's new tokens, with their logprobs where asked for, and
a request's prompt logprobs once, with its first token. Text is not the core's business: stop
strings are matched by the frontend on the text it detokenizes (runner.engine.output_processor), which then
aborts the request here.

Asynchronous scheduling (the scheduler config's `async_scheduling`, on by default in EngineConfig; vLLM's
async scheduling, SGLang's overlap scheduler): `step()` keeps its contract, one StepOutputs per call, but
runs a pipeline one step deep. It schedules step N+1 and launches it on the device (rows whose step-N token
is not known yet take it from step N's sampled tokens on the device, runner.engine.model_runner), THEN
waits for step N's tokens (copied to pinned host memory behind an event), lets the scheduler resolve them
(append, EOS / stop token ids / max_tokens / max_model_len) and returns step N's outputs: the host's
scheduling and input preparation of N+1, and the caller's output processing of N (detokenizing, stop
strings, streaming), run while the device computes N+1. The first call launches two steps; a call that
finds nothing to schedule only resolves; once no request is left unfinished, the step still in flight
(its rows all belong to finished requests) is resolved too, so `has_unfinished` false means nothing is in
flight. An abort between steps may hit a request whose next step is in flight: the scheduler discards that
step's token for it (and holds its blocks until the step resolved), and no delta names a request that is no
longer live.

Per-step phase times (schedule, prepare, model, sample, postprocess) are summed in `stats` when `time_phases`
is on; on CUDA that synchronizes the device between phases (see model_runner._Clock), and so defeats the
overlap it measures around.
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque

from runner.engine.messages import AddRequest, CoreLoad, Ready, RequestDelta, StepOutputs
from runner.engine.model_runner import LaunchedStep, ModelRunner, StepResult, StepTimes
from runner.engine.scheduler import Scheduler, SchedulerOutput
from runner.engine.sequence import Sequence, SequenceStatus

FINISHED = SequenceStatus.FINISHED


@dataclasses.dataclass
class EngineStats(StepTimes):
    steps: int = 0
    decode_steps: int = 0
    schedule_s: float = 0.0
    postprocess_s: float = 0.0
    prompt_chunks: int = 0  # scheduled rows that computed part of a prompt and sampled nothing
    output_tokens: int = 0
    batched_tokens: int = 0  # tokens the resolved steps computed
    step_s: float = 0.0  # wall seconds inside step()
    collect_s: float = 0.0  # the host waiting for steps' results (the device was behind)
    gpu_s: float = 0.0  # the device's time per step, summed (runner.gpu_timing on CUDA only)


class EngineCore:
    def __init__(self, scheduler: Scheduler, runner: ModelRunner, vocab_size: int, time_phases: bool = False):
        self.scheduler, self.runner, self.vocab_size = scheduler, runner, vocab_size
        self.time_phases = time_phases
        self.stats = EngineStats()
        self._live: dict[str, Sequence] = {}
        self.async_scheduling = scheduler.config.async_scheduling
        self._inflight: deque[LaunchedStep] = deque()  # launched, not resolved, oldest first

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
        self._drain_if_idle()

    @property
    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished or bool(self._inflight)

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
            self.stats.steps,
            self.stats.decode_steps,
            self.stats.batched_tokens,
            self.stats.step_s,
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
        started = time.perf_counter()
        deltas = self._step()
        self.stats.step_s += time.perf_counter() - started
        return StepOutputs(deltas, self.load())

    def _step(self) -> list[RequestDelta]:
        if not self.async_scheduling:
            if self._launch() is None:
                if self.scheduler.has_unfinished:  # cannot happen for requests `add` accepted; never spin
                    raise RuntimeError("step: requests are waiting but none could be scheduled")
                return []
            return self._resolve()
        if not self._inflight and self._launch() is None:
            if self.scheduler.has_unfinished:  # nothing in flight holds blocks: as in the synchronous case
                raise RuntimeError("step: requests are waiting but none could be scheduled")
            return []
        self._launch()  # step N+1, while step N runs (nothing, when all that is left is in flight)
        return self._resolve() + self._drain_if_idle()

    def _launch(self) -> LaunchedStep | None:
        """Schedule a step and queue it on the device; None when nothing could be scheduled."""
        started = time.perf_counter()
        output = self.scheduler.schedule()
        self.stats.schedule_s += time.perf_counter() - started
        if output.is_empty:
            return None
        launched = self.runner.launch(output, self.stats if self.time_phases else None)
        self._inflight.append(launched)
        return launched

    def _resolve(self) -> list[RequestDelta]:
        """Wait for the oldest launched step and apply it: the scheduler's update, then the deltas."""
        launched = self._inflight.popleft()
        output, stats = launched.output, self.stats
        waited = time.perf_counter()
        result = self.runner.collect(launched)
        started = time.perf_counter()
        stats.collect_s += started - waited
        if launched.started is not None:
            stats.gpu_s += launched.started.elapsed_time(launched.done) / 1e3
        finished = self.scheduler.update(output, result.tokens)
        deltas = self._deltas(output, result)
        for seq in finished:
            if self._live.get(seq.request_id) is seq:
                del self._live[seq.request_id]
        stats.steps += 1
        stats.decode_steps += output.is_decode
        stats.batched_tokens += output.num_batched_tokens
        stats.postprocess_s += time.perf_counter() - started
        if output.decode is None:  # every row of a pure decode step samples
            stats.prompt_chunks += sum(not entry.samples for entry in output.scheduled)
        stats.output_tokens += len(deltas)
        return deltas

    def _drain_if_idle(self) -> list[RequestDelta]:
        """No request left: resolve what is still in flight (rows of finished or aborted requests only, which
        give no deltas), so their held blocks return and nothing is in flight while the core waits."""
        deltas = []
        while self._inflight and not self.scheduler.has_unfinished:
            deltas += self._resolve()
        return deltas

    def _deltas(self, output: SchedulerOutput, result: StepResult) -> list[RequestDelta]:
        """The step's new token per live request that sampled one, with its logprobs when asked for, and the
        request's prompt logprobs with its first token (gathered here, chunk by chunk, until then)."""
        seqs = output.decode.seqs if output.decode is not None else [entry.seq for entry in output.scheduled]
        for row, first, entries in result.prompt_logprobs:
            buffer = seqs[row].prompt_logprobs
            if buffer is not None:
                buffer[first : first + len(entries)] = entries
        deltas, live, logprobs = [], self._live, result.logprobs
        for row, (seq, token) in enumerate(zip(seqs, result.tokens, strict=True)):
            # not live: aborted, or finished by a token of an earlier step (the row was in flight meanwhile)
            if token < 0 or live.get(seq.request_id) is not seq:
                continue
            delta = RequestDelta(seq.request_id, [token])
            if logprobs and (logprob := logprobs.get(row)) is not None:
                delta.new_logprobs = [logprob]
            if seq.prompt_logprobs is not None:  # its first token: the prompt is scored to the end
                delta.prompt_logprobs, seq.prompt_logprobs = seq.prompt_logprobs, None
            if seq.status is FINISHED:
                delta.finish_reason, delta.stop_reason = seq.finish_reason.value, seq.stop_reason
            deltas.append(delta)
        return deltas
