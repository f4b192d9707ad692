"""The response objects of one request (runner.server.response_models): the whole completion or chat
completion, a stream's chunks (one choice each, as OpenAI sends them), the final usage chunk (with
`stream_options: {include_usage: true}`) and the SSE framing. One `Shape` per request, so the routes and the
streaming code never branch on the endpoint.

Usage counts the prompt once and the completion tokens of every choice (as OpenAI does for n > 1); with
`continuous_usage_stats` each chunk carries the usage of its choice so far (as vLLM does).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Sequence

from pydantic import BaseModel

from runner.server.pieces import Piece
from runner.server.response_models import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatDelta,
    Completion,
    CompletionChoice,
    Usage,
)


def usage(prompt_tokens: int, completion_tokens: int) -> Usage:
    return Usage(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
    )


def sse(payload: BaseModel | dict | str) -> bytes:
    if isinstance(payload, BaseModel):
        data = payload.model_dump_json()
    elif isinstance(payload, dict):
        data = json.dumps(payload, separators=(",", ":"))
    else:
        data = payload
    return f"data: {data}\n\n".encode()


DONE = sse("[DONE]")


@dataclasses.dataclass(frozen=True)
class Shape:
    request_id: str
    model: str
    chat: bool
    created: int = dataclasses.field(default_factory=lambda: int(time.time()))

    def _head(self) -> dict:
        return {"id": self.request_id, "created": self.created, "model": self.model}

    def whole(self, pieces: Sequence[Piece], prompt_tokens: int) -> Completion | ChatCompletion:
        total = usage(prompt_tokens, sum(p.num_tokens for p in pieces))
        if self.chat:
            choices = [
                ChatChoice(
                    index=i,
                    message=AssistantMessage(content=p.text),
                    logprobs=p.logprobs,
                    finish_reason=p.finish_reason,
                )
                for i, p in enumerate(pieces)
            ]
            return ChatCompletion(**self._head(), choices=choices, usage=total)
        choices = [
            CompletionChoice(index=i, text=p.text, logprobs=p.logprobs, finish_reason=p.finish_reason)
            for i, p in enumerate(pieces)
        ]
        return Completion(**self._head(), choices=choices, usage=total)

    def chunk(self, index: int, piece: Piece, prompt_tokens: int | None = None) -> Completion | ChatCompletionChunk:
        """One choice's piece; `prompt_tokens` given: with the usage so far (continuous_usage_stats)."""
        so_far = usage(prompt_tokens, piece.num_tokens) if prompt_tokens is not None else None
        if self.chat:
            delta = ChatDelta(content=piece.text) if piece.text else ChatDelta()
            choice = ChatChunkChoice(
                index=index, delta=delta, logprobs=piece.logprobs, finish_reason=piece.finish_reason
            )
            return ChatCompletionChunk(**self._head(), choices=[choice], usage=so_far)
        choice = CompletionChoice(
            index=index, text=piece.text, logprobs=piece.logprobs, finish_reason=piece.finish_reason
        )
        return Completion(**self._head(), choices=[choice], usage=so_far)

    def role_chunk(self, index: int) -> ChatCompletionChunk:
        """Chat's first chunk of a choice: the role, before any text (as OpenAI sends it)."""
        choice = ChatChunkChoice(index=index, delta=ChatDelta(role="assistant", content=""))
        return ChatCompletionChunk(**self._head(), choices=[choice])

    def usage_chunk(self, prompt_tokens: int, completion_tokens: int) -> Completion | ChatCompletionChunk:
        kind = ChatCompletionChunk if self.chat else Completion
        return kind(**self._head(), choices=[], usage=usage(prompt_tokens, completion_tokens))
