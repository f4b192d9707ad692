"""Bad-input matrix: every case answers 4xx with an OpenAI-style error body ({"error": {message, type, param,
code}}, naming the field where there is one: its path, as "messages[0].role"), and the server still serves the
next valid request. The cases cover both layers: pydantic's (types, ranges, shapes: runner.server.request_models)
and the rules that need the model (runner.server.protocol: the served names, the context, the vocabulary).

Bodies are sent as raw bytes (httpx), so malformed JSON and non-UTF-8 reach the server as they are. The
model name is filled in per server ("{model}"); the context is the fixture's max_model_len (512)."""

from __future__ import annotations

import json

import httpx
import pytest

from suites.server.conftest import MAX_MODEL_LEN

CMPL, CHAT = "/v1/completions", "/v1/chat/completions"
OK = {"prompt": [1, 2, 3], "max_tokens": 1}


def body(**fields) -> dict:
    return {"model": "{model}", "prompt": [1, 2, 3], "max_tokens": 2, **fields}


def chat(**fields) -> dict:
    return {"model": "{model}", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **fields}


# (case, path, request body: a dict (JSON-encoded), or raw bytes, expected status, expected `param` or None)
CASES = [
    ("malformed json", CMPL, b'{"model": "x", "prompt": ', 400, None),
    ("json not an object", CMPL, b"[1, 2, 3]", 400, None),
    ("json nested too deep", CMPL, b"[" * 100_000, 400, None),  # RecursionError in the parser
    ("json integer of 5000 digits", CMPL, b'{"model": "{model}", "prompt": [' + b"9" * 5000 + b"]}", 400, None),
    ("empty body", CMPL, b"", 400, None),
    ("non-utf8 bytes", CMPL, b'{"model": "\xff\xfe", "prompt": "a"}', 400, None),
    ("nan literal", CMPL, b'{"model": "{model}", "prompt": [1], "temperature": NaN}', 400, "temperature"),
    ("unknown model", CMPL, {**body(), "model": "gpt-17"}, 404, "model"),
    ("missing model", CMPL, {"prompt": [1, 2, 3]}, 400, "model"),
    ("model not a string", CMPL, {**body(), "model": 3}, 400, "model"),
    ("missing prompt", CMPL, {"model": "{model}"}, 400, "prompt"),
    ("prompt wrong type", CMPL, body(prompt=42), 400, "prompt"),
    ("prompt empty list", CMPL, body(prompt=[]), 400, "prompt"),
    ("prompt negative id", CMPL, body(prompt=[1, -1]), 400, "prompt"),
    ("prompt id past vocab", CMPL, body(prompt=[10**9]), 400, "prompt"),
    ("prompt float ids", CMPL, body(prompt=[1.5, 2]), 400, "prompt"),
    ("several prompts", CMPL, body(prompt=[[1, 2], [3, 4]]), 400, "prompt"),
    ("prompt longer than context", CMPL, body(prompt=[7] * (MAX_MODEL_LEN + 10)), 400, "prompt"),
    ("prompt fills the context", CMPL, body(prompt=[7] * MAX_MODEL_LEN), 400, "prompt"),
    ("max_tokens negative", CMPL, body(max_tokens=-1), 400, "max_tokens"),
    ("max_tokens zero", CMPL, body(max_tokens=0), 400, "max_tokens"),
    ("max_tokens oversized", CMPL, body(max_tokens=10**9), 400, "max_tokens"),
    ("max_tokens past context", CMPL, body(prompt=[7] * 500, max_tokens=100), 400, "max_tokens"),
    (
        "max_tokens past context by one",
        CMPL,
        body(prompt=[7] * 500, max_tokens=MAX_MODEL_LEN - 500 + 1),
        400,
        "max_tokens",
    ),
    ("max_tokens past context, one-token prompt", CMPL, body(prompt=[7], max_tokens=MAX_MODEL_LEN), 400, "max_tokens"),
    ("max_tokens string", CMPL, body(max_tokens="16"), 400, "max_tokens"),
    ("max_tokens float", CMPL, body(max_tokens=1.5), 400, "max_tokens"),
    ("max_tokens bool", CMPL, body(max_tokens=True), 400, "max_tokens"),
    ("temperature negative", CMPL, body(temperature=-0.1), 400, "temperature"),
    ("temperature above 2", CMPL, body(temperature=2.5), 400, "temperature"),
    ("temperature string", CMPL, body(temperature="hot"), 400, "temperature"),
    ("top_p zero", CMPL, body(top_p=0), 400, "top_p"),
    ("top_p above 1", CMPL, body(top_p=1.5), 400, "top_p"),
    ("top_p list", CMPL, body(top_p=[0.5]), 400, "top_p"),
    ("top_k below -1", CMPL, body(top_k=-5), 400, "top_k"),
    ("top_k float", CMPL, body(top_k=2.5), 400, "top_k"),
    ("seed string", CMPL, body(seed="abc"), 400, "seed"),
    ("seed 2**64", CMPL, body(seed=2**64), 400, "seed"),  # torch.Generator would raise inside the engine
    ("seed -2**64", CMPL, body(seed=-(2**64)), 400, "seed"),
    ("stop number", CMPL, body(stop=5), 400, "stop"),
    ("stop empty string", CMPL, body(stop=[""]), 400, "stop"),
    ("stream string", CMPL, body(stream="yes"), 400, "stream"),
    ("stream_options without stream", CMPL, body(stream_options={"include_usage": True}), 400, "stream_options"),
    (
        "stream_options.include_usage string",
        CMPL,
        body(stream=True, stream_options={"include_usage": "yes"}),
        400,
        "stream_options.include_usage",
    ),
    (
        "stream_options.continuous_usage_stats number",
        CMPL,
        body(stream=True, stream_options={"include_usage": True, "continuous_usage_stats": 1}),
        400,
        "stream_options.continuous_usage_stats",
    ),
    ("stream_options not an object", CMPL, body(stream=True, stream_options=[]), 400, "stream_options"),
    ("ignore_eos string", CMPL, body(ignore_eos="no"), 400, "ignore_eos"),
    ("n zero", CMPL, body(n=0), 400, "n"),
    ("n above 128", CMPL, body(n=129), 400, "n"),
    ("n string", CMPL, body(n="2"), 400, "n"),
    ("n pushes the last seed past 2**64", CMPL, body(n=2, seed=2**64 - 1), 400, "seed"),
    ("logprobs above 5", CMPL, body(logprobs=6), 400, "logprobs"),
    ("logprobs negative", CMPL, body(logprobs=-1), 400, "logprobs"),
    ("logprobs bool", CMPL, body(logprobs=True), 400, "logprobs"),
    ("echo string", CMPL, body(echo="yes"), 400, "echo"),
    ("max_tokens zero without echo", CMPL, body(max_tokens=0, echo=False), 400, "max_tokens"),
    ("completions top_logprobs", CMPL, body(top_logprobs=3), 400, "top_logprobs"),
    ("best_of 2", CMPL, body(best_of=2), 400, "best_of"),
    ("suffix", CMPL, body(suffix="end"), 400, "suffix"),
    ("presence penalty", CMPL, body(presence_penalty=0.5), 400, "presence_penalty"),
    ("frequency penalty", CMPL, body(frequency_penalty=-1), 400, "frequency_penalty"),
    ("logit_bias", CMPL, body(logit_bias={"5": 10}), 400, "logit_bias"),
    ("not json content-type", CMPL, b'{"model": "{model}", "prompt": [1]}', 400, None),
    ("chat missing messages", CHAT, {"model": "{model}"}, 400, "messages"),
    ("chat messages string", CHAT, chat(messages="hi"), 400, "messages"),
    ("chat messages empty", CHAT, chat(messages=[]), 400, "messages"),
    ("chat unknown role", CHAT, chat(messages=[{"role": "wizard", "content": "x"}]), 400, "messages[0].role"),
    ("chat message not an object", CHAT, chat(messages=["hi"]), 400, "messages[0]"),
    ("chat content missing", CHAT, chat(messages=[{"role": "user"}]), 400, "messages[0].content"),
    ("chat content number", CHAT, chat(messages=[{"role": "user", "content": 5}]), 400, "messages[0].content"),
    (
        "chat content image part",
        CHAT,
        chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]),
        400,
        "messages[0].content",
    ),
    ("chat logprobs int", CHAT, chat(logprobs=1), 400, "logprobs"),
    ("chat top_logprobs above 20", CHAT, chat(logprobs=True, top_logprobs=21), 400, "top_logprobs"),
    ("chat top_logprobs without logprobs", CHAT, chat(top_logprobs=2), 400, "top_logprobs"),
    ("chat n zero", CHAT, chat(n=0), 400, "n"),
    ("chat echo", CHAT, chat(echo=True), 400, "echo"),
    ("chat tools", CHAT, chat(tools=[{"type": "function", "function": {"name": "f"}}]), 400, "tools"),
    ("chat response_format", CHAT, chat(response_format={"type": "json_object"}), 400, "response_format"),
    ("chat max_completion_tokens zero", CHAT, chat(max_completion_tokens=0), 400, "max_completion_tokens"),
    ("chat max_completion_tokens past context", CHAT, chat(max_completion_tokens=10**6), 400, "max_completion_tokens"),
    # chat's older name for the same field: the error names what the client sent
    ("chat max_tokens zero", CHAT, chat(max_tokens=0), 400, "max_tokens"),
    ("chat max_tokens past context", CHAT, chat(max_tokens=10**6), 400, "max_tokens"),
    ("chat max_tokens string", CHAT, chat(max_tokens="16"), 400, "max_tokens"),
    (
        "chat both, max_completion_tokens wins",
        CHAT,
        chat(max_tokens=2, max_completion_tokens=0),
        400,
        "max_completion_tokens",
    ),
    (
        "chat messages longer than context",
        CHAT,
        chat(messages=[{"role": "user", "content": "hi " * 2000}]),
        400,
        "messages",
    ),
    ("chat temperature above 2", CHAT, chat(temperature=3), 400, "temperature"),
    ("chat unknown model", CHAT, {**chat(), "model": "nope"}, 404, "model"),
    ("wrong method", CMPL, None, 405, None),
    ("unknown route", "/v1/nothing", body(), 404, None),
]


@pytest.mark.parametrize(("case_id", "path", "payload", "status", "param"), CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_4xx_and_the_server_survives(server, case_id, path, payload, status, param):
    url = server.base_url + path
    if payload is None:
        response = httpx.get(url, timeout=60)
    else:
        raw = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        raw = raw.replace(b"{model}", server.model.encode())
        kind = "text/plain" if "content-type" in case_id else "application/json"
        response = httpx.post(url, content=raw, headers={"content-type": kind}, timeout=60)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert isinstance(error["message"], str) and error["message"] and isinstance(error["type"], str)
    if param is not None:
        assert error["param"] == param and error["message"].startswith(param), error
    # The next valid request is served.
    ok = httpx.post(server.base_url + CMPL, json={"model": server.model, **OK}, timeout=120)
    assert ok.status_code == 200, ok.text
    assert ok.json()["usage"]["completion_tokens"] == 1
