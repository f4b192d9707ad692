"""A starting server answers while its model loads: /health 503 {"status": "loading"}, /v1/* and /metrics 503
with code model_loading, then /health 200 and requests served. The planted fault "load_after_health"
(runner.server.bridge) holds the load until /health has answered once, so the loading answers are seen
however fast the load. A model that fails to load: one line on stderr, no traceback, a non-zero exit. A
SIGTERM while the model loads: the server stops at once with status 0 (nothing was running)."""

from __future__ import annotations

import time

import httpx
import pytest

from runner.server import process as serve_process
from suites.server.conftest import READY_TIMEOUT_S, require_serve_packages, start_server


def first(server, method: str, path: str, **kwargs) -> httpx.Response:
    """The first request to a starting server: refused until the process has bound its socket (its first
    moments), then held in the listen backlog until uvicorn runs. The deadline is a bound against hanging."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        try:
            return httpx.request(method, server.base_url + path, timeout=READY_TIMEOUT_S, **kwargs)
        except httpx.ConnectError:
            assert server.proc.poll() is None, server.log()
            assert time.monotonic() < deadline, "the server never bound its socket"
            time.sleep(0.05)


def get(server, path: str) -> httpx.Response:
    return httpx.get(server.base_url + path, timeout=READY_TIMEOUT_S)


def test_health_is_503_loading_then_200(device, tmp_path):
    server = start_server(device, tmp_path, faults="load_after_health")
    try:
        body = {"model": server.model, "prompt": [1, 2, 3], "max_tokens": 1}
        completion = first(server, "POST", "/v1/completions", json=body)
        assert completion.status_code == 503 and completion.json()["error"]["code"] == "model_loading"
        models = get(server, "/v1/models")
        assert models.status_code == 503 and models.json()["error"]["code"] == "model_loading"
        assert get(server, "/metrics").status_code == 503
        health = get(server, "/health")  # the first /health: the load starts after it
        assert health.status_code == 503 and health.json() == {"status": "loading"}
        server.wait_ready()  # polls /health until 200
        assert get(server, "/health").json() == {"status": "ok"}
        done = httpx.post(server.base_url + "/v1/completions", json=body, timeout=120)
        assert done.status_code == 200, done.text
    finally:
        assert server.stop() == 0, server.log()


def test_sigterm_while_loading_exits_0(device, tmp_path):
    server = start_server(device, tmp_path, faults="load_after_health")  # nobody polls /health: it never loads
    try:
        assert first(server, "GET", "/v1/models").json()["error"]["code"] == "model_loading"
    finally:
        assert server.stop() == 0, server.log()


def test_a_model_that_fails_to_load_is_one_line_and_a_nonzero_exit(tmp_path):
    require_serve_packages()
    bad = tmp_path / "weights.gguf"
    bad.write_bytes(b"not a gguf file at all" * 10)
    log = tmp_path / "serve.log"
    port = serve_process.free_port()
    proc = serve_process.start(["--model", str(bad), "--device", "cpu"], port, log)
    with pytest.raises(RuntimeError, match="before it was ready"):  # wait_ready reports the exit
        serve_process.wait_ready(proc, f"http://127.0.0.1:{port}", log, READY_TIMEOUT_S)
    assert proc.wait(60) != 0
    lines = log.read_text().splitlines()
    assert "Traceback" not in log.read_text()
    assert len(lines) == 1 and lines[0].startswith("touchstone serve: error: ") and str(bad) in lines[0], lines
