"""Which field a length error names, against a KV cache smaller than the context (which the servers of these
suites do not have: their 64 MiB cache holds 1440 tokens, their context is 512), straight through the request
parser: a prompt that alone does not fit the cache names the prompt (or messages), however small max_tokens;
an output length that does not fit names the field the client sent; a default length is clamped, never an
error."""

from __future__ import annotations

import pytest

from runner.server.protocol import APIError, Limits, chat_input, completion_input

LIMITS = Limits(("m",), max_model_len=4096, kv_tokens=160, block_size=16, vocab_size=1000)


class OneTokenPerCharacter:
    """A tokenizer stand-in: the chat template is the user's text; one token per character."""

    def apply_chat_template(self, conversation, **kwargs) -> str:
        return conversation[-1]["content"]

    def encode(self, text: str, **kwargs) -> list[int]:
        return [5] * len(text)


def completion(prompt_len: int, **fields) -> dict:
    return {"model": "m", "prompt": [7] * prompt_len, **fields}


def chat(prompt_len: int, **fields) -> dict:
    return {"model": "m", "messages": [{"role": "user", "content": "x" * prompt_len}], **fields}


CASES = [
    # (case, parser, body, the field the error names)
    ("prompt past the cache, max_tokens 1", completion_input, completion(200, max_tokens=1), "prompt"),
    ("prompt past the cache, no max_tokens", completion_input, completion(200), "prompt"),
    ("max_tokens past the cache", completion_input, completion(100, max_tokens=100), "max_tokens"),
    ("messages past the cache", chat_input, chat(200, max_tokens=1), "messages"),
    ("chat max_tokens past the cache", chat_input, chat(100, max_tokens=100), "max_tokens"),
    (
        "chat max_completion_tokens past the cache",
        chat_input,
        chat(100, max_completion_tokens=100),
        "max_completion_tokens",
    ),
    ("chat max_tokens past the context", chat_input, chat(10, max_tokens=5000), "max_tokens"),
]


@pytest.mark.parametrize(("parse", "body", "field"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_the_length_error_names_the_field_at_fault(parse, body, field):
    with pytest.raises(APIError) as caught:
        parse(body, LIMITS, OneTokenPerCharacter())
    assert caught.value.status == 400 and caught.value.param == field and caught.value.message.startswith(field)


@pytest.mark.parametrize("parse", [completion_input, chat_input])
def test_a_default_length_is_clamped_to_the_cache(parse):
    body = completion(150) if parse is completion_input else chat(150)
    got = parse(body, LIMITS, OneTokenPerCharacter())
    # 150 prompt tokens + max_tokens - 1 must fit the 160-token cache; completions default to 16 otherwise
    assert got.params.max_tokens == 11


def test_a_prompt_that_exactly_fills_the_cache_still_runs_one_token():
    assert completion_input(completion(160, max_tokens=1), LIMITS, None).params.max_tokens == 1
