"""Logprobs through the official `openai` client against the shared server (the engine fills them:
runner.engine.logprobs): completions' legacy format, streamed = whole, echo with max_tokens 0 (the prompt's
log-likelihood, as evaluation harnesses ask for it) agreeing with the logprob the same token gets when it is
generated, and chat's format."""

from __future__ import annotations

import pytest

from suites.server.conftest import need_tokenizer

PROMPT = "The capital of France is"


def _completion(server, **kw):
    args = {"model": server.model, "prompt": PROMPT, "max_tokens": 5, "temperature": 0, "logprobs": 2, **kw}
    return server.client().completions.create(**args).choices


def test_completion_logprobs_legacy_format(server):
    need_tokenizer(server)
    choice = _completion(server)[0]
    lp = choice.logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 5
    assert "".join(lp.tokens) == choice.text  # ASCII text: the tokens' own texts spell it
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(5)]
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert logprob <= 0 and top[token] == logprob and 2 <= len(top) <= 3
        assert logprob == max(top.values())  # greedy: the chosen token is the most likely


def test_streamed_logprobs_equal_the_whole(server):
    need_tokenizer(server)
    whole = _completion(server)[0].logprobs
    args = {"model": server.model, "prompt": PROMPT, "max_tokens": 5, "temperature": 0, "logprobs": 2}
    tokens, logprobs, offsets = [], [], []
    for chunk in server.client().completions.create(stream=True, **args):
        lp = chunk.choices[0].logprobs
        tokens += lp.tokens
        logprobs += lp.token_logprobs
        offsets += lp.text_offset
    assert tokens == whole.tokens and offsets == whole.text_offset
    assert logprobs == pytest.approx(whole.token_logprobs, abs=1e-5)


def test_echo_max_tokens_0_scores_the_prompt(server):
    """The prompt + the greedy next token, echoed with max_tokens 0: the first token has no logprob, and the last
    one has the logprob it had when it was generated (so the prompt's logprobs are not shifted by a position)."""
    need_tokenizer(server)
    generated = _completion(server, max_tokens=1)[0]
    scored = _completion(server, prompt=PROMPT + generated.text, max_tokens=0, echo=True, logprobs=1)[0]
    lp = scored.logprobs
    assert scored.text == PROMPT + generated.text and scored.finish_reason == "length"
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(x is not None and x <= 0 for x in lp.token_logprobs[1:])
    assert lp.tokens[-1] == generated.logprobs.tokens[0]
    assert lp.token_logprobs[-1] == pytest.approx(generated.logprobs.token_logprobs[0], abs=1e-4)
    assert "".join(lp.tokens) == scored.text


def test_echo_with_generation_puts_prompt_logprobs_first(server):
    need_tokenizer(server)
    choice = _completion(server, echo=True, max_tokens=2)[0]
    lp = choice.logprobs
    assert choice.text.startswith(PROMPT) and lp.token_logprobs[0] is None
    assert len(lp.tokens) == 5 + 2  # the prompt's 5 tokens, then the 2 generated


def test_n_choices_each_carry_logprobs(server):
    need_tokenizer(server)
    choices = _completion(server, n=2, temperature=1.0, seed=4, max_tokens=3)
    assert [c.index for c in choices] == [0, 1]
    assert all(len(c.logprobs.tokens) == 3 for c in choices)


def test_chat_logprobs_format(server):
    need_tokenizer(server)
    out = server.client().chat.completions.create(
        model=server.model,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=6,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
    )
    content = out.choices[0].logprobs.content
    assert len(content) == 6
    for entry in content:
        assert len(entry.top_logprobs) == 3
        alts = [t.logprob for t in entry.top_logprobs]
        assert alts == sorted(alts, reverse=True) and entry.logprob == pytest.approx(alts[0])
        assert bytes(entry.bytes).decode(errors="replace") == entry.token
    text = bytes(b for entry in content for b in entry.bytes).decode()
    assert out.choices[0].message.content == text.replace("<|im_end|>", "")
    plain = server.client().chat.completions.create(
        model=server.model, messages=[{"role": "user", "content": "Hi"}], max_tokens=2, logprobs=False
    )
    assert plain.choices[0].logprobs is None
