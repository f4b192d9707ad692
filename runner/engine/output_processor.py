"""The frontend's side of every request: the engine core's token deltas in, text out. Each request is
detokenized once, incrementally (runner.engine.detokenizer), on the frontend: stop strings are matched on that
text, and a match finishes the request here and asks the caller to abort it in the core (tokens the core made
after the match are dropped). A finished request's text is the text accumulated while it streamed: nothing
is decoded twice.

`process(step)` returns the step's `Update`s (a request's new text and tokens, and its finish when it
finished) and the ids to abort in the core. `RequestOutput` is the whole of a finished request, as `LLM`
returns it.
"""

from __future__ import annotations

import dataclasses

from runner.engine.detokenizer import Detokenizer
from runner.engine.messages import RequestDelta, StepOutputs, TokenLogprobs
from runner.engine.sampling_params import SamplingParams


@dataclasses.dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    token_ids: list[int]  # generated tokens (a token that completed a stop string included)
    text: str  # generated text, special tokens skipped, cut before a matched stop string
    finish_reason: str  # "stop" | "length" | "abort"
    stop_reason: int | str | None  # the EOS / stop token id or stop string that finished it
    logprobs: list[TokenLogprobs] | None = None  # one per generated token, when asked for
    prompt_logprobs: list[TokenLogprobs | None] | None = None  # one per prompt token (None for the first)


@dataclasses.dataclass(slots=True)  # 256 a decode step: a slotted instance is built faster
class Update:
    """What a step gave one request: its new text (held back while a stop string may still match), its new
    tokens, and, on its last update, how it finished."""

    request_id: str
    text: str
    new_token_ids: list[int]
    num_tokens: int  # output tokens so far
    finish_reason: str | None = None
    new_logprobs: list[TokenLogprobs] | None = None


@dataclasses.dataclass
class RequestState:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    detok: Detokenizer | None
    token_ids: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[TokenLogprobs] = dataclasses.field(default_factory=list)
    prompt_logprobs: list[TokenLogprobs | None] | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None

    @property
    def stop(self) -> bool:
        """Whether stop strings are matched on this request's text (token by token)."""
        return self.detok is not None and bool(self.detok.stop)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def output(self) -> RequestOutput:
        text = self.detok.text if self.detok is not None else ""
        return RequestOutput(
            self.request_id,
            self.prompt,
            self.prompt_token_ids,
            self.token_ids,
            text,
            self.finish_reason or "abort",
            self.stop_reason,
            self.logprobs if self.params.logprobs is not None else None,
            self.prompt_logprobs,
        )


class OutputProcessor:
    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.requests: dict[str, RequestState] = {}

    def add(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams, prompt: str | None = None):
        if params.stop and self.tokenizer is None:
            raise ValueError("stop: stop strings need a tokenizer; this model has none")
        detok = Detokenizer(self.tokenizer, prompt_token_ids, params.stop) if self.tokenizer is not None else None
        state = RequestState(request_id, prompt, list(prompt_token_ids), params, detok)
        self.requests[request_id] = state
        return state

    def abort(self, request_id: str) -> RequestState | None:
        """Forget a request (the caller aborts it in the core); returns its state, finished as "abort"."""
        state = self.requests.pop(request_id, None)
        if state is not None and not state.finished:
            state.finish_reason = "abort"
        return state

    def process(self, step: StepOutputs) -> tuple[list[Update], list[str]]:
        """The step's updates, in delta order, and the requests a stop string finished (abort them in the
        core). Finished requests are forgotten; their `RequestState` is in the update's source."""
        updates, stopped, requests = [], [], self.requests
        for delta in step.deltas:
            state = requests.get(delta.request_id)
            if state is None or state.finish_reason is not None:  # aborted, or tokens after a stop string
                continue
            if delta.new_logprobs is None and delta.prompt_logprobs is None and not state.stop:
                update = _apply_tokens(state, delta)
            else:
                update = self._apply(state, delta)
            if update.finish_reason is not None:
                self.requests.pop(state.request_id, None)
                if delta.finish_reason is None:  # a stop string: the core still runs it
                    stopped.append(state.request_id)
            updates.append(update)
        return updates, stopped

    def _apply(self, state: RequestState, delta: RequestDelta) -> Update:
        if delta.prompt_logprobs is not None:
            state.prompt_logprobs = delta.prompt_logprobs
        text, taken = [], []
        for i, token in enumerate(delta.new_token_ids):
            state.token_ids.append(token)
            taken.append(token)
            if delta.new_logprobs is not None:
                state.logprobs.append(delta.new_logprobs[i])
            if state.detok is not None:
                text.append(state.detok.add(token))
                if state.detok.stopped_by is not None:
                    state.finish_reason, state.stop_reason = "stop", state.detok.stopped_by
                    break
        if state.finish_reason is None and delta.finish_reason is not None:
            state.finish_reason, state.stop_reason = delta.finish_reason, delta.stop_reason
            if state.detok is not None:
                text.append(state.detok.flush())  # what was held back for a stop string that never matched
        logprobs = delta.new_logprobs[: len(taken)] if delta.new_logprobs is not None else None
        return Update(state.request_id, "".join(text), taken, len(state.token_ids), state.finish_reason, logprobs)


def _apply_tokens(state: RequestState, delta: RequestDelta) -> Update:
    """`OutputProcessor._apply` for a request without stop strings and a delta without logprobs: its tokens, their
    text in one call and its finish, without the per-token loop (most deltas: 256 a decode step at 256 streams)."""
    new = list(delta.new_token_ids)
    state.token_ids += new
    text = state.detok.extend(new) if state.detok is not None else ""
    if delta.finish_reason is not None:
        state.finish_reason, state.stop_reason = delta.finish_reason, delta.stop_reason
    return Update(state.request_id, text, new, len(state.token_ids), state.finish_reason)
