"""Run the real launcher (runner.server.launcher.serve) over the real app and bridge, with a stand-in
engine-core client (no model, no process), in a process of its own; print what was observed as one JSON line.
Used by test_launcher.py.

    python -m suites.server.launcher_probe signals        # after startup: who owns SIGTERM; then SIGTERM ourselves
    python -m suites.server.launcher_probe engine-death   # a request kills the (stand-in) engine core

A separate process because a broken signal override would let uvicorn re-raise SIGTERM at exit (it restores
the old handler and raises the captured signal): that must kill the probe, not pytest.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import threading

from runner.engine.core_client import EngineCoreError
from runner.engine.messages import AddRequest, CoreLoad, Ready
from runner.server.app import ServerState, build_app
from runner.server.bridge import AsyncEngine
from runner.server.launcher import bind, serve
from runner.server.metrics import Metrics


class FakeClient:
    """The engine-core client surface the bridge uses, without a process: ready at once; the first request
    it is sent kills it (the engine-death path)."""

    def __init__(self) -> None:
        self.got_request = asyncio.Event()

    async def start(self):
        load = CoreLoad(0, 0, 8, 8, 0, 0)
        return Ready(64, 8, 16, 100, "cpu", [], load)

    async def outputs(self):
        await self.got_request.wait()
        raise EngineCoreError("the engine core exited with status 17")
        yield  # an async generator

    def send(self, message) -> None:
        if isinstance(message, AddRequest):
            self.got_request.set()

    async def close(self, drain_s: float = 0.0, timeout: float = 30.0):
        return 0


def main(mode: str) -> int:
    sock = bind("127.0.0.1", 0)
    port = sock.getsockname()[1]
    holder: dict = {}
    metrics = Metrics(lambda: holder["bridge"].snapshot, lambda: len(holder["bridge"].active))
    bridge = holder["bridge"] = AsyncEngine(FakeClient(), None, metrics)
    state = ServerState(bridge, None, None, metrics, model_names=("fake",))
    seen: dict = {}

    def on_started(server) -> None:
        handler = signal.getsignal(signal.SIGTERM)
        seen["capture_disabled"] = server.signal_capture_disabled
        seen["sigterm_is_uvicorn"] = getattr(handler, "__func__", None) is type(server).handle_exit
        seen["sigterm_handler"] = repr(handler)
        if mode == "signals":
            os.kill(os.getpid(), signal.SIGTERM)
        else:

            def post() -> None:
                import httpx

                r = httpx.post(
                    f"http://127.0.0.1:{port}/v1/completions",
                    timeout=30,
                    json={"model": "fake", "prompt": [1, 2], "max_tokens": 2},
                )
                seen["response"] = [r.status_code, r.json()]

            seen["client"] = threading.Thread(target=post)
            seen["client"].start()

    status = asyncio.run(
        serve(build_app(state), sock, state, shutdown_timeout=5, log_level="warning", on_started=on_started)
    )
    if "client" in seen:
        seen.pop("client").join(30)
    print(json.dumps({"status": status, **seen}), flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
