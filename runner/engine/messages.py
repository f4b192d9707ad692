"""What the engine core and its clients say to each other: one schema, as msgspec Structs, used in-process
as plain objects and encoded as MessagePack between the frontend and an engine-core process (pyzmq).

Client -> core: `AddRequest`, `Abort`, `Shutdown`. Core -> client: `Ready` (what the frontend needs to know
of the loaded model and cache) or `Failed` (the core could not start, or died: its error in one line), then
`StepOutputs` after every step: the new tokens of every request that got some, finished requests with their
reason, and the core's load (running and waiting requests, KV blocks, prefix-cache counters), so no client
ever reaches into the engine's objects.
"""

from __future__ import annotations

import msgspec

from runner.engine.sampling_params import SamplingParams


class TokenLogprobs(msgspec.Struct, array_like=True, omit_defaults=True):
    """The logprob of one chosen token (its rank among the vocabulary, 1 = most likely) and the top-k
    alternatives of that position, most likely first."""

    token_id: int
    logprob: float
    rank: int
    top_ids: list[int] = []
    top_logprobs: list[float] = []


class AddRequest(msgspec.Struct, tag=True, array_like=True):
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams


class Abort(msgspec.Struct, tag=True, array_like=True):
    request_ids: list[str]


class Shutdown(msgspec.Struct, tag=True, array_like=True):
    """Finish the requests in flight for up to `drain_s` seconds (0: abort them), then exit."""

    drain_s: float = 0.0


class RequestDelta(msgspec.Struct, array_like=True, omit_defaults=True):
    """One request's share of a step: its new tokens, and how it finished when it did."""

    request_id: str
    new_token_ids: list[int]
    finish_reason: str | None = None  # "stop" | "length" | "abort"
    stop_reason: int | str | None = None  # the EOS / stop token id that finished it
    new_logprobs: list[TokenLogprobs] | None = None  # one per new token, when the request asked for logprobs
    prompt_logprobs: list[TokenLogprobs | None] | None = None  # once, with the first tokens; None for token 0
    num_cached_tokens: int = 0  # prompt tokens served by the prefix cache


class CoreLoad(msgspec.Struct, array_like=True):
    """The core's state after a step, for /metrics: blocks in use = usable - free (cached blocks nobody holds
    sit in the free queue, evictable)."""

    running: int
    waiting: int
    blocks_usable: int
    blocks_free: int
    prefix_queried_tokens: int
    prefix_hit_tokens: int
    # counters since the core started: steps, the pure decode ones among them (a CUDA graph's), the tokens they
    # computed and the seconds the core spent stepping (wall, host side): a step's size and cost, per scrape
    steps: int = 0
    decode_steps: int = 0
    batched_tokens: int = 0
    step_s: float = 0.0


class StepOutputs(msgspec.Struct, tag=True, array_like=True, omit_defaults=True):
    deltas: list[RequestDelta]
    load: CoreLoad
    accepted: list[str] = []  # request ids of the AddRequests the core queued since its last StepOutputs
    rejected: list[tuple[str, str]] = []  # (request id, "field: why") of AddRequests the core refused


class Ready(msgspec.Struct, tag=True, array_like=True):
    """The loaded core: what a frontend checks requests against and reports."""

    max_model_len: int
    num_kv_blocks: int  # usable blocks (the null block excluded)
    block_size: int
    vocab_size: int
    device: str
    eos_token_ids: list[int]
    load: CoreLoad


class Failed(msgspec.Struct, tag=True, array_like=True):
    message: str  # one line: "<ExceptionType>: <what>"


ToCore = AddRequest | Abort | Shutdown
FromCore = StepOutputs | Ready | Failed
