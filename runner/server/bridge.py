"""`AsyncEngine`: the engine behind the asyncio server.

The engine is not thread-safe and a step blocks for milliseconds to seconds, so it lives on ONE thread of
its own. The event loop never touches it: it puts commands (add, abort, stop) on a queue; the engine thread
applies them between steps, steps while any request is unfinished (blocking on the queue when idle), and after
each step reads every live request's `Sequence.output_token_ids`, detokenizes the new tokens incrementally
(runner.engine.detokenizer, with the request's stop strings, so the text is cut where the engine stopped it)
and hands the deltas of the whole step to the loop in one `call_soon_threadsafe`. Each request's handler
reads its own asyncio queue (`RequestStream`). The engine surface used: add_request -> Sequence, step(),
abort(), load(), has_unfinished; Sequence.output_token_ids / is_finished / finish_reason.

Aborts: a handler whose client went away (or the shutdown) calls `abort`; the engine thread removes the
request from the scheduler (its blocks go back to the free queue). If the engine thread dies (a step
raises), every live and pending request gets a 500 error, `error` is set (the launcher's watchdog then stops
the server with a non-zero exit) and later submissions get 503.

FAULTS (negative controls, set from TOUCHSTONE_SERVER_FAULTS, comma separated; never in production):
- "skip_abort_on_disconnect": a client's disconnect forgets the request but never aborts it in the engine,
  which keeps generating into the KV cache for nobody (the load test's leak check must catch it).
- "load_after_health": `touchstone serve` starts loading its model only once /health has answered "loading",
  so a test sees that answer first however fast the load (suites/server/test_loading.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import queue
import threading
import time

from runner.server.protocol import APIError

log = logging.getLogger("touchstone.server")
FAULT_NAMES = ("skip_abort_on_disconnect", "load_after_health")


def faults_from_env(env: dict | os._Environ = os.environ) -> frozenset[str]:
    names = frozenset(n for n in env.get("TOUCHSTONE_SERVER_FAULTS", "").split(",") if n)
    if unknown := names - set(FAULT_NAMES):
        raise ValueError(f"TOUCHSTONE_SERVER_FAULTS: unknown {sorted(unknown)}; known {FAULT_NAMES}")
    return names


@dataclasses.dataclass(frozen=True)
class Delta:
    text: str  # new text since the previous delta ("" while a character is incomplete, or without a tokenizer)
    num_tokens: int  # output tokens so far
    finish_reason: str | None = None  # "stop" | "length" once finished


class RequestStream:
    """The loop's side of one request: `accepted` resolves once the engine took it (or fails with a 400), then
    deltas arrive until one carries a finish_reason; an error (abort by shutdown, engine death) raises."""

    def __init__(self, request_id: str, prompt_tokens: int) -> None:
        self.request_id, self.prompt_tokens = request_id, prompt_tokens
        self.arrival = time.perf_counter()
        self.accepted: asyncio.Future = asyncio.get_running_loop().create_future()
        self.queue: asyncio.Queue[Delta | APIError] = asyncio.Queue()
        self.finished = False
        self.num_tokens = 0

    def __aiter__(self):
        return self

    async def __anext__(self) -> Delta:
        if self.finished:
            raise StopAsyncIteration
        item = await self.queue.get()
        if isinstance(item, APIError):
            self.finished = True
            raise item
        self.num_tokens = item.num_tokens
        self.finished = item.finish_reason is not None
        return item


@dataclasses.dataclass
class _Live:
    stream: RequestStream
    seq: object  # runner.engine.sequence.Sequence
    detok: object | None
    sent: int = 0
    last: float = 0.0


class AsyncEngine:
    def __init__(self, engine, tokenizer, metrics=None, faults: frozenset[str] = frozenset()) -> None:
        self.engine, self.tokenizer, self.metrics, self.faults = engine, tokenizer, metrics, faults
        self.error: BaseException | None = None
        self.snapshot = engine.load()
        self.active: dict[str, RequestStream] = {}  # loop side: submitted and not yet released
        self._idle: asyncio.Event | None = None
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._live: dict[str, _Live] = {}  # engine-thread side
        self._thread = threading.Thread(target=self._run, name="touchstone-engine", daemon=True)
        self._loop: asyncio.AbstractEventLoop | None = None

    # --- loop side ----------------------------------------------------------------------------------------
    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._idle = asyncio.Event()
        self._idle.set()
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self.error is None and self._thread.is_alive()

    def submit(self, request_id: str, prompt_token_ids: list[int], params) -> RequestStream:
        if not self.alive:
            raise APIError(503, "the engine is not running", kind="service_unavailable", code="engine_dead")
        stream = RequestStream(request_id, len(prompt_token_ids))
        self.active[request_id] = stream
        self._idle.clear()
        self._commands.put(("add", stream, prompt_token_ids, params))
        if not self.alive:  # it died between the check and the put: nobody will ever accept the request
            self.active.pop(request_id, None)
            raise APIError(503, "the engine is not running", kind="service_unavailable", code="engine_dead")
        return stream

    def abort(self, request_id: str, error: APIError | None = None) -> None:
        """Stop a request. error=None: the client is gone (nobody to tell). With an error: the handler gets it."""
        if error is None and "skip_abort_on_disconnect" in self.faults:
            return
        self._commands.put(("abort", request_id, error))

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

    def stop(self, timeout: float = 10.0) -> None:
        self._commands.put(("stop",))
        self._thread.join(timeout)

    def _deliver(self, items: list) -> None:
        for stream, item in items:
            if isinstance(item, tuple):  # ("accepted", None | APIError)
                if not stream.accepted.done():
                    if item[1] is None:
                        stream.accepted.set_result(True)
                    else:
                        stream.accepted.set_exception(item[1])
            else:
                stream.queue.put_nowait(item)

    def _send(self, items: list) -> None:
        if items and self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._deliver, items)

    # --- engine thread ------------------------------------------------------------------------------------
    def _run(self) -> None:
        pending: list = []
        try:
            while True:
                commands = [self._commands.get()] if not self.engine.has_unfinished else []
                while True:
                    try:
                        commands.append(self._commands.get_nowait())
                    except queue.Empty:
                        break
                pending = commands
                if not self._apply(commands):
                    return
                pending = []
                if self.engine.has_unfinished:
                    self.engine.step()
                    self.snapshot = self.engine.load()  # before the deltas: a client's next /metrics sees it
                    self._emit()
                else:
                    self.snapshot = self.engine.load()
        except BaseException as err:
            self.error = err
            log.exception("engine thread died")
            dead = APIError(
                500, f"the engine failed: {type(err).__name__}: {err}", kind="server_error", code="engine_dead"
            )
            items = [(live.stream, dead) for live in self._live.values()]
            items += [(cmd[1], ("accepted", dead)) for cmd in pending if cmd[0] == "add"]
            self._live.clear()
            self._send(items)

    def _apply(self, commands: list) -> bool:
        items = []
        for cmd in commands:
            if cmd[0] == "stop":
                return False
            if cmd[0] == "add":
                _, stream, ids, params = cmd
                try:
                    seq = self.engine.add_request(ids, params, request_id=stream.request_id)
                except (TypeError, ValueError) as err:
                    items.append((stream, ("accepted", APIError(400, str(err), str(err).split(":")[0]))))
                    continue
                detok = None
                if self.tokenizer is not None:
                    from runner.engine.detokenizer import Detokenizer

                    detok = Detokenizer(self.tokenizer, ids, params.stop)
                self._live[stream.request_id] = _Live(stream, seq, detok, last=stream.arrival)
                if self.metrics is not None:
                    self.metrics.prompt_tokens.inc(len(ids))
                items.append((stream, ("accepted", None)))
            elif cmd[0] == "abort":
                _, request_id, error = cmd
                live = self._live.pop(request_id, None)
                self.engine.abort(request_id)
                if live is not None and error is not None:
                    items.append((live.stream, error))
                if live is not None and self.metrics is not None:
                    self.metrics.finished.labels("abort").inc()
        self._send(items)
        return True

    def _emit(self) -> None:
        now, items, m = time.perf_counter(), [], self.metrics
        for request_id, live in list(self._live.items()):
            seq = live.seq
            n = seq.num_output_tokens
            if n == live.sent and not seq.is_finished:
                continue
            new = seq.output_token_ids[live.sent :]
            text = "".join(live.detok.add(t) for t in new) if live.detok is not None else ""
            if live.detok is not None and seq.is_finished:
                text += live.detok.flush()  # what was held back for a stop string that never matched
            if m is not None and new:
                m.generation_tokens.inc(len(new))
                gaps = len(new)
                if live.sent == 0:
                    m.ttft.observe(now - live.stream.arrival)
                    gaps -= 1
                for _ in range(gaps):
                    m.itl.observe((now - live.last) / len(new))
            live.sent, live.last = n, now
            finish = None
            if seq.is_finished:
                finish = seq.finish_reason.value if seq.finish_reason is not None else "abort"
                del self._live[request_id]
                if m is not None:
                    m.finished.labels(finish).inc()
            items.append((live.stream, Delta(text, n, finish)))
        self._send(items)
