"""The official `openai` client against a real `touchstone serve` on loopback: completions and chat, streamed
and not, stop strings, seeds, /v1/models, /health, /metrics, and the abort of a request whose client left."""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest

from suites.server.conftest import need_tokenizer, wait_idle

PROMPT = "The capital of France is"
IDS = [504, 3575, 282, 4649, 314]  # a token-id prompt works with or without a tokenizer


def _complete(server, stream: bool, **kw):
    client = server.client()
    args = {"model": server.model, "max_tokens": 8, "temperature": 0, **kw}
    if not stream:
        out = client.completions.create(**args)
        return out.choices[0].text, out.choices[0].finish_reason, out.usage
    text, finish, usage = [], None, None
    for chunk in client.completions.create(stream=True, stream_options={"include_usage": True}, **args):
        if chunk.choices:
            text.append(chunk.choices[0].text)
            finish = chunk.choices[0].finish_reason or finish
        if chunk.usage is not None:
            usage = chunk.usage
    return "".join(text), finish, usage


def test_completion_streamed_equals_whole(server):
    need_tokenizer(server)
    whole = _complete(server, False, prompt=PROMPT)
    streamed = _complete(server, True, prompt=PROMPT)
    assert whole[0].strip() and whole[0] == streamed[0]
    assert whole[1] == streamed[1] == "length"
    assert whole[2].completion_tokens == streamed[2].completion_tokens == 8
    assert whole[2].prompt_tokens == streamed[2].prompt_tokens > 0


def test_token_id_prompt_and_usage(server):
    _, finish, usage = _complete(server, True, prompt=IDS, extra_body={"ignore_eos": True})
    assert finish == "length" and usage.prompt_tokens == len(IDS) and usage.completion_tokens == 8


def test_stop_string_cuts_the_text(server):
    need_tokenizer(server)
    text, _, _ = _complete(server, False, prompt=PROMPT, max_tokens=16)
    word = text.split()[1]  # a word the greedy completion reaches after its first
    at = text.index(word)
    # ... and a stop string across a token boundary (the first word's last character, the space, the word's
    # first): its first character is decoded a token before the rest, and must not be streamed
    for stop in (word, text[at - 2 : at + 1]):
        for stream in (False, True):
            cut, finish, _ = _complete(server, stream, prompt=PROMPT, max_tokens=16, stop=[stop])
            assert finish == "stop" and cut == text[: text.index(stop)], (stop, stream, cut, text)


def test_seeded_sampling_repeats(server):
    a = _complete(server, False, prompt=IDS, temperature=1.0, seed=7, max_tokens=6)
    b = _complete(server, True, prompt=IDS, temperature=1.0, seed=7, max_tokens=6)
    assert a[0] == b[0] and a[2].completion_tokens == b[2].completion_tokens


def test_chat_streamed_and_whole(server):
    need_tokenizer(server)
    client = server.client()
    messages = [{"role": "user", "content": "Say hello."}]
    whole = client.chat.completions.create(model=server.model, messages=messages, max_tokens=8, temperature=0)
    chunks = list(
        client.chat.completions.create(
            model=server.model,
            messages=messages,
            max_tokens=8,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert whole.choices[0].message.content.strip() and text == whole.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    # The chat template wraps the message in special tokens and a system prompt: far more than the 4 words.
    assert whole.usage.prompt_tokens > 10


def test_models_health_metrics(server):
    models = server.client().models.list()
    assert [m.id for m in models.data] == [server.model]
    assert httpx.get(server.base_url + "/health").json() == {"status": "ok"}
    done = httpx.post(
        server.base_url + "/v1/completions",
        timeout=120,
        json={"model": server.model, "prompt": IDS, "max_tokens": 3, "ignore_eos": True},
    )
    assert done.status_code == 200, done.text  # token ids: works with or without a tokenizer
    m = server.metrics()
    for name in (
        "num_requests_running",
        "num_requests_waiting",
        "kv_blocks_in_use",
        "prefix_cache_hit_rate",
        "time_to_first_token_seconds_count",
        "inter_token_latency_seconds_count",
    ):
        assert f"touchstone_{name}" in m
    assert m["touchstone_time_to_first_token_seconds_count"] > 0  # at least the request above


@pytest.mark.parametrize("stream", [True, False])
def test_client_disconnect_aborts_and_frees_blocks(server, stream):
    before = wait_idle(server)
    body = {"model": server.model, "prompt": IDS, "max_tokens": 400, "ignore_eos": True, "stream": stream}
    if stream:
        with httpx.stream("POST", server.base_url + "/v1/completions", json=body, timeout=60) as response:
            lines = response.iter_lines()
            assert next(line for line in lines if line.startswith("data:"))  # generating
            assert server.metrics()["touchstone_kv_blocks_in_use"] > 0
    else:  # the client gives up while the server computes: it closes the connection once the request runs
        payload = json.dumps(body).encode()
        host, port = server.base_url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port))) as sock:
            sock.sendall(
                b"POST /v1/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (host.encode(), len(payload), payload)
            )
            deadline = time.monotonic() + 60
            while server.metrics()["touchstone_num_requests_running"] < 1:
                assert time.monotonic() < deadline, "the request never ran"
                time.sleep(0.01)
    after = wait_idle(server)
    assert (
        after["touchstone_kv_blocks_free"]
        == before["touchstone_kv_blocks_free"]
        == after["touchstone_kv_blocks_usable"]
    )
    aborts = 'touchstone_requests_finished_total{finish_reason="abort"}'
    assert after[aborts] == before.get(aborts, 0) + 1
    assert after["touchstone_num_requests_running"] == 0 and after["touchstone_server_live_requests"] == 0
