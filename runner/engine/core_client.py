"""Clients of an engine-core process (runner.engine.core_process): start it, wait for `Ready`, send it requests,
read its `StepOutputs`, notice its death.

`ProcessClient` is synchronous (the offline `LLM(engine_process=True)`): `step()` returns the next outputs
the core sent. `AsyncProcessClient` is the server's: `outputs()` is an async iterator of them. Both bind the
two ZeroMQ sockets on IPC paths in a private temporary folder and start the core with the config encoded as
MessagePack. A core that exits, is killed, or reports `Failed` raises `EngineCoreError` with its one-line
reason in whoever is waiting on it: never a hang.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import TYPE_CHECKING

import msgspec
import zmq
import zmq.asyncio

from runner.engine import messages as m
from runner.engine.output_merge import merge_step_outputs

if TYPE_CHECKING:
    from runner.engine.core_build import EngineConfig

ENCODER = msgspec.msgpack.Encoder()
DECODER = msgspec.msgpack.Decoder(m.FromCore)
POLL_MS = 100  # how long a wait listens before it looks at the process again
# Most steps' outputs merged into one: a bound on the delay of the first step's tokens (at ~3 ms a step).
MERGE_MAX = 16
ROOT = pathlib.Path(__file__).resolve().parents[2]  # the folder that holds the `runner` package


class EngineCoreError(RuntimeError):
    """The engine core failed to start or died; the message is its one-line reason."""


class CoreProcess:
    """The process and its sockets (the context decides sync or asyncio sockets)."""

    def __init__(self, config: EngineConfig, context: zmq.Context, env: dict | None = None) -> None:
        self.folder = pathlib.Path(tempfile.mkdtemp(prefix="touchstone-core-"))
        self.context = context
        self.to_core = context.socket(zmq.PUSH)
        self.from_core = context.socket(zmq.PULL)
        in_address, out_address = f"ipc://{self.folder / 'in'}", f"ipc://{self.folder / 'out'}"
        self.to_core.bind(in_address)
        self.from_core.bind(out_address)
        for sock in (self.to_core, self.from_core):
            sock.setsockopt(zmq.LINGER, 0)
        environment = dict(os.environ if env is None else env)
        environment["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), environment.get("PYTHONPATH", "")) if p)
        argv = [in_address, out_address, str(os.getpid()), msgspec.msgpack.encode(config).hex()]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "runner.engine.core_process", *argv], env=environment, start_new_session=False
        )
        self.ready: m.Ready | None = None
        atexit.register(self.finish, 2.0)  # the frontend exits without a shutdown: the core goes too

    def dead_reason(self) -> str | None:
        code = self.proc.poll()
        if code is None:
            return None
        how = f"killed by signal {-code}" if code < 0 else f"exited with status {code}"
        return f"the engine core {how}"

    def handle(self, message) -> m.StepOutputs | m.Ready:
        if isinstance(message, m.Failed):
            raise EngineCoreError(message.message)
        return message

    def send(self, message) -> None:
        self.to_core.send(ENCODER.encode(message), flags=zmq.NOBLOCK, copy=False)

    def finish(self, timeout: float) -> int | None:
        """Wait up to `timeout` for the process to exit (after a Shutdown), then SIGTERM it, then kill it; close
        the sockets and remove the folder. Returns its exit status. Safe from any thread (no socket I/O)."""
        for sig, wait in ((None, timeout), (signal.SIGTERM, 2.0), (signal.SIGKILL, None)):
            if self.proc.poll() is not None:
                break
            if sig is not None:
                self.proc.send_signal(sig)
            try:
                self.proc.wait(wait)
            except subprocess.TimeoutExpired:
                continue
        for sock in (self.to_core, self.from_core):
            sock.close(linger=0)
        shutil.rmtree(self.folder, ignore_errors=True)
        return self.proc.returncode

    def close(self, drain_s: float = 0.0, timeout: float = 30.0) -> int | None:
        """Ask the core to drain for `drain_s` and exit (from the sockets' own thread), then `finish`."""
        if self.proc.poll() is None:
            with contextlib.suppress(zmq.ZMQError, RuntimeError):
                self.send(m.Shutdown(drain_s))
        return self.finish(drain_s + timeout)


class ProcessClient:
    """Synchronous: the offline LLM's view of a core process."""

    def __init__(self, config: EngineConfig, env: dict | None = None) -> None:
        self.config = config
        self.core = CoreProcess(config, zmq.Context.instance(), env)
        self.ready = self.core.handle(self._receive(deadline=None))
        if not isinstance(self.ready, m.Ready):
            raise EngineCoreError(f"the engine core sent {type(self.ready).__name__} before Ready")

    def _receive(self, deadline: float | None):
        while not self.core.from_core.poll(POLL_MS):
            if (reason := self.core.dead_reason()) is not None:
                raise EngineCoreError(reason)
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError("no message from the engine core")
        return DECODER.decode(self.core.from_core.recv())

    def frontend_model(self):
        """(tokenizer or None, model config) for this process's output processing: read here, not loaded."""
        from runner.model import load_frontend

        return load_frontend(self.config.model, self.config.load_format)

    def add_request(self, request: m.AddRequest) -> None:
        self.core.send(request)

    def abort(self, request_ids: list[str]) -> None:
        if request_ids:
            self.core.send(m.Abort(list(request_ids)))

    def step(self) -> m.StepOutputs:
        outputs = self.core.handle(self._receive(deadline=None))
        if outputs.rejected:
            raise ValueError(outputs.rejected[0][1])
        return outputs

    def close(self) -> int | None:
        return self.core.close()


class AsyncProcessClient:
    """The server's view of a core process: `start()` waits for Ready without blocking the event loop."""

    def __init__(self, config: EngineConfig, env: dict | None = None) -> None:
        self.config, self.env = config, env
        self.core: CoreProcess | None = None
        self.ready: m.Ready | None = None

    async def start(self) -> m.Ready:
        self.core = CoreProcess(self.config, zmq.asyncio.Context.instance(), self.env)
        self.ready = self.core.handle(await self._receive())
        if not isinstance(self.ready, m.Ready):
            raise EngineCoreError(f"the engine core sent {type(self.ready).__name__} before Ready")
        return self.ready

    async def _receive(self):
        sock = self.core.from_core
        while not await sock.poll(POLL_MS):
            if (reason := self.core.dead_reason()) is not None:
                raise EngineCoreError(reason)
        return DECODER.decode(await sock.recv())

    async def outputs(self):
        """Every StepOutputs the core sends, until it fails or dies (EngineCoreError). Those already waiting when
        one arrives come merged with it (runner.engine.output_merge: a frontend behind the core catches up a
        request at a time, not a step at a time), at most MERGE_MAX steps."""
        sock = self.core.from_core
        while True:
            batch = [self.core.handle(await self._receive())]
            try:
                while len(batch) < MERGE_MAX and await sock.poll(0):
                    batch.append(self.core.handle(DECODER.decode(await sock.recv())))
            except EngineCoreError:
                yield merge_step_outputs(batch)  # what arrived before the failure, then the failure
                raise
            yield merge_step_outputs(batch)

    def send(self, message) -> None:
        self.core.send(message)

    async def close(self, drain_s: float = 0.0, timeout: float = 30.0) -> int | None:
        if self.core is None:
            return None
        if self.core.proc.poll() is None:
            with contextlib.suppress(zmq.ZMQError):
                self.core.send(m.Shutdown(drain_s))
        return await asyncio.to_thread(self.core.finish, drain_s + timeout)
