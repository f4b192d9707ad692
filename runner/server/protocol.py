"""Request bodies of /v1/completions and /v1/chat/completions -> `GenerateInput`, or an `APIError`.

Validation is by hand, field by field, so every bad input gets a 4xx with an OpenAI-style error body naming
the field (`param`): not UTF-8 or not JSON -> 400; unknown model -> 404 (code model_not_found, as OpenAI);
wrong types, out-of-range values, a prompt that leaves no room in the context, max_tokens past the context
or past what the KV cache can hold -> 400. Sampling fields are then checked again by
runner.engine.sampling_params.SamplingParams, whose TypeError/ValueError ("field: why") become 400s too.

Ranges: temperature in [0, 2] (OpenAI's range; 0 = greedy), top_p in (0, 1], top_k >= 1 or -1/0 (off),
max_tokens >= 1. Defaults: max_tokens 16 for completions (OpenAI's), the rest of the context for chat, both
clamped to what the context and the KV cache hold. A length error names the field at fault: the prompt (or
messages) when it alone leaves no room, else the output length as the client sent it (chat: max_completion_tokens,
or the older max_tokens). Extensions, as in vLLM: top_k and ignore_eos. Fields that would change
the output and are not implemented (n > 1, logprobs, echo, best_of, suffix, penalties, logit_bias) are
rejected rather than ignored; unknown fields are ignored (as vLLM does).
"""

from __future__ import annotations

import dataclasses
import json
import math

from runner.engine.sampling_params import SamplingParams

# Not implemented: accepted only absent, null, or at their neutral value (what a client sends to mean "off").
UNSUPPORTED = {
    "n": (1,),
    "best_of": (1,),
    "logprobs": (False,),
    "top_logprobs": (0,),
    "echo": (False,),
    "suffix": ("",),
    "presence_penalty": (0,),
    "frequency_penalty": (0,),
    "logit_bias": ({},),
    "tools": ([],),
    "response_format": (),
}
MAX_STOP = 16
ROLES = ("system", "developer", "user", "assistant")


class APIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        kind: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind

    def body(self) -> dict:
        return {
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code if self.code is not None else self.status,
            }
        }


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
    params: SamplingParams
    stream: bool
    include_usage: bool


def _bad(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, param)


def parse_json(raw: bytes) -> dict:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise _bad(f"body: not valid UTF-8 ({err.reason} at byte {err.start})") from None
    try:
        body = json.loads(text)
    except json.JSONDecodeError as err:
        raise _bad(f"body: malformed JSON: {err.msg} at line {err.lineno} column {err.colno}") from None
    except RecursionError:
        raise _bad("body: JSON nested too deeply") from None
    except ValueError as err:  # e.g. an integer past Python's digit limit
        raise _bad(f"body: unreadable JSON: {err}") from None
    if not isinstance(body, dict):
        raise _bad(f"body: must be a JSON object, got {type(body).__name__}")
    return body


def _typed(body: dict, name: str, kind: type | tuple, what: str, default=None):
    value = body.get(name)
    if value is None:
        return default
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(value, bool) and bool not in kinds:
        raise _bad(f"{name}: must be {what}, got {json.dumps(value)}", name)
    if not isinstance(value, kinds):
        raise _bad(f"{name}: must be {what}, got {type(value).__name__} {json.dumps(value)[:60]}", name)
    if isinstance(value, float) and not math.isfinite(value):
        raise _bad(f"{name}: must be finite", name)
    return value


def check_model(body: dict, limits: Limits) -> str:
    model = body.get("model")
    if not isinstance(model, str):
        raise _bad(f"model: required, a string (served: {', '.join(limits.model_names)})", "model")
    if model not in limits.model_names:
        raise APIError(
            404, f"model: {model!r} does not exist; served: {', '.join(limits.model_names)}", "model", "model_not_found"
        )
    return model


def _neutral(value, neutrals: tuple) -> bool:
    if value is None:
        return True
    for v in neutrals:
        if isinstance(v, bool) or isinstance(value, bool):
            if value is v:
                return True
        elif isinstance(v, int | float) and isinstance(value, int | float):
            if value == v:
                return True
        elif value == v:
            return True
    return False


def _check_unsupported(body: dict) -> None:
    for name, neutrals in UNSUPPORTED.items():
        if not _neutral(body.get(name), neutrals):
            raise _bad(f"{name}: not supported by this server (got {json.dumps(body[name])[:60]})", name)


def _stop(body: dict) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop) or len(stop) > MAX_STOP:
        raise _bad(f"stop: must be a non-empty string or a list of at most {MAX_STOP} non-empty strings", "stop")
    return stop


def _token_ids(value: list, limits: Limits, param: str) -> list[int]:
    if not value or not all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        raise _bad(f"{param}: a token-id prompt must be a non-empty list of ints", param)
    if not all(0 <= t < limits.vocab_size for t in value):
        raise _bad(f"{param}: token ids must be in [0, {limits.vocab_size})", param)
    return list(value)


def _max_tokens_field(body: dict, chat: bool) -> str:
    """The field that carries the output length, as the client sent it: chat takes max_completion_tokens (OpenAI's
    name) or the older max_tokens, so an error names the one the client wrote."""
    if chat and (body.get("max_completion_tokens") is not None or body.get("max_tokens") is None):
        return "max_completion_tokens"
    return "max_tokens"


def _sampling(
    body: dict, prompt_len: int, limits: Limits, default_max_tokens: int | None, chat: bool
) -> SamplingParams:
    _check_unsupported(body)
    prompt_field = "messages" if chat else "prompt"
    room = limits.max_model_len - prompt_len
    if room < 1:
        raise _bad(
            f"{prompt_field}: {prompt_len} tokens leave no room in the model's context of {limits.max_model_len} "
            f"tokens",
            prompt_field,
        )
    # A request holds at most prompt + max_tokens - 1 tokens of K/V (the last sampled token is never run), so a
    # prompt of more tokens than the cache holds cannot run whatever max_tokens is: the prompt is at fault.
    cache_room = limits.kv_tokens - prompt_len + 1
    if cache_room < 1:
        raise _bad(
            f"{prompt_field}: {prompt_len} tokens do not fit the KV cache ({limits.kv_tokens} tokens)", prompt_field
        )
    field = _max_tokens_field(body, chat)
    max_tokens = _typed(body, field, int, "an int >= 1")
    if max_tokens is None:  # the default never exceeds the room, so it is never an error
        max_tokens = min(room, cache_room, default_max_tokens or room)
    if max_tokens < 1:
        raise _bad(f"{field}: must be >= 1, got {max_tokens}", field)
    if max_tokens > room:
        raise _bad(
            f"{field}: {max_tokens} + the prompt's {prompt_len} tokens pass the model's "
            f"context of {limits.max_model_len} tokens",
            field,
        )
    if max_tokens > cache_room:
        raise _bad(
            f"{field}: {max_tokens} + the prompt's {prompt_len} tokens do not fit the KV cache "
            f"({limits.kv_tokens} tokens)",
            field,
        )
    temperature = _typed(body, "temperature", (int, float), "a number in [0, 2]", 1.0)
    if not 0 <= temperature <= 2:
        raise _bad(f"temperature: must be in [0, 2], got {temperature}", "temperature")
    top_p = _typed(body, "top_p", (int, float), "a number in (0, 1]", 1.0)
    if not 0 < top_p <= 1:
        raise _bad(f"top_p: must be in (0, 1], got {top_p}", "top_p")
    try:
        return SamplingParams(
            temperature=temperature,
            top_p=top_p,
            top_k=_typed(body, "top_k", int, "an int", -1),
            seed=_typed(body, "seed", int, "an int"),
            max_tokens=max_tokens,
            stop=_stop(body),
            ignore_eos=_typed(body, "ignore_eos", bool, "a bool", False),
        )
    except (TypeError, ValueError) as err:  # SamplingParams names the field first: "top_k: must be ..."
        raise _bad(str(err), str(err).split(":")[0]) from None


def _stream_flags(body: dict) -> tuple[bool, bool]:
    stream = _typed(body, "stream", bool, "a bool", False)
    options = _typed(body, "stream_options", dict, "an object", {})
    include = options.get("include_usage")
    include = False if include is None else include  # null = not asked
    if not isinstance(include, bool):
        raise _bad("stream_options.include_usage: must be a bool", "stream_options")
    if options and not stream:
        raise _bad("stream_options: only allowed with stream: true", "stream_options")
    return stream, include


def completion_input(body: dict, limits: Limits, tokenizer) -> GenerateInput:
    model = check_model(body, limits)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        if not prompt:
            raise _bad("prompt: must not be empty", "prompt")
        if tokenizer is None:
            raise _bad("prompt: this model has no tokenizer; send token ids", "prompt")
        ids = tokenizer.encode(prompt)
    elif isinstance(prompt, list) and prompt and all(isinstance(p, str | list) for p in prompt):
        raise _bad("prompt: one prompt per request (a list of several is not supported)", "prompt")
    elif isinstance(prompt, list):
        ids = _token_ids(prompt, limits, "prompt")
    else:
        raise _bad("prompt: required, a string or a list of token ids", "prompt")
    stream, include_usage = _stream_flags(body)
    return GenerateInput(model, ids, _sampling(body, len(ids), limits, 16, chat=False), stream, include_usage)


def _content(message: dict, index: int) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(
        isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content
    ):
        return "".join(p["text"] for p in content)
    raise _bad(f"messages[{index}].content: must be a string or a list of text parts", "messages")


def chat_input(body: dict, limits: Limits, tokenizer) -> GenerateInput:
    model = check_model(body, limits)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _bad("messages: required, a non-empty list of {role, content} objects", "messages")
    conversation = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            raise _bad(f"messages[{i}]: must be an object with role in {ROLES}", "messages")
        conversation.append({"role": message["role"], "content": _content(message, i)})
    if tokenizer is None:
        # The request's own fields are checked first (as for a model with a template, with a 1-token prompt):
        # a malformed field is named whatever the model, then the model's missing template is.
        _stream_flags(body)
        _sampling(body, 1, limits, None, chat=True)
        raise _bad("messages: this model has no tokenizer and no chat template", "messages")
    try:  # the template writes the special tokens itself
        text = tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False)
    except Exception as err:  # a template may reject a conversation (jinja raise_exception)
        raise _bad(f"messages: the chat template rejected them: {err}", "messages") from None
    ids = tokenizer.encode(text, add_special_tokens=False)
    stream, include_usage = _stream_flags(body)
    params = _sampling(body, len(ids), limits, None, chat=True)
    return GenerateInput(model, ids, params, stream, include_usage)
