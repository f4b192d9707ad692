"""schemathesis against the server's own /openapi.json: property-based requests for every operation (the coverage
phase's boundary cases, then MAX_EXAMPLES fuzzed ones per operation, positive and negative), every response
checked: no 5xx, a status and content type the schema documents, bodies (and each SSE event's JSON data) that
match the published response schemas, schema-invalid requests refused with a 4xx, a 405 with Allow for other
methods. No hang: each request has REQUEST_TIMEOUT_S (a timeout is a failure), the run a bound of RUN_TIMEOUT_S.

Not checked: positive_data_acceptance (that every schema-valid request is a 2xx), because some are rightly
refused by rules that need the loaded model: a prompt plus max_tokens past the context or the KV cache, token ids
past the vocabulary. The hooks (suites/server/schemathesis_hooks.py) keep generated lengths small. Response time:
`--checks all` includes max_response_time, whose default 10 s limit is a speed that depends on how busy the machine
is (a generation on 2 loaded cores took 10.2 s in a fresh-clone run of `nox -s cpu` beside the test session), so
its limit is REQUEST_TIMEOUT_S, the hang bound itself (the check cannot be excluded by name).

The negative control runs the same command against a server with two planted faults (runner.server.bridge):
usage_as_string (a non-streamed response's usage.completion_tokens is a string) and crash_on_echo (a completion
with echo: true is a 500); the run must fail and name both: ST108 (response violates schema) and ST101 (server
error).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys

from hypothesis import settings

from runner.server.process import server_env
from suites.runner.conftest import skip_or_fail
from suites.server.conftest import start_server

# Fuzzed requests per operation: the hypothesis profile's count, at most 30 (profile dev: 10, ci: 30).
MAX_EXAMPLES = min(30, settings().max_examples)
REQUEST_TIMEOUT_S = 60
RUN_TIMEOUT_S = 900  # a bound against hanging, not a speed requirement (a run takes about a minute on 2 cores)
VOCAB = 49152  # SmolLM2's vocabulary (the GPU tier's dummy weights have its shape)


def run_schemathesis(base_url: str, workdir) -> subprocess.CompletedProcess:
    if importlib.util.find_spec("schemathesis") is None:
        skip_or_fail("the schemathesis run needs schemathesis (pip install -e .[dev])")
    command = [
        sys.executable,
        "-m",
        "schemathesis.cli",
        "run",
        f"{base_url}/openapi.json",
        "--checks",
        "all",
        "--exclude-checks",
        "positive_data_acceptance",
        "--max-response-time",
        str(REQUEST_TIMEOUT_S),
        "--max-examples",
        str(MAX_EXAMPLES),
        "--request-timeout",
        str(REQUEST_TIMEOUT_S),
        "--seed",
        "1",
        "--workers",
        "1",
        "--generation-database",
        "none",
        "--no-color",
    ]
    env = server_env(SCHEMATHESIS_HOOKS="suites.server.schemathesis_hooks", SCHEMATHESIS_VOCAB_SIZE=str(VOCAB))
    return subprocess.run(command, cwd=workdir, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)


def _tail(done: subprocess.CompletedProcess) -> str:
    lines = [line for line in (done.stdout + done.stderr).splitlines() if not line.lstrip().startswith("curl ")]
    return "\n".join(lines[-80:])


def test_schemathesis_finds_nothing(server, tmp_path):
    done = run_schemathesis(server.base_url, tmp_path)
    assert done.returncode == 0 and "No issues found" in done.stdout, _tail(done)
    assert "Server error" not in done.stdout
    assert server.proc.poll() is None  # and the server still serves
    assert server.client().models.list().data[0].id == server.model


def test_schemathesis_catches_planted_faults(device, tmp_path):
    faulty = start_server(device, tmp_path, faults="usage_as_string,crash_on_echo")
    try:
        faulty.wait_ready()
        done = run_schemathesis(faulty.base_url, tmp_path)
    finally:
        faulty.stop()
    assert done.returncode != 0, _tail(done)
    assert "ST108 Response violates schema" in done.stdout, _tail(done)  # usage_as_string
    assert "ST101 Server error" in done.stdout, _tail(done)  # crash_on_echo
