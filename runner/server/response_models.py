"""The JSON bodies the server sends, as pydantic models (OpenAI's API reference shapes): every response is built
through them, so what leaves the server is what /openapi.json describes.

Completions' logprobs are OpenAI's legacy format (tokens, token_logprobs, top_logprobs, text_offset: parallel
lists, a null for the first prompt token, which has no logprob); chat's are the newer one (content: a list of
{token, logprob, bytes, top_logprobs}). A stream chunk of /v1/completions is a `Completion` too (OpenAI's
object "text_completion"), with usage null except where stream_options asked for it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

FinishReason = Literal["stop", "length"]


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionLogprobs(BaseModel):
    tokens: list[str] = Field(description="each token's text, decoded alone")
    token_logprobs: list[float | None] = Field(description="null for the first prompt token (echo)")
    top_logprobs: list[dict[str, float] | None] = Field(
        description="the chosen token and the k most likely, by text (as vLLM: up to k + 1 entries)"
    )
    text_offset: list[int] = Field(description="where each token's text starts in the choice's text")


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: FinishReason | None


class Completion(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = Field(description="the token's UTF-8 bytes (a character may span tokens)")


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[TokenLogprob] | None


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None
    finish_reason: FinishReason


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class ChatDelta(BaseModel):
    # absent rather than null when there is none (as OpenAI sends a delta)
    role: Literal["assistant"] | None = Field(None, exclude_if=lambda v: v is None)
    content: str | None = Field(None, exclude_if=lambda v: v is None)


class ChatChunkChoice(BaseModel):
    index: int
    delta: ChatDelta
    logprobs: ChatLogprobs | None = None
    finish_reason: FinishReason | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class Health(BaseModel):
    status: Literal["ok", "loading", "draining", "engine dead"]


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | int | None


class ErrorBody(BaseModel):
    error: ErrorDetail
