"""The n choices of a request read together (runner.server.choices), against a stand-in bridge: deltas queued
while nobody read come out as one joined piece per choice; the choices' seeds are s, s + 1, ...; closing aborts
the choices still running."""

from __future__ import annotations

import asyncio

from runner.engine.messages import TokenLogprobs
from runner.server.bridge import Delta, RequestStream
from runner.server.choices import Choices
from runner.server.protocol import Limits, completion_input

LIMITS = Limits(("m",), max_model_len=64, kv_tokens=640, block_size=16, vocab_size=100)


class FakeBridge:
    def __init__(self) -> None:
        self.streams: dict[str, RequestStream] = {}
        self.params: dict[str, object] = {}
        self.aborted: list[str] = []
        self.released: list[str] = []

    def submit(self, request_id, prompt_token_ids, params) -> RequestStream:
        stream = self.streams[request_id] = RequestStream(request_id, len(prompt_token_ids))
        self.params[request_id] = params
        stream.accepted.set_result(True)
        return stream

    def abort(self, request_id) -> None:
        self.aborted.append(request_id)

    def release(self, stream) -> None:
        self.released.append(stream.request_id)


def _lp(token_id: int) -> TokenLogprobs:
    return TokenLogprobs(token_id, -1.0, 1)


def test_queued_deltas_are_joined_and_seeds_count_up():
    async def run():
        bridge = FakeBridge()
        job = completion_input({"model": "m", "prompt": [1, 2], "n": 2, "seed": 7, "max_tokens": 3}, LIMITS, None)
        choices = Choices(bridge, "cmpl-x", job)
        await choices.accepted()
        assert [bridge.params[f"cmpl-x-{i}"].seed for i in range(2)] == [7, 8]
        first, second = (bridge.streams[f"cmpl-x-{i}"] for i in range(2))
        for k in range(3):  # three engine steps queued before the reader looks
            first.put(Delta(f"a{k}", k + 1, "length" if k == 2 else None, (10 + k,), (_lp(10 + k),)))
        second.put(Delta("b0", 1, None, (20,)))
        batches = choices.batches()
        batch = await batches.__anext__()
        assert [i for i, _ in batch] == [0, 1]
        joined = batch[0][1]
        assert (joined.text, joined.num_tokens, joined.finish_reason) == ("a0a1a2", 3, "length")
        assert joined.new_token_ids == (10, 11, 12) and [e.token_id for e in joined.logprobs] == [10, 11, 12]
        # the reader waits for the wake event: the next delta of the second choice wakes it
        waiting = asyncio.ensure_future(batches.__anext__())
        await asyncio.sleep(0)
        assert not waiting.done()
        second.put(Delta("b1", 2, "stop", (21,)))
        assert [(i, d.text) for i, d in await waiting] == [(1, "b1")]
        assert choices.finished
        choices.close()
        assert bridge.aborted == [] and bridge.released == ["cmpl-x-0", "cmpl-x-1"]

    asyncio.run(run())


def test_close_aborts_the_choices_still_running():
    async def run():
        bridge = FakeBridge()
        job = completion_input({"model": "m", "prompt": [1], "n": 3, "max_tokens": 2}, LIMITS, None)
        choices = Choices(bridge, "cmpl-y", job)
        bridge.streams["cmpl-y-1"].put(Delta("x", 1, "length", (5,)))
        await choices.batches().__anext__()
        choices.close()
        choices.close()  # once only
        assert bridge.aborted == ["cmpl-y-0", "cmpl-y-2"] and len(bridge.released) == 3

    asyncio.run(run())


def test_a_choice_wakes_its_reader_every_wake_tokens_and_at_its_finish():
    async def run():
        bridge = FakeBridge()
        job = completion_input({"model": "m", "prompt": [1], "max_tokens": 8}, LIMITS, None)
        choices = Choices(bridge, "cmpl-w", job, wake_tokens=3)
        stream, batches = bridge.streams["cmpl-w"], choices.batches()
        reading = asyncio.ensure_future(batches.__anext__())
        await asyncio.sleep(0)  # the reader found nothing and waits
        for k in range(2):  # two tokens: below the threshold, the reader sleeps on
            stream.put(Delta(f"t{k}", k + 1, None, (k,)))
            await asyncio.sleep(0)
            assert not reading.done()
        stream.put(Delta("t2", 3, None, (2,)))  # the third wakes it, with all three joined
        assert [d.new_token_ids for _, d in await reading] == [(0, 1, 2)]
        reading = asyncio.ensure_future(batches.__anext__())
        await asyncio.sleep(0)
        stream.put(Delta("t3", 4, "length", (3,)))  # one token, but a finish: wakes at once
        assert [(d.new_token_ids, d.finish_reason) for _, d in await reading] == [((3,), "length")]
        choices.close()

    asyncio.run(run())
