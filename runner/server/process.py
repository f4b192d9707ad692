"""A `touchstone serve` subprocess on a free loopback port: started, polled until /health answers, stopped with
SIGTERM (its drain). The serving benchmark (when no --base-url is given) and the server suites both use it.
httpx is imported only to poll: the suites import this module before they know whether the serve extra is
installed."""

from __future__ import annotations

import contextlib
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time

# The folder that holds the `runner` package: the repository root, or site-packages in an installed wheel.
ROOT = pathlib.Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_env(**extra: str) -> dict[str, str]:
    """The environment of a `touchstone serve` subprocess: this one, with the repository root put in front of
    PYTHONPATH (the caller's entries kept: on an image without the serve extra its packages may come from a
    PYTHONPATH directory) and the Triton interpreter switch removed (the server never runs interpreted)."""
    env = dict(os.environ, **extra)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env.pop("TRITON_INTERPRET", None)
    return env


def start(
    args: list[str], port: int, log_path: pathlib.Path, python_args: tuple[str, ...] = (), **env: str
) -> subprocess.Popen:
    """`touchstone serve --host 127.0.0.1 --port <port> <args>`, output to `log_path` (not yet ready);
    `python_args` go to the interpreter first (e.g. a profiler: "-m", "cProfile", "-o", path)."""
    with open(log_path, "w") as log:
        return subprocess.Popen(
            [
                sys.executable,
                *python_args,
                "-m",
                "runner.server.cli",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--log-level",
                "warning",
                *args,
            ],
            env=server_env(**env),
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def wait_ready(proc: subprocess.Popen, url: str, log_path: pathlib.Path, timeout: float) -> None:
    """Poll `url`/health until it answers 200; RuntimeError with the log's tail if the server exits first or
    `timeout` seconds pass."""
    import httpx

    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(
                f"server exited with {proc.returncode} before it was ready:\n"
                f"{log_path.read_text(errors='replace')[-3000:]}"
            )
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        if time.monotonic() > deadline:
            raise RuntimeError(f"server not ready after {timeout} s:\n{log_path.read_text(errors='replace')[-3000:]}")
        time.sleep(0.2)


def stop(proc: subprocess.Popen, timeout: float) -> int:
    """SIGTERM (the server drains), then SIGKILL after `timeout` seconds; returns the exit status."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


@contextlib.contextmanager
def launched(
    args: list[str], log_path: pathlib.Path, ready_timeout: float = 900, python_args: tuple[str, ...] = (), **env: str
):
    """Yields the base URL of a ready server started with `touchstone serve <args>` (`start`'s `python_args`, and
    `env` over this process's environment); stops it at the end."""
    port = free_port()
    proc = start(args, port, log_path, python_args, **env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(proc, url, log_path, ready_timeout)
        yield url
    finally:
        stop(proc, 120)
