"""The request bodies of /v1/completions and /v1/chat/completions as pydantic models: each field's type, range
and shape, checked first; /openapi.json publishes the same models.

Strict, as OpenAI's API is: nothing is coerced (the string "16" is not a max_tokens, true is not 1, 2.0 is not an
int) and NaN or infinities are refused. Unknown fields are ignored (as vLLM does). Fields this server does not
implement are declared with the one value that means "off" (OpenAI's default) and refused otherwise, rather than
ignored, since ignoring them would change the output silently. What needs the loaded model (its names, context,
KV cache, vocabulary, tokenizer) is checked afterwards, by runner.server.protocol; the schema still states those
rules where they are fixed (a token id is >= 0, a batch prompt holds one prompt), through `json_schema_extra`.

Ranges follow OpenAI's API reference: temperature in [0, 2], top_p in (0, 1], completions' logprobs in [0, 5],
chat's top_logprobs in [0, 20]; n in [1, 128] is a bound of ours (n engine requests per API request). vLLM's
extensions: top_k (>= 1, or -1 / 0 for off), ignore_eos, stream_options.continuous_usage_stats.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, WrapValidator
from pydantic_core import PydanticCustomError

MAX_STOP = 16
MAX_N = 128
MAX_COMPLETION_LOGPROBS = 5  # OpenAI's legacy completions limit
MAX_TOP_LOGPROBS = 20  # OpenAI's chat limit
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1  # what a torch.Generator takes (SamplingParams checks it too)
ROLES = ("system", "developer", "user", "assistant")


def one_of(what: str) -> WrapValidator:
    """A union's failure as one error, "must be <what>" (pydantic would report one per member, none of them
    the one the client meant)."""

    def check(value, handler):
        try:
            return handler(value)
        except ValidationError:
            raise PydanticCustomError("union_type", "must be {what}", {"what": what}) from None

    return WrapValidator(check)


def _off_only(neutral: tuple) -> AfterValidator:
    def check(value):
        if value is None or any(type(value) is type(n) and value == n for n in neutral):
            return value
        raise PydanticCustomError(
            "unsupported",
            "not supported by this server; only {neutral} is accepted",
            {"neutral": " or ".join(repr(n) for n in neutral) or "null"},
        )

    return AfterValidator(check)


def off_only(kind, schema: dict, *neutral):
    """A field this server does not implement: null or its neutral value; `schema` says so in /openapi.json."""
    return Annotated[kind | None, _off_only(neutral), Field(json_schema_extra=schema)]


# Not implemented here (null or the neutral value only).
BestOf = off_only(int, {"minimum": 1, "maximum": 1}, 1)
Penalty = off_only(float, {"minimum": 0, "maximum": 0}, 0.0)
LogitBias = off_only(dict[str, float], {"maxProperties": 0}, {})
Suffix = off_only(str, {"maxLength": 0}, "")
NoTopLogprobs = off_only(int, {"minimum": 0, "maximum": 0}, 0)
NoEcho = off_only(bool, {"not": {"const": True}}, False)
NoTools = off_only(list[Any], {"maxItems": 0}, [])
NoResponseFormat = off_only(dict[str, Any], {"type": "null"})

NonEmpty = Annotated[str, Field(min_length=1)]
Stop = Annotated[
    NonEmpty | Annotated[list[NonEmpty], Field(max_length=MAX_STOP)],
    one_of(f"a non-empty string or a list of at most {MAX_STOP} non-empty strings"),
]
# Token ids are checked against the vocabulary (and a batch against its size) once the model is known.
TokenId = Annotated[int, Field(json_schema_extra={"minimum": 0})]
TokenIds = Annotated[list[TokenId], Field(json_schema_extra={"minItems": 1})]
Prompt = Annotated[
    Annotated[str, Field(json_schema_extra={"minLength": 1})]
    | TokenIds
    | Annotated[list[str], Field(json_schema_extra={"minItems": 1, "maxItems": 1})]
    | Annotated[list[TokenIds], Field(json_schema_extra={"minItems": 1, "maxItems": 1})],
    one_of("a string, a list of token ids, or a list holding one of those"),
]


class Strict(BaseModel):
    model_config = ConfigDict(strict=True, allow_inf_nan=False, extra="ignore")


class StreamOptions(Strict):
    include_usage: bool | None = Field(None, description="a last chunk with the usage, and no choices")
    continuous_usage_stats: bool | None = Field(
        None, description="vLLM: every chunk carries the usage so far (with include_usage)"
    )


class Sampling(Strict):
    """Fields both endpoints take."""

    model: str = Field(description="a served model's name (GET /v1/models)")
    temperature: float | None = Field(None, ge=0, le=2, description="0: greedy")
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1, description="vLLM: the k most likely tokens only; -1 or 0: off")
    n: int | None = Field(None, ge=1, le=MAX_N, description="choices to generate for the prompt")
    seed: int | None = Field(None, ge=SEED_MIN, le=SEED_MAX, description="choice i samples with seed + i")
    stop: Stop | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    ignore_eos: bool | None = Field(None, description="vLLM: keep generating past the end-of-sequence token")
    user: str | None = None
    best_of: BestOf = None
    presence_penalty: Penalty = None
    frequency_penalty: Penalty = None
    logit_bias: LogitBias = None


class CompletionRequest(Sampling):
    prompt: Prompt
    max_tokens: int | None = Field(
        None, ge=0, description="default 16, clamped to the context; 0 only with echo: the prompt alone"
    )
    echo: bool | None = Field(None, description="the prompt (and its logprobs) before the completion")
    logprobs: int | None = Field(
        None, ge=0, le=MAX_COMPLETION_LOGPROBS, description="the chosen token's logprob and the top alternatives"
    )
    suffix: Suffix = None
    top_logprobs: NoTopLogprobs = None


class TextPart(Strict):
    type: Literal["text"]
    text: str


class ChatMessage(Strict):
    role: Literal[ROLES]
    content: Annotated[str | list[TextPart], one_of("a string or a list of text parts")]
    name: str | None = None


class ChatCompletionRequest(Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1, description="default: the rest of the context")
    max_tokens: int | None = Field(None, ge=1, description="the older name of max_completion_tokens")
    logprobs: bool | None = Field(None, description="the logprob of each output token")
    top_logprobs: int | None = Field(
        None, ge=0, le=MAX_TOP_LOGPROBS, description="alternatives per token (needs logprobs: true)"
    )
    echo: NoEcho = None
    tools: NoTools = None
    response_format: NoResponseFormat = None
    suffix: Suffix = None
