"""Logprobs in OpenAI's two formats, from hand-made engine deltas (runner.engine.messages.TokenLogprobs), and what a
choice sends with echo and max_tokens 0 (runner.server.pieces): no server, no model."""

from __future__ import annotations

import math

import pytest

from runner.engine.messages import TokenLogprobs
from runner.engine.sampling_params import SamplingParams
from runner.server.bridge import Delta
from runner.server.errors import APIError
from runner.server.logprobs import FLOOR, Legacy, TokenTexts, chat_logprobs
from runner.server.pieces import ChoiceOutput
from runner.server.protocol import GenerateInput

WORDS = {1: "The", 2: " cat", 3: " sat", 4: " on", 5: " mat", 6: "<|end|>"}


class WordTokenizer:
    """One word per token; the raw token writes a leading space as "Ġ" (as a byte-level BPE vocabulary does)."""

    def decode(self, ids, skip_special_tokens=False):
        return "".join(WORDS[i] for i in ids)

    def convert_ids_to_tokens(self, token_id):
        return WORDS[token_id].replace(" ", "Ġ")


def lp(token_id: int, logprob: float, *top: tuple[int, float]) -> TokenLogprobs:
    return TokenLogprobs(token_id, logprob, 1, [t for t, _ in top], [v for _, v in top])


TEXTS = TokenTexts(WordTokenizer())


def test_legacy_format_tokens_logprobs_top_and_offsets():
    legacy = Legacy(TEXTS)
    out = legacy([2, 3], [lp(2, -0.5, (2, -0.5), (4, -1.5)), lp(3, -2.0, (5, -0.1), (4, -0.2))])
    assert out.tokens == [" cat", " sat"]
    assert out.token_logprobs == [-0.5, -2.0]
    # the chosen token first, then the top k (as vLLM: the chosen one is always there, so up to k + 1 entries)
    assert out.top_logprobs == [{" cat": -0.5, " on": -1.5}, {" sat": -2.0, " mat": -0.1, " on": -0.2}]
    assert out.text_offset == [0, 4]
    # a stream's next chunk: the offsets run on
    assert legacy([4], [lp(4, -0.3)]).text_offset == [8]


def test_legacy_first_prompt_token_is_null_and_minus_inf_is_floored():
    out = Legacy(TEXTS)([1, 2], [None, lp(2, -math.inf, (5, -math.inf))])
    assert out.token_logprobs == [None, FLOOR] and out.top_logprobs == [None, {" cat": FLOOR, " mat": FLOOR}]
    assert out.model_dump_json()  # JSON has no infinity: the floor makes it encodable


def test_chat_format_content_top_logprobs_and_bytes():
    out = chat_logprobs(TEXTS, [lp(2, -0.5, (2, -0.5), (4, -1.5)), lp(6, -0.25, (6, -0.25), (3, -3.0))])
    first, end = out.content
    assert (first.token, first.logprob, first.bytes) == (" cat", -0.5, list(b" cat"))
    assert [(t.token, t.logprob) for t in first.top_logprobs] == [(" cat", -0.5), (" on", -1.5)]
    assert end.token == "<|end|>" and end.bytes == list(b"<|end|>") and len(end.top_logprobs) == 2


def job(**kw) -> GenerateInput:
    fields = {"model": "m", "prompt_token_ids": [1, 2], "choices": (SamplingParams(),), "stream": False}
    return GenerateInput(**{**fields, "include_usage": False, **kw})


def test_echo_with_logprobs_puts_the_prompt_first():
    out = ChoiceOutput(job(logprobs=1, echo="The cat"), chat=False, texts=TEXTS)
    first = out.piece(Delta(" sat", 1, None, (3,), (lp(3, -1.0, (3, -1.0)),), (None, lp(2, -0.7, (4, -0.1)))))
    assert first.text == "The cat sat" and first.num_tokens == 1
    assert first.logprobs.tokens == ["The", " cat", " sat"]
    assert first.logprobs.token_logprobs == [None, -0.7, -1.0]
    assert first.logprobs.top_logprobs[0] is None and first.logprobs.text_offset == [0, 3, 7]
    later = out.piece(Delta(" on", 2, "length", (4,), (lp(4, -0.2),)))
    assert later.text == " on" and later.logprobs.text_offset == [11]  # the echo comes once


def test_max_tokens_zero_with_echo_is_the_prompt_alone():
    out = ChoiceOutput(job(logprobs=0, echo="The cat", prompt_only=True), chat=False, texts=TEXTS)
    piece = out.piece(Delta(" sat", 1, "stop", (3,), (lp(3, -1.0),), (None, lp(2, -0.7))))
    assert piece.text == "The cat" and piece.num_tokens == 0 and piece.finish_reason == "length"
    assert piece.logprobs.tokens == ["The", " cat"] and piece.logprobs.token_logprobs == [None, -0.7]


def test_echo_without_logprobs_is_text_only():
    piece = ChoiceOutput(job(echo="The cat"), chat=False, texts=TEXTS).piece(Delta(" sat", 1, "length", (3,)))
    assert piece.text == "The cat sat" and piece.logprobs is None


@pytest.mark.parametrize("chat", [False, True])
def test_logprobs_asked_but_not_sent_is_a_500(chat):
    with pytest.raises(APIError) as caught:
        ChoiceOutput(job(logprobs=2), chat=chat, texts=TEXTS).piece(Delta(" sat", 1, None, (3,)))
    assert caught.value.status == 500 and caught.value.kind == "server_error"


def test_byte_level_tokens_carry_their_own_bytes():
    """A character split across tokens: each token's text is U+FFFD, but their bytes join into its UTF-8."""
    from runner.model import load_frontend
    from suites.runner.conftest import require_model_packages

    require_model_packages()
    tokenizer, _ = load_frontend("smollm2-135m-instruct")
    texts = TokenTexts(tokenizer)
    ids = tokenizer.encode("Hello 日本 🙂")
    assert any(texts.text(i).endswith("\ufffd") for i in ids)  # the test needs a split character
    assert bytes(b for i in ids for b in texts.bytes(i)) == "Hello 日本 🙂".encode()
