"""The engine core in its own process, on real servers: its failures reach the user in one line and leave no
process behind. The core fails at start (a planted fault; a KV cache that does not fit: a real out-of-memory)
-> the server prints the core's error in one line and exits non-zero; the core dies while serving -> every
request in flight gets an error, the server exits non-zero and no process of it is left; SIGTERM drains through
both processes; SIGKILL of the frontend leaves no core running. Waits are bounds against hanging, not speeds.
"""

from __future__ import annotations

import signal
import threading
import time

import openai
import psutil
import pytest

from suites.server.conftest import start_server

IDS = [504, 3575, 282, 4649, 314]
HANG_S = 120  # a bound against hanging; the designed reaction is the launcher's 0.5 s watchdog
CORE_MODULE = "runner.engine.core_process"


def core_of(server) -> psutil.Process:
    """The server's engine-core process (its child running runner.engine.core_process)."""
    deadline = time.monotonic() + HANG_S
    while time.monotonic() < deadline:
        for child in psutil.Process(server.proc.pid).children(recursive=True):
            if CORE_MODULE in " ".join(child.cmdline()):
                return child
        time.sleep(0.1)
    raise AssertionError(f"no engine-core process under the server:\n{server.log()}")


def gone(process: psutil.Process, timeout: float = HANG_S) -> bool:
    try:
        process.wait(timeout)
    except psutil.TimeoutExpired:
        return False
    return True


def error_lines(server) -> list[str]:
    return [line for line in server.log(20000).splitlines() if "touchstone serve: error:" in line]


@pytest.mark.parametrize(
    ("extra", "core_faults", "expected"),
    [
        ((), "fail_at_start", "the engine core failed to start: RuntimeError: planted fault fail_at_start"),
        # 2,000,000 blocks of the model's K/V: ~1.5 TB in fp32 (CPU), ~0.7 TB in bf16 (GPU)
        (("--num-kv-blocks", "2000000"), "", "the engine core failed to start: "),
    ],
    ids=["planted", "out-of-memory"],
)
def test_a_core_that_cannot_start_is_one_line_and_a_nonzero_exit(device, tmp_path, extra, core_faults, expected):
    server = start_server(device if device != "cuda" else "cuda", tmp_path, *extra, core_faults=core_faults)
    core = core_of(server)
    status = server.proc.wait(HANG_S)
    assert status not in (0, None), server.log()
    lines = error_lines(server)
    assert len(lines) == 1 and expected in lines[0], server.log()
    assert "Traceback" not in lines[0]
    if core_faults == "":  # the allocator's own words: a real out-of-memory, not a planted one
        assert "memory" in lines[0].lower(), lines[0]
    assert gone(core)


def test_a_core_dying_while_serving_fails_every_request_and_the_server(device, tmp_path):
    server = start_server(device, tmp_path, core_faults="die_after_step").wait_ready()
    core = core_of(server)
    errors: list = []

    def request(stream: bool) -> None:
        try:
            out = server.client().completions.create(
                model=server.model, prompt=IDS, max_tokens=64, temperature=0, stream=stream
            )
            if stream:
                for _ in out:
                    pass
            errors.append(None)
        except openai.APIError as err:
            errors.append(err)

    threads = [threading.Thread(target=request, args=(stream,)) for stream in (True, False, False)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(HANG_S)
    assert len(errors) == 3 and all(err is not None for err in errors), errors
    assert all("engine" in str(err) for err in errors), errors
    assert server.proc.wait(HANG_S) == 1, server.log()
    assert gone(core)
    assert "the engine core is gone: the engine core exited with status 17" in server.log(20000)


def test_sigterm_drains_through_both_processes(device, tmp_path):
    server = start_server(device, tmp_path, "--shutdown-timeout", "60", "--log-level", "info").wait_ready()
    core = core_of(server)
    done: dict = {}

    def stream() -> None:
        chunks = server.client().completions.create(
            model=server.model,
            prompt=IDS,
            max_tokens=48,
            temperature=0,
            stream=True,
            extra_body={"ignore_eos": True},
            stream_options={"include_usage": True},
        )
        for chunk in chunks:
            done["first"] = True
            if chunk.usage is not None:
                done["tokens"] = chunk.usage.completion_tokens

    thread = threading.Thread(target=stream)
    thread.start()
    deadline = time.monotonic() + HANG_S
    while "first" not in done and time.monotonic() < deadline:
        time.sleep(0.01)
    server.proc.send_signal(signal.SIGTERM)
    thread.join(HANG_S)
    assert done.get("tokens") == 48, (done, server.log())  # the stream in flight finished
    assert server.proc.wait(HANG_S) == 0, server.log()
    assert gone(core)
    assert "the engine core exited with status 0" in server.log(20000)  # it drained and exited, not killed


def test_sigkill_of_the_frontend_leaves_no_core_running(device, tmp_path):
    server = start_server(device, tmp_path).wait_ready()
    core = core_of(server)
    server.proc.kill()
    server.proc.wait(HANG_S)
    assert gone(core), f"the engine core {core.pid} outlived its frontend"
