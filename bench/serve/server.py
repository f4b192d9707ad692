"""A `touchstone serve` subprocess for the benchmark (when no --base-url is given): a free loopback port,
ready when /health answers, stopped with SIGTERM (its drain) at the end."""

from __future__ import annotations

import contextlib
import pathlib
import signal
import socket
import subprocess
import sys
import time

import httpx

from bench.serve.subprocess_env import ROOT, server_env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def launched(args: list[str], log_path: pathlib.Path, ready_timeout: float = 900):
    """Yields the base URL of a server started with `touchstone serve <args>`."""
    port = _free_port()
    env = server_env()
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "bench.cli", "serve", "--host", "127.0.0.1", "--port",
                                 str(port), "--log-level", "warning", *args], cwd=ROOT, env=env, stdout=log,
                                stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + ready_timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with {proc.returncode}: {log_path.read_text()[-3000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"server not ready after {ready_timeout} s: {log_path.read_text()[-3000:]}")
            time.sleep(0.5)
        yield url
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
