"""The n choices of one API request: n engine requests with the same prompt, read together.

Each choice is a request of its own in the engine (its id is the API request's, with "-<index>" appended when
n > 1), so the scheduler batches them and the prefix cache shares their prompt's KV blocks. Their streams share
one wake event: `batches()` waits for it, then takes everything every choice has queued, each choice's deltas
joined into one. So a reader that fell behind (a slow client, a busy event loop) handles one piece per choice
for several engine steps instead of one per step.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from runner.server.bridge import AsyncEngine, Delta, RequestStream
from runner.server.protocol import GenerateInput


class Choices:
    def __init__(self, bridge: AsyncEngine, request_id: str, job: GenerateInput, wake_tokens: int = 1) -> None:
        """`wake_tokens`: tokens a choice queues before `batches()` wakes for it (its finish always wakes it):
        the stream interval of a stream, more than max_tokens for a whole response."""
        self.bridge = bridge
        self.wake = asyncio.Event()
        self.streams: list[RequestStream] = []
        self.closed = False
        try:
            for i, params in enumerate(job.choices):
                stream = bridge.submit(request_id if job.n == 1 else f"{request_id}-{i}", job.prompt_token_ids, params)
                stream.wake, stream.wake_tokens = self.wake, wake_tokens
                self.streams.append(stream)
        except BaseException:
            self.close()
            raise

    async def accepted(self) -> None:
        """Wait until the engine took every choice; a refusal (or a cancellation) aborts them all."""
        try:
            for stream in self.streams:
                await stream.accepted
        except BaseException:
            self.close()  # cancelled while waiting: the engine may have taken some already
            raise

    @property
    def finished(self) -> bool:
        return all(stream.finished for stream in self.streams)

    @property
    def prompt_tokens(self) -> int:
        return self.streams[0].prompt_tokens

    async def batches(self) -> AsyncIterator[list[tuple[int, Delta]]]:
        """(choice index, every delta it queued since the last batch, joined) for the choices with something
        new, until every choice finished; a choice's error (shutdown, engine death) raises."""
        while not self.finished:
            self.wake.clear()  # before taking: whatever arrives after the take sets it again
            batch = [(i, delta) for i, stream in enumerate(self.streams) if (delta := stream.take()) is not None]
            if batch:
                yield batch
            elif not self.finished:
                await self.wake.wait()

    def close(self) -> None:
        """The handler is done: abort the choices still running (the client left, a choice failed) and release
        them all."""
        if self.closed:
            return
        self.closed = True
        for stream in self.streams:
            if not stream.finished:
                self.bridge.abort(stream.request_id)
            self.bridge.release(stream)
