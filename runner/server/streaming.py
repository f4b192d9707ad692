"""Delivering one request: an SSE stream, or one JSON body, both aborting the request when the client leaves.

Disconnect detection does not wait for a failed write: a watcher task reads the ASGI `receive` channel, which
yields `http.disconnect` as soon as the server sees the connection close, while the request may be
waiting for the engine (a long prefill, a full batch). Whichever finishes first wins: the client left ->
`bridge.abort(id)` (its KV blocks go back to the free queue at the engine's next turn); the request
finished -> the watcher is cancelled. An error during the stream (the shutdown aborting it after
--shutdown-timeout, the engine dying) is sent as a `data: {"error": ...}` event, which the openai client raises
as an APIError, and the stream then ends with [DONE].
"""

from __future__ import annotations

import asyncio
import contextlib

from runner.server.bridge import AsyncEngine, RequestStream
from runner.server.protocol import APIError, GenerateInput
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


class EventStream:
    """ASGI response: `text/event-stream` of the request's chunks."""

    def __init__(self, bridge: AsyncEngine, stream: RequestStream, shape: Shape, job: GenerateInput) -> None:
        self.bridge, self.stream, self.shape, self.job = bridge, stream, shape, job

    async def _produce(self, send) -> None:
        shape, stream = self.shape, self.stream

        async def chunk(payload: dict | bytes) -> None:
            body = payload if isinstance(payload, bytes) else sse(payload)
            await send({"type": "http.response.body", "body": body, "more_body": True})

        if shape.chat:
            await chunk(shape.chunk(None, first=True))
        try:
            async for delta in stream:  # one chunk per engine step that gave the request tokens
                await chunk(shape.chunk(delta.text, delta.finish_reason))
            if self.job.include_usage:
                await chunk(shape.usage_chunk(stream.prompt_tokens, stream.num_tokens))
        except APIError as err:
            await chunk(err.body())
        await send({"type": "http.response.body", "body": DONE, "more_body": False})

    async def __call__(self, scope, receive, send) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"text/event-stream; charset=utf-8"),
                    (b"cache-control", b"no-cache"),
                    (b"x-request-id", self.stream.request_id.encode()),
                ],
            }
        )
        completed = False
        try:
            completed = await _race(self._produce(send), receive)
        except OSError:  # the write failed: the client is gone
            completed = False
        finally:
            if not completed and not self.stream.finished:
                self.bridge.abort(self.stream.request_id)
            self.bridge.release(self.stream)


async def collect(bridge: AsyncEngine, stream: RequestStream, shape: Shape, receive) -> dict | None:
    """The whole completion as one object; None if the client left first (the request is then aborted)."""
    parts: list[str] = []
    finish: list[str] = []

    async def gather() -> None:
        async for delta in stream:
            parts.append(delta.text)
            if delta.finish_reason is not None:
                finish.append(delta.finish_reason)

    try:
        completed = await _race(gather(), receive)
    finally:
        if not stream.finished:
            bridge.abort(stream.request_id)
        bridge.release(stream)
    if not completed:
        return None
    return shape.whole("".join(parts), finish[0], stream.prompt_tokens, stream.num_tokens)
