"""Starting and stopping the server.

- `bind`: the listening socket is created, bound and put to listen BEFORE the model loads, so a port in use
  fails at once (EADDRINUSE) with the address in the message, not after a model load of many seconds.
  SO_REUSEADDR lets a restart reuse a port whose old connections sit in TIME_WAIT; it does not let two
  servers listen on one port (Linux refuses a bind to a port another socket listens on).
- `NoSignalServer`: uvicorn.Server whose `capture_signals` is a no-op. Stock uvicorn installs its own
  SIGINT/SIGTERM handlers with signal.signal for the duration of `serve`, replacing ours (the race vLLM fixed
  twice), and re-raises the captured signal after exiting. `signal_capture_disabled` records that the override
  ran: if an upgrade renames the hook, it stays False (suites/server/test_launcher.py checks it).
- `serve`: uvicorn starts accepting first; given a `load`, the frontend's part (tokenizer, output processor)
  loads on a thread of its own meanwhile, then the engine-core process starts and loads the model (the app
  answers 503 "loading" until it is Ready) and the loop attaches the loaded state. Our handlers
  (loop.add_signal_handler) start the shutdown: stop accepting (close the listening servers; /health and new
  requests on open connections answer 503), wait for in-flight requests up to `shutdown_timeout` seconds,
  abort the rest with a clean error (503 shutting_down), then stop uvicorn and the engine-core process. A
  signal while the model loads stops at once (the core is stopped with it). A second signal skips the wait. A
  watchdog stops the server if the engine core died. Exit status: 0 after a signal, 1 if the engine died, 3
  (uvicorn's STARTUP_FAILURE) if uvicorn failed to start, 4 if the model failed to load (the state's
  `load_error` holds why).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import threading
from collections.abc import Callable

import uvicorn

from runner.engine.host_gc import freeze_startup_heap

log = logging.getLogger("touchstone.server")
ENGINE_DIED = 1
STARTUP_FAILURE = 3
LOAD_FAILED = 4
WATCHDOG_S = 0.5


def bind(host: str, port: int, backlog: int = 2048) -> socket.socket:
    """A listening TCP socket on host:port; OSError (EADDRINUSE, EACCES, ...) if that cannot be."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(backlog)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


class NoSignalServer(uvicorn.Server):
    signal_capture_disabled = False

    @contextlib.contextmanager
    def capture_signals(self):
        self.signal_capture_disabled = True
        yield


class Shutdown:
    """What a signal sets off; `requested` is set by the first signal, `hurry` by the second."""

    def __init__(self) -> None:
        self.requested = asyncio.Event()
        self.hurry = asyncio.Event()
        self.signals: list[int] = []

    def __call__(self, sig: int) -> None:
        self.signals.append(sig)
        (self.hurry if self.requested.is_set() else self.requested).set()


class Loader:
    """Runs `load` (the model load: seconds) on a daemon thread; `done` resolves on the loop with its result, or
    its exception, kept in `error`."""

    def __init__(self, load: Callable[[], object]) -> None:
        self.load, self.error = load, None
        self.loop = asyncio.get_running_loop()
        self.done: asyncio.Future = self.loop.create_future()
        threading.Thread(target=self._run, name="touchstone-load", daemon=True).start()

    def _run(self) -> None:
        try:
            result = self.load()
        except BaseException as err:
            self.error = err
            self.loop.call_soon_threadsafe(self._settle, None)
        else:
            self.loop.call_soon_threadsafe(self._settle, result)

    def _settle(self, result) -> None:
        if not self.done.done():
            self.done.set_result(result)


def _exit_status(serving: asyncio.Future) -> int:
    """The status of a uvicorn that exited by itself: a startup failure (SystemExit(3)) or an error."""
    try:
        serving.result()
    except SystemExit as stop:
        return stop.code if isinstance(stop.code, int) and stop.code else STARTUP_FAILURE
    except Exception:
        log.exception("uvicorn failed")
    return STARTUP_FAILURE


async def serve(
    app,
    sock: socket.socket,
    state,
    shutdown_timeout: float,
    log_level: str = "info",
    on_started=None,
    load: Callable[[], object] | None = None,
    on_ready=None,
) -> int:
    """Run `app` on `sock` until a signal or the engine's death; `state` is the app's ServerState. Without a
    bridge it gets one from `load()`, run on a thread of its own once uvicorn accepts: it returns a ServerState
    whose bridge is then started (the engine-core process, up to Ready) and attached (a failure of either:
    `state.load_error`, exit status 4). `on_ready()` is called once the state is attached. Returns the exit
    status."""
    from runner.server.protocol import APIError, Limits

    loop = asyncio.get_running_loop()
    shutdown = Shutdown()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, shutdown, sig)
    config = uvicorn.Config(app, log_level=log_level, lifespan="off", timeout_graceful_shutdown=5, timeout_keep_alive=5)
    server = NoSignalServer(config)
    serving = asyncio.ensure_future(server.serve(sockets=[sock]))

    async def engine_died() -> None:
        while state.bridge.alive:
            await asyncio.sleep(WATCHDOG_S)

    while not server.started and not serving.done():
        await asyncio.sleep(0.01)
    if on_started is not None and server.started:
        on_started(server)
    requested = asyncio.ensure_future(shutdown.requested.wait())
    if state.loading and not serving.done():
        error, loaded = None, state
        if state.bridge is None:
            loader = Loader(load)
            await asyncio.wait([serving, requested, loader.done], return_when=asyncio.FIRST_COMPLETED)
            error, loaded = loader.error, loader.done.result() if loader.done.done() else None
        if loaded is not None and error is None and not serving.done() and not requested.done():
            starting = asyncio.ensure_future(loaded.bridge.start())
            await asyncio.wait([serving, requested, starting], return_when=asyncio.FIRST_COMPLETED)
            if starting.done() and starting.exception() is None:
                loaded.limits = Limits.of(loaded.model_names, starting.result())
                state.attach(loaded)
                freeze_startup_heap()
            else:
                error = starting.exception() if starting.done() else None
                starting.cancel()
                await loaded.bridge.stop(timeout=5.0)
        if state.loading and not serving.done():  # a signal, or the load failed: stop without a drain
            state.draining = True
            server.should_exit = True
            await serving
            requested.cancel()
            state.load_error = error
            return 0 if error is None else LOAD_FAILED
    if not state.loading and not serving.done() and on_ready is not None:
        on_ready()
    watchers = [requested] + ([asyncio.ensure_future(engine_died())] if not state.loading else [])
    await asyncio.wait([serving, *watchers], return_when=asyncio.FIRST_COMPLETED)
    for w in watchers:
        w.cancel()
    status = 0
    if serving.done():  # uvicorn exited by itself
        if state.bridge is not None:
            await state.bridge.stop()
        return _exit_status(serving)
    state.draining = True
    for listener in server.servers:  # stop accepting; open connections keep their requests
        listener.close()
    if not state.bridge.alive:
        log.error("the engine died: %r; stopping", state.bridge.error)
        status = ENGINE_DIED
    else:
        live = len(state.bridge.active)
        log.info(
            "shutting down (signal %s): %d requests in flight, waiting up to %.1f s",
            shutdown.signals,
            live,
            shutdown_timeout,
        )
        hurry = asyncio.ensure_future(shutdown.hurry.wait())
        drain = asyncio.ensure_future(state.bridge.drain(shutdown_timeout))
        await asyncio.wait([hurry, drain], return_when=asyncio.FIRST_COMPLETED)
        hurry.cancel()
        left = len(state.bridge.active)
        if left:
            log.warning("aborting %d requests still running after the shutdown timeout", left)
            state.bridge.abort_all(
                APIError(
                    503,
                    f"the server is shutting down: the request was aborted after the "
                    f"{shutdown_timeout:g} s shutdown timeout",
                    kind="service_unavailable",
                    code="shutting_down",
                )
            )
            await state.bridge.drain(5.0)
        drain.cancel()
    server.should_exit = True
    await serving
    await state.bridge.stop()
    if state.bridge.error is not None:  # it died during the drain: the exit still says so
        status = ENGINE_DIED
    return status
