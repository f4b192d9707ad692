"""`touchstone serve --stream-interval 4`: a stream's chunks carry at least 4 tokens each (the last: the rest), and the
streamed text is the non-streamed text. The chunk sizes are read from each chunk's usage so far
(stream_options.continuous_usage_stats), so a server that ignored the interval (one token a chunk) fails."""

from __future__ import annotations

import pytest

from suites.server.conftest import start_server

INTERVAL = 4
IDS = [504, 3575, 282, 4649, 314]


@pytest.fixture(scope="module")
def chunky_server(request, tmp_path_factory):
    backend = request.config.getoption("--device")
    server = start_server(backend, tmp_path_factory.mktemp("interval"), "--stream-interval", str(INTERVAL))
    try:
        yield server.wait_ready()
    finally:
        server.stop()


@pytest.mark.parametrize("max_tokens", [16, 14])
def test_chunks_carry_interval_tokens_and_the_same_text(device, chunky_server, max_tokens):
    client = chunky_server.client()
    args = {
        "model": chunky_server.model,
        "prompt": IDS,
        "max_tokens": max_tokens,
        "temperature": 0,
        "extra_body": {"ignore_eos": True},
    }
    whole = client.completions.create(**args).choices[0].text
    chunks = list(
        client.completions.create(
            stream=True, stream_options={"include_usage": True, "continuous_usage_stats": True}, **args
        )
    )
    counts = [c.usage.completion_tokens for c in chunks if c.choices]
    sizes = [b - a for a, b in zip([0, *counts], counts, strict=False)]
    # 4, 4, 4, 4 (or 4, 4, 4, 2: the finish sends what is left); a stream that fell behind on a busy machine may
    # send more than 4 at once, never fewer before the last
    assert counts[-1] == max_tokens and all(size >= INTERVAL for size in sizes[:-1]) and sizes[-1] >= 1, sizes
    assert len(counts) <= -(-max_tokens // INTERVAL)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole and whole
