"""`AsyncEngine`: the server's frontend of an engine-core process.

The scheduler and the model run in an engine-core process (runner.engine.core_process); this side lives on the
event loop. `submit` hands the request to the output processor (which detokenizes it, once) and sends it to the
core; one reader task takes every `StepOutputs` the core sends, runs the output processor over it, and puts
each request's `Delta` on that request's queue (`RequestStream`), which its handler reads. A stop string
matched here finishes the request at once and aborts it in the core. The core's load (running and waiting
requests, KV blocks, prefix-cache counters) arrives with every step: /metrics reads `snapshot`.

A request is accepted once the core queued it (`accepted` resolves, or fails with a 400 naming the field the
core refused). If the core dies (it exits, is killed, or reports a failure), every live request gets a 500
error, `error` is set (the launcher's watchdog then stops the server with a non-zero exit) and later
submissions get 503.

FAULTS (negative controls, set from TOUCHSTONE_SERVER_FAULTS, comma separated; never in production):
- "skip_abort_on_disconnect": a client's disconnect forgets the request but never aborts it in the engine,
  which keeps generating into the KV cache for nobody (the load test's leak check must catch it).
- "load_after_health": `touchstone serve` starts loading its model only once /health has answered "loading",
  so a test sees that answer first however fast the load (suites/server/test_loading.py).
- "usage_as_string": every non-streamed response sends usage.completion_tokens as a string, against the
  published schema (the schemathesis run must catch it: suites/server/test_schemathesis.py).
- "crash_on_echo": a completion request with echo: true fails with a 500 (the same run must catch it).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import os
import time
from collections.abc import Sequence

from runner.engine import messages as m
from runner.engine.core_client import AsyncProcessClient, EngineCoreError
from runner.engine.output_processor import OutputProcessor
from runner.server.errors import APIError

log = logging.getLogger("touchstone.server")
FAULT_NAMES = ("skip_abort_on_disconnect", "load_after_health", "usage_as_string", "crash_on_echo")


def faults_from_env(env: dict | os._Environ = os.environ) -> frozenset[str]:
    names = frozenset(n for n in env.get("TOUCHSTONE_SERVER_FAULTS", "").split(",") if n)
    if unknown := names - set(FAULT_NAMES):
        raise ValueError(f"TOUCHSTONE_SERVER_FAULTS: unknown {sorted(unknown)}; known {FAULT_NAMES}")
    return names


@dataclasses.dataclass(slots=True)  # 256 a decode step: a slotted, unfrozen instance is built 3x faster
class Delta:
    text: str  # new text since the previous delta ("" while a character is incomplete, or without a tokenizer)
    num_tokens: int  # output tokens so far
    finish_reason: str | None = None  # "stop" | "length" once finished
    new_token_ids: Sequence[int] = ()  # the output processor's list, never changed after
    logprobs: tuple[m.TokenLogprobs, ...] | None = None  # one per new token, when asked for
    prompt_logprobs: tuple[m.TokenLogprobs | None, ...] | None = None  # once, with the first tokens, when asked for

    @staticmethod
    def joined(deltas: Sequence[Delta]) -> Delta:
        """Consecutive deltas of one request as one (a reader that fell behind takes them together)."""
        if len(deltas) == 1:
            return deltas[0]
        logprobs = [d.logprobs for d in deltas if d.logprobs is not None]
        prompt = [d.prompt_logprobs for d in deltas if d.prompt_logprobs is not None]
        return Delta(
            "".join(d.text for d in deltas),
            deltas[-1].num_tokens,
            deltas[-1].finish_reason,
            tuple(t for d in deltas for t in d.new_token_ids),
            tuple(e for lp in logprobs for e in lp) if logprobs else None,
            prompt[0] if prompt else None,
        )


class RequestStream:
    """The loop's side of one request: `accepted` resolves once the engine took it (or fails with a 400), then
    deltas arrive until one carries a finish_reason; an error (abort by shutdown, engine death) raises. The
    reader waits for `wake`, then takes what is queued at once (`take`); several requests (the n choices of one
    API request) share one `wake` event."""

    def __init__(self, request_id: str, prompt_tokens: int) -> None:
        self.request_id, self.prompt_tokens = request_id, prompt_tokens
        self.arrival = time.perf_counter()
        self.last = self.arrival
        self.accepted: asyncio.Future = asyncio.get_running_loop().create_future()
        self.queue: collections.deque[Delta | APIError] = collections.deque()  # the loop's thread only
        self.finished = False
        self.num_tokens = 0  # output tokens the handler has read
        self.delivered = 0  # output tokens put on the queue (the metrics' view)
        self.wake = asyncio.Event()  # set when the reader has something to do (below)
        # Tokens queued before `put` wakes the reader (a finish or an error always does): a stream sending N
        # tokens a chunk, or a whole response, has nothing to do before. At 256 streams a reader woken per
        # engine step cost the server's one thread most of its time (cProfile of `touchstone serve` on the
        # H200, 1,024 requests of 128 tokens).
        self.wake_tokens = 1
        self.pending = 0  # tokens queued since the last `take`

    def put(self, item: Delta | APIError) -> None:
        self.queue.append(item)
        if isinstance(item, Delta) and item.finish_reason is None:
            self.pending += len(item.new_token_ids)
            if self.pending < self.wake_tokens:
                return
        self.wake.set()

    def take(self) -> Delta | None:
        """Every delta queued now, as one (None if there is none); a queued error raises."""
        taken, queue, self.pending = [], self.queue, 0
        while queue and not self.finished:
            item = queue.popleft()
            if isinstance(item, APIError):
                self.finished = True
                raise item
            self.num_tokens, self.finished = item.num_tokens, item.finish_reason is not None
            taken.append(item)
        return Delta.joined(taken) if taken else None


def _dead(reason: str) -> APIError:
    return APIError(500, f"the engine failed: {reason}", kind="server_error", code="engine_dead")


class AsyncEngine:
    def __init__(self, client: AsyncProcessClient, tokenizer, metrics=None, faults: frozenset[str] = frozenset()):
        self.client, self.tokenizer, self.metrics, self.faults = client, tokenizer, metrics, faults
        self.processor = OutputProcessor(tokenizer)
        self.error: BaseException | None = None
        self.ready: m.Ready | None = None
        self.snapshot: m.CoreLoad | None = None
        self.active: dict[str, RequestStream] = {}  # submitted and not yet released
        self._idle = asyncio.Event()
        self._idle.set()
        self._reader: asyncio.Task | None = None

    async def start(self) -> m.Ready:
        """Start the engine-core process and wait for it to be ready (EngineCoreError if it cannot start)."""
        self.ready = await self.client.start()
        self.snapshot = self.ready.load
        self._reader = asyncio.ensure_future(self._read())
        return self.ready

    @property
    def alive(self) -> bool:
        return self.error is None and self._reader is not None and not self._reader.done()

    def submit(self, request_id: str, prompt_token_ids: list[int], params) -> RequestStream:
        if not self.alive:
            raise APIError(503, "the engine is not running", kind="service_unavailable", code="engine_dead")
        try:
            self.processor.add(request_id, prompt_token_ids, params)
        except ValueError as err:
            raise APIError(400, str(err), str(err).split(":")[0]) from None
        stream = RequestStream(request_id, len(prompt_token_ids))
        self.active[request_id] = stream
        self._idle.clear()
        self.client.send(m.AddRequest(request_id, list(prompt_token_ids), params))
        if self.metrics is not None:
            self.metrics.prompt_tokens.inc(len(prompt_token_ids))
        return stream

    def abort(self, request_id: str, error: APIError | None = None) -> None:
        """Stop a request. error=None: the client is gone (nobody to tell). With an error: the handler gets it."""
        if error is None and "skip_abort_on_disconnect" in self.faults:
            return
        state = self.processor.abort(request_id)
        if self.alive:
            self.client.send(m.Abort([request_id]))
        stream = self.active.get(request_id)
        if state is not None and stream is not None:
            if error is not None:
                if not stream.accepted.done():
                    stream.accepted.set_exception(error)
                stream.put(error)
            if self.metrics is not None:
                self.metrics.finished.labels("abort").inc()

    def release(self, stream: RequestStream) -> None:
        """The handler is done with the request (finished, failed or aborted)."""
        self.active.pop(stream.request_id, None)
        if not self.active:
            self._idle.set()

    async def drain(self, timeout: float) -> int:
        """Wait until no request is live or `timeout` seconds passed; returns how many are still live."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            pass
        return len(self.active)

    def abort_all(self, error: APIError) -> None:
        for request_id in list(self.active):
            self.abort(request_id, error)

    async def stop(self, timeout: float = 30.0) -> int | None:
        """Stop the engine-core process (its requests were drained or aborted); returns its exit status."""
        if self._reader is not None:
            self._reader.cancel()
        status = await self.client.close(0.0, timeout)
        log.info("the engine core exited with status %s", status)
        return status

    # --- the core's outputs ---------------------------------------------------------------------------------
    async def _read(self) -> None:
        try:
            async for outputs in self.client.outputs():
                self._deliver(outputs)
        except asyncio.CancelledError:
            raise
        except BaseException as err:
            self.error = err
            reason = str(err) if isinstance(err, EngineCoreError) else f"{type(err).__name__}: {err}"
            log.error("the engine core is gone: %s", reason)
            dead = _dead(reason)
            for stream in list(self.active.values()):
                if not stream.accepted.done():
                    stream.accepted.set_exception(dead)
                if not stream.finished:
                    stream.put(dead)

    def _deliver(self, outputs: m.StepOutputs) -> None:
        self.snapshot = outputs.load  # before the deltas: a client's next /metrics sees it
        for request_id in outputs.accepted:
            stream = self.active.get(request_id)
            if stream is not None and not stream.accepted.done():
                stream.accepted.set_result(True)
        for request_id, why in outputs.rejected:
            self.processor.abort(request_id)
            stream = self.active.get(request_id)
            if stream is not None and not stream.accepted.done():
                stream.accepted.set_exception(APIError(400, why, why.split(":")[0]))
        # the prompt's logprobs come once, with a request's first tokens; the output processor keeps them in its
        # request state, which it forgets when the request finishes (maybe in this very step): read them here
        prompt_logprobs = {d.request_id: d.prompt_logprobs for d in outputs.deltas if d.prompt_logprobs is not None}
        updates, stopped = self.processor.process(outputs)
        if stopped:
            self.client.send(m.Abort(stopped))
        now, metrics, active = time.perf_counter(), self.metrics, self.active
        itl: list[float] = []  # the step's inter-token gaps, observed at once
        tokens = 0
        for update in updates:
            stream = active.get(update.request_id)
            if stream is None:
                continue
            ids = update.new_token_ids
            if metrics is not None and (n := len(ids)):
                tokens += n
                if stream.delivered == 0:
                    metrics.ttft.observe(now - stream.arrival)
                    if n > 1:
                        itl += [(now - stream.last) / n] * (n - 1)
                elif n == 1:
                    itl.append(now - stream.last)
                else:
                    itl += [(now - stream.last) / n] * n
            stream.last, stream.delivered = now, update.num_tokens
            finish = update.finish_reason
            if finish is not None and metrics is not None:
                metrics.finished.labels(finish).inc()
            prompt = prompt_logprobs.get(update.request_id) if prompt_logprobs else None
            stream.put(
                Delta(
                    update.text,
                    update.num_tokens,
                    finish,
                    ids,
                    tuple(update.new_logprobs) if update.new_logprobs is not None else None,
                    tuple(prompt) if prompt is not None else None,
                )
            )
        if metrics is not None:
            metrics.generation_tokens.inc(tokens)
            metrics.itl.observe_many(itl)
