"""The JSON shapes the server sends: OpenAI's completion / chat.completion objects, their stream chunks, the
final usage chunk (sent when the request asked `stream_options: {include_usage: true}`, as OpenAI does), and
the SSE framing. One `Shape` per endpoint, so the routes and the streaming code never branch on the kind."""

from __future__ import annotations

import dataclasses
import json
import time


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def sse(payload: dict | str) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


DONE = sse("[DONE]")


@dataclasses.dataclass(frozen=True)
class Shape:
    request_id: str
    model: str
    chat: bool
    created: int = dataclasses.field(default_factory=lambda: int(time.time()))

    def _head(self, obj: str) -> dict:
        return {"id": self.request_id, "object": obj, "created": self.created, "model": self.model}

    def whole(self, text: str, finish_reason: str, prompt_tokens: int, completion_tokens: int) -> dict:
        if self.chat:
            choice = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": finish_reason,
            }
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        return {
            **self._head("chat.completion" if self.chat else "text_completion"),
            "choices": [choice],
            "usage": usage(prompt_tokens, completion_tokens),
        }

    def chunk(self, text: str | None, finish_reason: str | None = None, first: bool = False) -> dict:
        if self.chat:
            delta = {"role": "assistant", "content": ""} if first else ({"content": text} if text else {})
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
        return {**self._head("chat.completion.chunk" if self.chat else "text_completion"), "choices": [choice]}

    def usage_chunk(self, prompt_tokens: int, completion_tokens: int) -> dict:
        return {
            **self._head("chat.completion.chunk" if self.chat else "text_completion"),
            "choices": [],
            "usage": usage(prompt_tokens, completion_tokens),
        }
