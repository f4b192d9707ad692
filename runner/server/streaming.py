"""Delivering one request: an SSE stream, or one JSON body, both aborting the request when the client leaves.

Disconnect detection does not wait for a failed write: a watcher task reads the ASGI `receive` channel, which
yields `http.disconnect` as soon as the server sees the connection close, while the request may be
waiting for the engine (a long prefill, a full batch). Whichever finishes first wins: the client left ->
its choices are aborted (their KV blocks go back to the free queue at the engine's next turn); the request
finished -> the watcher is cancelled. An error during the stream (the shutdown aborting it after
--shutdown-timeout, the engine dying) is sent as a `data: {"error": ...}` event, which the openai client raises
as an APIError, and the stream then ends with [DONE].

Chunking (`--stream-interval N`): a choice's tokens are sent once N of them are waiting, or when it finishes;
N = 1 sends every engine step's tokens as they come. Whatever the interval, a stream that fell behind (deltas of
several engine steps already queued when the writer gets to them: a slow client, a busy event loop) sends them
as one chunk (runner.server.choices), not one per step.
"""

from __future__ import annotations

import asyncio
import contextlib

from starlette.responses import Response

from runner.server.bridge import Delta
from runner.server.choices import Choices
from runner.server.errors import APIError
from runner.server.logprobs import TokenTexts
from runner.server.pieces import ChoiceOutput
from runner.server.protocol import GenerateInput
from runner.server.responses import DONE, Shape, sse


async def _wait_disconnect(receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def _race(work, receive) -> bool:
    """Run `work` (a coroutine) against the client's disconnect; True if `work` finished first."""
    task, watcher = asyncio.ensure_future(work), asyncio.ensure_future(_wait_disconnect(receive))
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in (task, watcher):
            t.cancel()
        for t in (task, watcher):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
    if task in done and not task.cancelled() and task.exception() is not None:
        raise task.exception()
    return task in done


class EventStream(Response):
    """ASGI response: `text/event-stream` of the request's chunks (a Response, so FastAPI sends it as it is)."""

    media_type = "text/event-stream"

    def __init__(
        self, choices: Choices, shape: Shape, job: GenerateInput, texts: TokenTexts | None, interval: int = 1
    ) -> None:
        # as starlette's StreamingResponse: no body, so no content-length header
        self.status_code, self.background = 200, None
        self.init_headers({"cache-control": "no-cache", "x-request-id": shape.request_id})
        self.choices, self.shape, self.job, self.interval = choices, shape, job, interval
        self.outputs = [ChoiceOutput(job, shape.chat, texts) for _ in range(job.n)]

    async def _produce(self, send) -> None:
        shape, job, choices = self.shape, self.job, self.choices
        # The events of one wake-up go out in one write, and the last piece, the usage and [DONE] in one: at 256
        # streams finishing together, three writes each through the ASGI stack held up the requests that
        # followed them.
        events: list[bytes] = []

        async def flush(more: bool = True) -> None:
            body = b"".join(events)
            events.clear()
            await send({"type": "http.response.body", "body": body, "more_body": more})

        if shape.chat:
            events += [sse(shape.role_chunk(i)) for i in range(job.n)]
            await flush()
        waiting: dict[int, list[Delta]] = {}  # tokens a choice holds back until `interval` of them
        try:
            async for batch in choices.batches():
                for i, delta in batch:
                    held = waiting.setdefault(i, [])
                    held.append(delta)
                    if sum(len(d.new_token_ids) for d in held) < self.interval and delta.finish_reason is None:
                        continue
                    piece = self.outputs[i].piece(Delta.joined(waiting.pop(i)))
                    events.append(sse(shape.chunk(i, piece, choices.prompt_tokens if job.continuous_usage else None)))
                if events and not choices.finished:
                    await flush()
            if job.include_usage:
                spent = 0 if job.prompt_only else sum(s.num_tokens for s in choices.streams)
                events.append(sse(shape.usage_chunk(choices.prompt_tokens, spent)))
        except APIError as err:
            events.append(sse(err.body()))
        events.append(DONE)
        await flush(more=False)

    async def __call__(self, scope, receive, send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        try:
            await _race(self._produce(send), receive)
        except OSError:  # the write failed: the client is gone
            pass
        finally:
            self.choices.close()  # aborts the choices still running: the client left, or a choice failed


async def collect(choices: Choices, shape: Shape, job: GenerateInput, texts: TokenTexts | None, receive):
    """The whole completion as one response object; None if the client left first (the request is then
    aborted)."""
    taken: dict[int, list[Delta]] = {i: [] for i in range(job.n)}

    async def gather() -> None:
        async for batch in choices.batches():
            for i, delta in batch:
                taken[i].append(delta)

    try:
        completed = await _race(gather(), receive)
    finally:
        choices.close()
    if not completed:
        return None
    pieces = [ChoiceOutput(job, shape.chat, texts).piece(Delta.joined(taken[i])) for i in range(job.n)]
    return shape.whole(pieces, choices.prompt_tokens)
