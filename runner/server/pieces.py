"""What one choice sends, piece by piece (a stream chunk, or the whole completion as one piece).

The first piece of a completion with `echo` starts with the prompt's text and, with logprobs, the prompt's
tokens (the first with a null logprob); with `max_tokens: 0` (the prompt alone) the one token the engine ran is
dropped, and the choice finishes as "length" with no completion tokens. Logprobs are written in the endpoint's
format (runner.server.logprobs). A request that asked for logprobs and got none from the engine is a 500: the
client would otherwise read a completion without the numbers it asked for as if they were there.
"""

from __future__ import annotations

import dataclasses

from runner.server.bridge import Delta
from runner.server.errors import APIError
from runner.server.logprobs import Legacy, TokenTexts, chat_logprobs
from runner.server.protocol import GenerateInput
from runner.server.response_models import ChatLogprobs, CompletionLogprobs


@dataclasses.dataclass(frozen=True)
class Piece:
    text: str
    logprobs: CompletionLogprobs | ChatLogprobs | None
    finish_reason: str | None
    num_tokens: int  # the choice's completion tokens so far


def _missing(what: str) -> APIError:
    return APIError(500, f"the engine sent no {what} for a request that asked for them", kind="server_error")


class ChoiceOutput:
    def __init__(self, job: GenerateInput, chat: bool, texts: TokenTexts | None) -> None:
        self.job, self.chat, self.texts = job, chat, texts
        self.first = True
        self.legacy = Legacy(texts) if job.logprobs is not None and not chat else None

    def piece(self, delta: Delta) -> Piece:
        job, first = self.job, self.first
        self.first = False
        echoing = first and job.echo is not None
        echo = job.echo if echoing else ""
        ids, entries = list(delta.new_token_ids), delta.logprobs
        text, finish, num_tokens = delta.text, delta.finish_reason, delta.num_tokens
        if job.prompt_only:  # the prompt alone: the token the engine ran is not part of the answer
            ids, entries, text, num_tokens = [], (), "", 0
            finish = "length" if finish is not None else None
        if job.logprobs is None:
            return Piece(echo + text, None, finish, num_tokens)
        if entries is None and ids:
            raise _missing("logprobs")
        entries = list(entries or ())
        if self.chat:
            return Piece(text, chat_logprobs(self.texts, entries), finish, num_tokens)
        if echoing:
            if delta.prompt_logprobs is None:
                raise _missing("prompt logprobs")
            ids, entries = [*job.prompt_token_ids, *ids], [*delta.prompt_logprobs, *entries]
        return Piece(echo + text, self.legacy(ids, entries), finish, num_tokens)
