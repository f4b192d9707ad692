"""The server's frontend ceiling: `touchstone serve` with an engine core that has no model
(runner/engine/ideal_core.py: the engine's schedule, the H200's device time per step as a sleep), driven by the
serving benchmark's client, against that core's own rate with no frontend, in the same run.

    python -m bench.serve.frontend_ceiling                       # 256 streams, 1,024 requests, 512 in / 128 out
    python -m bench.serve.frontend_ceiling --profile /tmp/fe.prof   # the frontend under cProfile

Any gap between the served rate and the ideal core's is the frontend's (HTTP, validation, detokenization,
streaming, the client) or the core loop's messaging, not the model's: on the H200 the same workload served
0.82-0.84x of the offline engine (8c89eff), and this bench tells how much of that a faster engine could never win back.
On a small CPU machine the client shares the cores with the server; the frontend's CPU time a request is the
figure that carries over. Prints one line a measure; no report is written.
"""

from __future__ import annotations

import argparse
import asyncio
import pathlib
import sys
import tempfile
import time

IDEAL = "runner.engine.ideal_core:build"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.serve.frontend_ceiling", description=__doc__.split("\n\n")[0])
    p.add_argument("--concurrency", type=int, default=256)
    p.add_argument("--num-prompts", type=int, help="default 4 x concurrency")
    p.add_argument("--input-len", type=int, default=512)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--stream-interval", type=int, default=8)
    p.add_argument("--model", default="smollm2-135m", help="registered model whose tokenizer the frontend loads")
    p.add_argument("--profile", type=pathlib.Path, help="write the frontend's cProfile stats here")
    args = p.parse_args(argv)
    import psutil

    from bench.serve.client import random_prompts, run_point
    from bench.serve.stats import summarize
    from runner.engine.core_build import EngineConfig
    from runner.engine.ideal_core import offline_rate
    from runner.server.process import launched

    max_len = args.input_len + args.output_len + 16
    count = args.num_prompts or 4 * args.concurrency
    server_args = [
        "--model", args.model, "--load-format", "dummy", "--device", "cpu", "--max-model-len", str(max_len),
        "--max-num-seqs", str(args.concurrency), "--stream-interval", str(args.stream_interval),
    ]  # fmt: skip
    profile = ("-m", "cProfile", "-o", str(args.profile)) if args.profile else ()
    log = pathlib.Path(tempfile.mkdtemp(prefix="touchstone-frontend-")) / "serve.log"
    with launched(server_args, log, 300, profile, TOUCHSTONE_CORE_FACTORY=IDEAL) as base:
        url = base + "/v1/completions"
        server = next(c for c in psutil.Process().children() if "runner.server.cli" in " ".join(c.cmdline()))
        core = server.children()[0]
        asyncio.run(run_point(url, args.model, random_prompts(1, args.input_len, 1000), args.output_len, concurrency=1))
        prompts = random_prompts(count, args.input_len, 0)
        cpu0, core0, wall0 = server.cpu_times(), core.cpu_times(), time.perf_counter()
        point = run_point(url, args.model, prompts, args.output_len, concurrency=args.concurrency)
        results, seconds = asyncio.run(point)
        cpu1, core1 = server.cpu_times(), core.cpu_times()
    wall = time.perf_counter() - wall0
    row = summarize(results, seconds)
    config = EngineConfig(model=args.model, max_model_len=max_len, max_num_seqs=args.concurrency)
    ideal = offline_rate(config, args.input_len, args.output_len, count)
    frontend_ms = (cpu1.user + cpu1.system - cpu0.user - cpu0.system) * 1e3 / count
    core_ms = (core1.user + core1.system - core0.user - core0.system) * 1e3 / count
    print(
        f"served {row['output_tok_per_s']:,.0f} out tok/s ({row['completed']}/{row['requests']} ok, TTFT p50 "
        f"{row['ttft_p50_ms']:.0f} ms, ITL p99 {row['itl_p99_ms']:.0f} ms); ideal core alone {ideal:,.0f} tok/s: "
        f"{row['output_tok_per_s'] / ideal:.2f}x; frontend CPU {frontend_ms:.2f} ms a request, core loop "
        f"{core_ms:.2f} ms a request ({wall:.1f} s wall)"
    )
    return 0 if not row["failed"] else 1


if __name__ == "__main__":
    sys.exit(main())
