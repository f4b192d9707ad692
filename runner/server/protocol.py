"""Validated request models (runner.server.request_models) -> `GenerateInput`, or an `APIError`: the rules that
need the loaded model.

pydantic has already checked every field's type and range (a 400 naming the field). Here: an unknown model ->
404 (code model_not_found, as OpenAI); the prompt's tokens (the chat template for chat) within the vocabulary;
a prompt that leaves no room in the context, or max_tokens past the context or past what the KV cache can hold
-> 400. Sampling fields are checked again by runner.engine.sampling_params.SamplingParams, whose
TypeError/ValueError ("field: why") become 400s too.

Defaults: max_tokens 16 for completions (OpenAI's), the rest of the context for chat, both clamped to what the
context and the KV cache hold. A length error names the field at fault: the prompt (or messages) when it alone
leaves no room, else the output length as the client sent it (chat: max_completion_tokens, or the older
max_tokens). `n` choices are n engine requests with the same prompt; with a seed s, choice i samples with seed
s + i (as vLLM's parallel sampling does, vllm/v1/engine/parallel_sampling.py), so each choice repeats on its own.
Logprobs: completions' `logprobs: k` asks the engine for the chosen token's logprob and the k most likely, and
with `echo` the same for every prompt token (SamplingParams.prompt_logprobs); chat's `logprobs: true` with
`top_logprobs: k` the same for the output. `max_tokens: 0` with `echo` returns the prompt alone (as vLLM does:
the engine runs one token, which is dropped): what evaluation harnesses send for a prompt's log-likelihood.
"""

from __future__ import annotations

import dataclasses
import json

from pydantic import ValidationError

from runner.engine.sampling_params import SamplingParams
from runner.server.errors import APIError, bad, from_validation
from runner.server.request_models import ChatCompletionRequest, CompletionRequest, Sampling

__all__ = ["APIError", "GenerateInput", "Limits", "chat_input", "completion_input", "parse_json"]


@dataclasses.dataclass(frozen=True)
class Limits:
    """What a request is checked against: the served names, the context and the KV cache."""

    model_names: tuple[str, ...]
    max_model_len: int
    kv_tokens: int  # usable blocks * block_size: the most K/V one request can hold
    block_size: int
    vocab_size: int

    @classmethod
    def of(cls, model_names: tuple[str, ...], ready) -> Limits:
        """The limits of a ready engine core (runner.engine.messages.Ready)."""
        return cls(
            model_names, ready.max_model_len, ready.num_kv_blocks * ready.block_size, ready.block_size, ready.vocab_size
        )


@dataclasses.dataclass(frozen=True)
class GenerateInput:
    model: str
    prompt_token_ids: list[int]
    choices: tuple[SamplingParams, ...]  # one per choice (n): the seeds differ when the request has one
    stream: bool
    include_usage: bool
    continuous_usage: bool = False  # every chunk carries the usage so far
    logprobs: int | None = None  # top alternatives per token when logprobs were asked for (0: the token's only)
    echo: str | None = None  # completions' echo: the prompt's text, returned before the completion
    prompt_only: bool = False  # max_tokens 0 with echo: the generated token is dropped

    @property
    def params(self) -> SamplingParams:
        return self.choices[0]

    @property
    def n(self) -> int:
        return len(self.choices)


def parse_json(raw: bytes) -> dict:
    """The body as a JSON object, or a 400 saying exactly what is wrong with it (pydantic would only say "JSON
    decode error" or nothing at all for bytes that are not UTF-8, nesting too deep, an integer too long)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise bad(f"body: not valid UTF-8 ({err.reason} at byte {err.start})") from None
    try:
        body = json.loads(text)
    except json.JSONDecodeError as err:
        raise bad(f"body: malformed JSON: {err.msg} at line {err.lineno} column {err.colno}") from None
    except RecursionError:
        raise bad("body: JSON nested too deeply") from None
    except ValueError as err:  # e.g. an integer past Python's digit limit
        raise bad(f"body: unreadable JSON: {err}") from None
    if not isinstance(body, dict):
        raise bad(f"body: must be a JSON object, got {type(body).__name__}")
    return body


def validate(model: type[Sampling], body: dict) -> Sampling:
    """A body as the endpoint's request model, or a 400 naming the first field at fault."""
    try:
        return model.model_validate(body)
    except ValidationError as err:
        raise from_validation(err.errors(include_url=False)) from None


def check_model(model: str, limits: Limits) -> str:
    if model not in limits.model_names:
        raise APIError(
            404, f"model: {model!r} does not exist; served: {', '.join(limits.model_names)}", "model", "model_not_found"
        )
    return model


def _token_ids(value: list, limits: Limits, param: str) -> list[int]:
    if not value:
        raise bad(f"{param}: a token-id prompt must be a non-empty list of ints", param)
    if min(value) < 0 or max(value) >= limits.vocab_size:  # ints already (the request model); C-level scans
        raise bad(f"{param}: token ids must be in [0, {limits.vocab_size})", param)
    return list(value)


def _max_tokens_field(req: Sampling, chat: bool) -> str:
    """The field that carries the output length, as the client sent it: chat takes max_completion_tokens (OpenAI's
    name) or the older max_tokens, so an error names the one the client wrote."""
    if chat and (req.max_completion_tokens is not None or req.max_tokens is None):
        return "max_completion_tokens"
    return "max_tokens"


def _max_tokens(req: Sampling, prompt_len: int, limits: Limits, default: int | None, chat: bool) -> int:
    prompt_field = "messages" if chat else "prompt"
    room = limits.max_model_len - prompt_len
    if room < 1:
        raise bad(
            f"{prompt_field}: {prompt_len} tokens leave no room in the model's context of {limits.max_model_len} "
            f"tokens",
            prompt_field,
        )
    # A request holds at most prompt + max_tokens - 1 tokens of K/V (the last sampled token is never run), so a
    # prompt of more tokens than the cache holds cannot run whatever max_tokens is: the prompt is at fault.
    cache_room = limits.kv_tokens - prompt_len + 1
    if cache_room < 1:
        raise bad(
            f"{prompt_field}: {prompt_len} tokens do not fit the KV cache ({limits.kv_tokens} tokens)", prompt_field
        )
    field = _max_tokens_field(req, chat)
    max_tokens = getattr(req, field)
    if max_tokens is None:  # the default never exceeds the room, so it is never an error
        return min(room, cache_room, default or room)
    if max_tokens == 0:
        if not chat and req.echo:
            return 1  # the prompt alone: one token runs (for the prompt's logprobs) and is dropped
        raise bad(f"{field}: must be >= 1 (0 only with echo: the prompt alone), got 0", field)
    if max_tokens > room:
        raise bad(
            f"{field}: {max_tokens} + the prompt's {prompt_len} tokens pass the model's "
            f"context of {limits.max_model_len} tokens",
            field,
        )
    if max_tokens > cache_room:
        raise bad(
            f"{field}: {max_tokens} + the prompt's {prompt_len} tokens do not fit the KV cache "
            f"({limits.kv_tokens} tokens)",
            field,
        )
    return max_tokens


def _choices(req: Sampling, max_tokens: int, logprobs: int | None, prompt_logprobs: int | None) -> tuple:
    n = req.n or 1
    if req.seed is not None and req.seed + n - 1 > 2**64 - 1:
        raise bad(f"seed: {req.seed} + {n - 1} (the last choice's seed) passes 2**64 - 1", "seed")
    try:
        return tuple(
            SamplingParams(
                temperature=1.0 if req.temperature is None else req.temperature,
                top_p=1.0 if req.top_p is None else req.top_p,
                top_k=-1 if req.top_k is None else req.top_k,
                seed=None if req.seed is None else req.seed + i,
                max_tokens=max_tokens,
                stop=[req.stop] if isinstance(req.stop, str) else list(req.stop or []),
                ignore_eos=bool(req.ignore_eos),
                logprobs=logprobs,
                prompt_logprobs=prompt_logprobs,
            )
            for i in range(n)
        )
    except (TypeError, ValueError) as err:  # SamplingParams names the field first: "top_k: must be ..."
        raise bad(str(err), str(err).split(":")[0]) from None


def _stream_flags(req: Sampling) -> tuple[bool, bool, bool]:
    options = req.stream_options
    if options is not None and not req.stream:
        raise bad("stream_options: only allowed with stream: true", "stream_options")
    include = bool(options and options.include_usage)
    # as vLLM: the usage of every chunk comes with the last chunk's (include_usage)
    return bool(req.stream), include, include and bool(options.continuous_usage_stats)


def _prompt_ids(req: CompletionRequest, limits: Limits, tokenizer) -> tuple[list[int], str | None]:
    """The prompt's token ids, and its text when it came as text."""
    prompt = req.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
        if len(prompt) > 1:
            raise bad("prompt: one prompt per request (a list of several is not supported)", "prompt")
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        if not prompt:
            raise bad("prompt: must not be empty", "prompt")
        if tokenizer is None:
            raise bad("prompt: this model has no tokenizer; send token ids", "prompt")
        return tokenizer.encode(prompt), prompt
    return _token_ids(prompt, limits, "prompt"), None


def completion_input(req: CompletionRequest | dict, limits: Limits, tokenizer) -> GenerateInput:
    if isinstance(req, dict):
        req = validate(CompletionRequest, req)
    model = check_model(req.model, limits)
    ids, text = _prompt_ids(req, limits, tokenizer)
    stream, include_usage, continuous = _stream_flags(req)
    if req.logprobs is not None and tokenizer is None:
        raise bad("logprobs: this model has no tokenizer to write the tokens' text", "logprobs")
    echo = None
    if req.echo:
        if text is None and tokenizer is None:
            raise bad("echo: this model has no tokenizer to write the prompt's text", "echo")
        echo = text if text is not None else tokenizer.decode(ids, skip_special_tokens=False)
    max_tokens = _max_tokens(req, len(ids), limits, 16, chat=False)
    prompt_logprobs = req.logprobs if req.echo else None
    choices = _choices(req, max_tokens, req.logprobs, prompt_logprobs)
    return GenerateInput(
        model, ids, choices, stream, include_usage, continuous, req.logprobs, echo, prompt_only=req.max_tokens == 0
    )


def _content(content) -> str:
    return content if isinstance(content, str) else "".join(part.text for part in content)


def chat_input(req: ChatCompletionRequest | dict, limits: Limits, tokenizer) -> GenerateInput:
    if isinstance(req, dict):
        req = validate(ChatCompletionRequest, req)
    model = check_model(req.model, limits)
    stream, include_usage, continuous = _stream_flags(req)
    if req.top_logprobs and not req.logprobs:
        raise bad("top_logprobs: needs logprobs: true", "top_logprobs")
    logprobs = (req.top_logprobs or 0) if req.logprobs else None
    if tokenizer is None:
        # The request's own fields are checked first (as for a model with a template, with a 1-token prompt):
        # a malformed field is named whatever the model, then the model's missing template is.
        _choices(req, _max_tokens(req, 1, limits, None, chat=True), logprobs, None)
        raise bad("messages: this model has no tokenizer and no chat template", "messages")
    conversation = [{"role": m.role, "content": _content(m.content)} for m in req.messages]
    try:  # the template writes the special tokens itself
        text = tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False)
    except Exception as err:  # a template may reject a conversation (jinja raise_exception)
        raise bad(f"messages: the chat template rejected them: {err}", "messages") from None
    ids = tokenizer.encode(text, add_special_tokens=False)
    choices = _choices(req, _max_tokens(req, len(ids), limits, None, chat=True), logprobs, None)
    return GenerateInput(model, ids, choices, stream, include_usage, continuous, logprobs)
