"""SIGTERM during streaming, on real servers: in-flight streams finish (the patient server's --shutdown-timeout
is far longer than its stream) and the server exits 0; when the timeout elapses first, the stream ends with a
clean error event (the openai client raises APIError "...shutting down...") and the server still exits 0. After
the signal the listening socket is closed: new connections are refused. Two servers (each exits), started
together so their loads overlap. The waits below are bounds against hanging, not speeds; the one duration the
tests rely on is the hasty server's 1 s timeout against a stream of thousands of tokens, which a busier machine
only makes longer."""

from __future__ import annotations

import signal
import socket
import threading
import time

import openai
import pytest

from suites.server.conftest import start_server

IDS = [504, 3575, 282, 4649, 314]


@pytest.fixture(scope="module")
def servers(request, tmp_path_factory):
    backend = request.config.getoption("--device")
    folder = tmp_path_factory.mktemp("serve-shutdown")
    patient = start_server(backend, folder, "--shutdown-timeout", "120")
    hasty = start_server(backend, folder, "--shutdown-timeout", "1", "--max-model-len", "8192")
    try:
        yield patient.wait_ready(), hasty.wait_ready()
    finally:
        patient.stop()
        hasty.stop()


def _stream_in_thread(server, max_tokens: int) -> tuple[threading.Thread, dict, threading.Event]:
    result: dict = {"tokens": 0}
    first = threading.Event()

    def run() -> None:
        try:
            stream = server.client().completions.create(
                model=server.model,
                prompt=IDS,
                max_tokens=max_tokens,
                temperature=0,
                stream=True,
                extra_body={"ignore_eos": True},
                stream_options={"include_usage": True},
            )
            for chunk in stream:
                first.set()
                if chunk.choices and chunk.choices[0].finish_reason:
                    result["finish"] = chunk.choices[0].finish_reason
                if chunk.usage is not None:
                    result["tokens"] = chunk.usage.completion_tokens
        except Exception as err:
            result["error"] = err
        finally:
            first.set()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, result, first


def _refused(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(2)
        return s.connect_ex(("127.0.0.1", port)) != 0


def _wait_refused(port: int, timeout: float = 120) -> bool:
    """Whether connections to `port` are refused before `timeout` s (a bound against hanging, not a speed)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _refused(port):
            return True
        time.sleep(0.1)
    return False


def test_sigterm_drains_the_stream_then_exits_0(device, servers):
    server = servers[0]
    thread, result, first = _stream_in_thread(server, 24)
    assert first.wait(120) and "error" not in result, result
    server.proc.send_signal(signal.SIGTERM)
    assert _wait_refused(server.port), "the listening socket is still accepting after SIGTERM"
    thread.join(120)
    assert result.get("finish") == "length" and result["tokens"] == 24, result
    assert server.proc.wait(60) == 0, server.log()


def test_sigterm_past_the_timeout_aborts_cleanly_then_exits_0(device, servers):
    server = servers[1]
    # Far longer than the 1 s timeout: ~1 min of decoding on the CPU (the 64 MiB cache holds 1440 tokens),
    # several seconds on a GPU.
    thread, result, first = _stream_in_thread(server, 1400 if device == "cpu" else 8000)
    assert first.wait(120) and "error" not in result, result
    server.proc.send_signal(signal.SIGTERM)
    thread.join(120)
    err = result.get("error")
    assert isinstance(err, openai.APIError) and "shutting down" in str(err), result
    assert "finish" not in result
    assert server.proc.wait(60) == 0, server.log()
