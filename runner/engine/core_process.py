"""The engine-core process: build the core, say `Ready` (or `Failed`, in one line), then step while any request
is unfinished, applying the frontend's messages between steps and sending `StepOutputs` after each step.

    python -m runner.engine.core_process <input address> <output address> <parent pid> <config, msgpack hex>

The frontend binds both ZeroMQ sockets (PUSH to the core's PULL input, the core's PUSH to its PULL output) and
starts this process (runner.engine.core_client). The core never outlives its frontend: a watchdog thread
exits the process within `WATCH_S` of the parent's death, whatever the main thread is doing (a model load, a
step). SIGTERM (or a `Shutdown` message) stops admitting and drains the requests in flight for the given
seconds, then exits 0.

TOUCHSTONE_CORE_FACTORY="package.module:function" builds the core with that function of the EngineConfig instead
of `build_core` (bench/serve/frontend_ceiling.py serves through runner.engine.ideal_core, a core without a model,
that way).

FAULTS (negative controls, from TOUCHSTONE_CORE_FAULTS, comma separated; never in production):
- "fail_at_start": the build raises (tests the one-line start failure);
- "die_after_step": the process exits with status 17 after its first step with tokens (a core that dies while
  serving).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import traceback

import msgspec
import zmq

from runner.engine import messages as m
from runner.engine.host_gc import freeze_startup_heap

WATCH_S = 0.5  # how often the watchdog looks for the parent
FAULT_NAMES = ("fail_at_start", "die_after_step")
ENCODER = msgspec.msgpack.Encoder()
DECODER = msgspec.msgpack.Decoder(m.ToCore)


def one_line(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def faults_from_env(env=os.environ) -> frozenset[str]:
    names = frozenset(n for n in env.get("TOUCHSTONE_CORE_FAULTS", "").split(",") if n)
    if unknown := names - set(FAULT_NAMES):
        raise ValueError(f"TOUCHSTONE_CORE_FAULTS: unknown {sorted(unknown)}; known {FAULT_NAMES}")
    return names


def core_factory(env=os.environ):
    """EngineConfig -> core: `build_core`'s core, or TOUCHSTONE_CORE_FACTORY's function."""
    spec = env.get("TOUCHSTONE_CORE_FACTORY")
    if not spec:
        from runner.engine.core_build import build_core

        return lambda config: build_core(config, tokenizer=False)[0]
    import importlib

    module, sep, name = spec.partition(":")
    if not sep or not module or not name:
        raise ValueError(f"TOUCHSTONE_CORE_FACTORY: must be package.module:function, got {spec!r}")
    return getattr(importlib.import_module(module), name)


def watch_parent(parent_pid: int) -> None:
    """Exit this process once the parent is gone (it is re-parented: getppid changes)."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(WATCH_S)
        os._exit(3)

    threading.Thread(target=watch, name="touchstone-core-watchdog", daemon=True).start()


class CoreLoop:
    def __init__(self, core, inbox: zmq.Socket, outbox: zmq.Socket, faults: frozenset[str]) -> None:
        self.core, self.inbox, self.outbox, self.faults = core, inbox, outbox, faults
        self.drain_until: float | None = None  # set by a shutdown: stop admitting, finish by then
        self.accepted: list[str] = []
        self.rejected: list[tuple[str, str]] = []
        self.changed = False  # an abort freed blocks: the frontend's view of the load must follow

    def request_shutdown(self, drain_s: float) -> None:
        self.drain_until = time.monotonic() + max(0.0, drain_s)

    def apply(self, message) -> None:
        core = self.core
        if isinstance(message, m.AddRequest):
            if self.drain_until is not None:
                self.rejected.append((message.request_id, "the engine is shutting down"))
                return
            try:
                core.add_request(message)
                self.accepted.append(message.request_id)
            except (TypeError, ValueError) as err:
                self.rejected.append((message.request_id, str(err)))
        elif isinstance(message, m.Abort):
            core.abort(message.request_ids)
            self.changed = True
        elif isinstance(message, m.Shutdown):
            self.request_shutdown(message.drain_s)

    def receive(self, block: bool) -> None:
        """Apply every queued message; when `block`, wait (in slices, so a shutdown deadline is seen) for one."""
        if block and not self.inbox.poll(100):
            return
        while True:
            try:
                frame = self.inbox.recv(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            self.apply(DECODER.decode(frame.buffer))

    def send(self, outputs: m.StepOutputs) -> None:
        outputs.accepted, outputs.rejected = self.accepted, self.rejected
        self.outbox.send(ENCODER.encode(outputs), copy=False)
        self.accepted, self.rejected, self.changed = [], [], False

    def run(self) -> int:
        core = self.core
        while True:
            self.receive(block=not core.has_unfinished and not (self.accepted or self.rejected or self.changed))
            if self.drain_until is not None and (not core.has_unfinished or time.monotonic() >= self.drain_until):
                live = core.live_request_ids
                core.abort(live)
                deltas = [m.RequestDelta(request_id, [], finish_reason="abort") for request_id in live]
                self.send(m.StepOutputs(deltas, core.load()))
                return 0
            if core.has_unfinished:
                outputs = core.step()
                self.send(outputs)
                if "die_after_step" in self.faults and outputs.deltas:
                    os._exit(17)
            elif self.accepted or self.rejected or self.changed:
                self.send(m.StepOutputs([], core.load()))


def main(argv: list[str]) -> int:
    in_address, out_address, parent, config_hex = argv
    watch_parent(int(parent))
    context = zmq.Context()
    inbox, outbox = context.socket(zmq.PULL), context.socket(zmq.PUSH)
    inbox.connect(in_address)
    outbox.connect(out_address)
    outbox.setsockopt(zmq.LINGER, 5000)  # the last message (Failed, the final aborts) must leave before exit
    loop: CoreLoop | None = None

    def on_sigterm(signum, frame) -> None:  # drain: finish what runs, admit nothing (the frontend sets the time)
        if loop is not None and loop.drain_until is None:
            loop.request_shutdown(30.0)

    signal.signal(signal.SIGTERM, on_sigterm)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C goes to the frontend, which drains us
    try:
        from runner.engine.core_build import EngineConfig

        faults = faults_from_env()
        config = msgspec.msgpack.decode(bytes.fromhex(config_hex), type=EngineConfig).resolved()
        if "fail_at_start" in faults:
            raise RuntimeError("planted fault fail_at_start: the engine core could not be built")
        core = core_factory(os.environ)(config)
    except BaseException as err:
        outbox.send(ENCODER.encode(m.Failed(one_line(err))))
        traceback.print_exc(file=sys.stderr)
        return 1
    loop = CoreLoop(core, inbox, outbox, faults)
    freeze_startup_heap()
    outbox.send(ENCODER.encode(core.ready(config.device)))
    try:
        return loop.run()
    except BaseException as err:
        outbox.send(ENCODER.encode(m.Failed(one_line(err))))
        traceback.print_exc(file=sys.stderr)
        return 1
    finally:
        outbox.close()
        inbox.close(linger=0)
        context.term()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
