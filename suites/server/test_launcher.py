"""The launcher without a model: port in use, uvicorn's signal capture really disabled, engine death.

The signal test is the regression guard for a uvicorn upgrade: stock uvicorn installs its own SIGINT/SIGTERM
handlers for the whole of `Server.serve` (through `capture_signals`), which would replace ours and skip the
drain. Our subclass overrides that hook; if an upgrade renames or bypasses it, the override silently stops
running. The probe checks three things after startup: the override ran (`signal_capture_disabled`), SIGTERM's
handler is not uvicorn's `handle_exit`, and a real SIGTERM goes through our shutdown (exit status 0, the
probe alive to print it; with uvicorn's handler it would stop without our drain and re-raise SIGTERM at
exit, killing the probe).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest

from runner.server.process import ROOT, server_env
from suites.server.conftest import require_serve_packages


@pytest.fixture(autouse=True)
def _serve_extra():
    require_serve_packages()


def _probe(mode: str) -> tuple[subprocess.CompletedProcess, dict]:
    done = subprocess.run(
        [sys.executable, "-m", "suites.server.launcher_probe", mode],
        cwd=ROOT,
        env=server_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    return done, json.loads(lines[-1]) if lines else {}


def test_uvicorn_signal_capture_stays_disabled():
    done, seen = _probe("signals")
    assert done.returncode == 0, (done.returncode, done.stdout, done.stderr[-3000:])
    assert seen["capture_disabled"], "NoSignalServer.capture_signals never ran: did uvicorn rename the hook?"
    assert not seen["sigterm_is_uvicorn"], f"uvicorn's handler owns SIGTERM: {seen['sigterm_handler']}"
    assert seen["status"] == 0


def test_engine_death_fails_the_request_and_exits_nonzero():
    done, seen = _probe("engine-death")
    assert done.returncode == 1 and seen["status"] == 1, (done.stdout, done.stderr[-3000:])
    status, body = seen["response"]
    assert status == 500 and body["error"]["code"] == "engine_dead" and "status 17" in body["error"]["message"]


def test_port_in_use_exits_before_anything_heavy_is_imported():
    """A port in use is reported before the model, torch or the engine is imported (so at once, whatever the
    machine's load): the import log (`-X importtime`) of the failed start holds no torch module."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-X", "importtime", "-m", "runner.server.cli", "--host", "127.0.0.1", "--port", str(port)],
            cwd=ROOT,
            env=server_env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert done.returncode != 0
    errors = [line for line in done.stderr.splitlines() if not line.startswith("import time:")]
    assert any(f"127.0.0.1:{port}" in line and "in use" in line for line in errors), done.stderr[-3000:]
    imported = {line.split("|")[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    heavy = sorted(name for name in imported if name.split(".")[0] in ("torch", "triton", "transformers"))
    assert not heavy, f"imported before the bind: {heavy[:10]}"
