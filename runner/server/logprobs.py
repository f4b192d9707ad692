"""The engine's logprobs (runner.engine.messages.TokenLogprobs: a token, its logprob, the top-k alternatives) in
OpenAI's two formats.

A token's text is the token decoded alone, as OpenAI and vLLM show tokens in logprobs: a character that spans
tokens shows as U+FFFD in each. Its `bytes` (chat) are the token's own bytes where the tokenizer is byte-level
BPE (GPT-2's byte-to-character table, openai/gpt-2 src/encoder.py, read backwards), so the bytes of consecutive
tokens join into the text's UTF-8; elsewhere the UTF-8 of its text. JSON has no infinity: a -inf logprob is sent
as -9999.0, as vLLM does.

- `Legacy` (completions): tokens, token_logprobs, top_logprobs (a dict of the chosen token and the k most likely,
  by text: up to k + 1 entries, as vLLM), text_offset (where each token's text starts in the choice's text:
  the running sum of the tokens' texts, carried across a stream's chunks). A prompt token without a logprob
  (the first: nothing precedes it) has null for its logprob and its top_logprobs.
- `chat_logprobs`: content: [{token, logprob, bytes, top_logprobs: the k most likely}].
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

from runner.engine.messages import TokenLogprobs
from runner.server.response_models import ChatLogprobs, CompletionLogprobs, TokenLogprob, TopLogprob

FLOOR = -9999.0


@functools.cache
def _byte_of_char() -> dict[str, int]:
    """GPT-2's table from bytes to the printable characters a byte-level BPE vocabulary is written in, inverted."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


def clamp(logprob: float) -> float:
    return FLOOR if math.isnan(logprob) or logprob < FLOOR else logprob


class TokenTexts:
    """Each token's text (decoded alone) and bytes, cached by id."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self._cache: dict[int, tuple[str, list[int]]] = {}

    def _entry(self, token_id: int) -> tuple[str, list[int]]:
        entry = self._cache.get(token_id)
        if entry is None:
            text = self.tokenizer.decode([token_id], skip_special_tokens=False)
            raw = self.tokenizer.convert_ids_to_tokens(token_id)
            table = _byte_of_char()
            data = text.encode()
            if isinstance(raw, str) and raw and all(c in table for c in raw):
                as_bytes = bytes(table[c] for c in raw)
                # the table is right only for a byte-level vocabulary: then the bytes decode to the text
                if as_bytes.decode("utf-8", errors="replace") == text:
                    data = as_bytes
            entry = self._cache[token_id] = (text, list(data))
        return entry

    def text(self, token_id: int) -> str:
        return self._entry(token_id)[0]

    def bytes(self, token_id: int) -> list[int]:
        return self._entry(token_id)[1]


class Legacy:
    """Completions' logprobs of one choice, chunk by chunk (text_offset runs on across calls)."""

    def __init__(self, texts: TokenTexts) -> None:
        self.texts, self.offset = texts, 0

    def __call__(self, token_ids: Sequence[int], entries: Sequence[TokenLogprobs | None]) -> CompletionLogprobs:
        tokens, logprobs, tops, offsets = [], [], [], []
        for token_id, entry in zip(token_ids, entries, strict=True):
            text = self.texts.text(token_id)
            tokens.append(text)
            offsets.append(self.offset)
            self.offset += len(text)
            if entry is None:
                logprobs.append(None)
                tops.append(None)
                continue
            logprobs.append(clamp(entry.logprob))
            top = {text: clamp(entry.logprob)}
            for alt, lp in zip(entry.top_ids, entry.top_logprobs, strict=True):
                top.setdefault(self.texts.text(alt), clamp(lp))
            tops.append(top)
        return CompletionLogprobs(tokens=tokens, token_logprobs=logprobs, top_logprobs=tops, text_offset=offsets)


def chat_logprobs(texts: TokenTexts, entries: Sequence[TokenLogprobs]) -> ChatLogprobs:
    def top(token_id: int, logprob: float) -> TopLogprob:
        return TopLogprob(token=texts.text(token_id), logprob=clamp(logprob), bytes=texts.bytes(token_id))

    return ChatLogprobs(
        content=[
            TokenLogprob(
                **top(e.token_id, e.logprob).model_dump(),
                top_logprobs=[top(a, lp) for a, lp in zip(e.top_ids, e.top_logprobs, strict=True)],
            )
            for e in entries
        ]
    )
