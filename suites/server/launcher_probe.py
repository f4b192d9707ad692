"""Run the real launcher (runner.server.launcher.serve) over the real app and bridge, with a stand-in engine
(no model), in a process of its own; print what was observed as one JSON line. Used by test_launcher.py.

    python -m suites.server.launcher_probe signals        # after startup: who owns SIGTERM; then SIGTERM ourselves
    python -m suites.server.launcher_probe engine-death   # a request makes the engine's step raise

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
import types

from runner.server.app import ServerState, build_app
from runner.server.bridge import AsyncEngine
from runner.server.launcher import bind, serve
from runner.server.metrics import Metrics
from runner.server.protocol import Limits


class FakeEngine:
    """The engine surface the bridge uses; its step raises (the engine-death path)."""

    def __init__(self) -> None:
        self.requests: list = []

    @property
    def has_unfinished(self) -> bool:
        return bool(self.requests)

    def add_request(self, ids, params, request_id=None):
        self.requests.append(request_id)
        return types.SimpleNamespace(num_output_tokens=0, output_token_ids=[], is_finished=False, finish_reason=None)

    def step(self):
        raise RuntimeError("stand-in engine: step failed")

    def abort(self, request_id) -> bool:
        return False

    def load(self):
        return types.SimpleNamespace(
            running=len(self.requests),
            waiting=0,
            blocks_usable=8,
            blocks_free=8,
            prefix_queried_tokens=0,
            prefix_hit_tokens=0,
        )


def main(mode: str) -> int:
    sock = bind("127.0.0.1", 0)
    port = sock.getsockname()[1]
    holder: dict = {}
    metrics = Metrics(lambda: holder["bridge"].snapshot, lambda: len(holder["bridge"].active))
    bridge = holder["bridge"] = AsyncEngine(FakeEngine(), None, metrics)
    state = ServerState(bridge, None, Limits(("fake",), 64, 128, 16, 100), metrics)
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
