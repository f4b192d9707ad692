"""`touchstone bench serve`: serving benchmark, like `vllm bench serve`: a sweep of concurrency (default) or
Poisson request rate; TTFT, TPOT, ITL p50/p99, E2EL, output tok/s, req/s.

    touchstone bench serve                                  # CPU: launches the real model, concurrency 1,4,16
    touchstone bench serve --load-format dummy --device cuda --concurrency 1,16,64,256 \\
        --input-len 512 --output-len 128                    # H200: SmolLM2-135M shape, random bf16 weights
    touchstone bench serve --base-url http://host:8000 --model NAME --request-rate 1,2,4

Workload: random token-id prompts of --input-len tokens (ids in [1000, 20000)), --output-len tokens each with
ignore_eos and greedy sampling; --num-prompts per point (default 4 x concurrency, at least 8; 32 for a rate).
One warm-up request per point size first (not timed). Without --base-url a `touchstone serve` subprocess is
started with the given model options and stopped at the end. Writes reports/<backend>-<device>/serve_<mode>.*
(the environment of THIS machine: with --base-url pointing elsewhere, name the report with --name).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import pathlib
import sys
import tempfile
from collections.abc import Sequence

from runner.cli_checks import positive_int, positive_list
from runner.cli_parser import Parser

# The offline peer is the fastest of this many timed runs: on the H200 a run of 1,024 requests measured
# 31,733 then 36,180 output tok/s in one process and 42,367 / 43,170 / 44,959 / 43,161 in others (first runs
# pay one-time costs), and a slow peer would flatter the served / offline ratio.
OFFLINE_RUNS = 3


def parser() -> Parser:
    p = Parser(prog="touchstone bench serve", description=__doc__.split("\n\n")[0])
    mode = p.add_mutually_exclusive_group()
    mode.add_argument(
        "--concurrency", type=positive_list(int), default=[1, 4, 16], help="comma-separated sweep (default 1,4,16)"
    )
    mode.add_argument("--request-rate", type=positive_list(float), help="comma-separated Poisson rates, requests/s")
    p.add_argument("--num-prompts", type=int, help="requests per point (default 4 x concurrency, >= 8; 32 for rates)")
    p.add_argument("--input-len", type=int, default=64)
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--base-url", help="an already running server (e.g. http://127.0.0.1:8000); else one is launched")
    p.add_argument("--model", default="smollm2-135m-instruct", help="served model name / model to launch")
    p.add_argument("--load-format", default="auto", help="for the launched server: auto | gguf | dummy")
    p.add_argument("--device", help="for the launched server: cpu | cuda")
    p.add_argument("--server-args", default="", help="more options for the launched server (one string)")
    p.add_argument(
        "--no-offline",
        action="store_true",
        help="skip the offline peer (the same engine offline, on the largest point's prompts, after the server)",
    )
    p.add_argument(
        "--offline-runs",
        type=positive_int,
        default=OFFLINE_RUNS,
        help=f"timed offline runs; the peer is the fastest (default {OFFLINE_RUNS})",
    )
    p.add_argument("--name", help="report name (default serve_concurrency / serve_rate)")
    p.add_argument("--out", type=pathlib.Path, default=pathlib.Path("reports"))
    return p


def _server_args(args: argparse.Namespace) -> list[str]:
    out = [
        "--model",
        args.model,
        "--load-format",
        args.load_format,
        "--max-model-len",
        str(args.input_len + args.output_len + 16),
    ]
    if args.device:
        out += ["--device", args.device]
    return out + args.server_args.split()


def offline_tok_per_s(server_args: list[str], prompts: list[list[int]], output_len: int, runs: int = 1) -> float:
    """Output tok/s of the server's engine run offline (runner.LLM, in this process, the server stopped) on
    `prompts`: greedy, ignore_eos, `output_len` tokens each, after one warm-up request; the fastest of `runs`
    timed runs."""
    import gc
    import time

    import torch

    from runner import LLM, SamplingParams
    from runner.server.cli import engine_config
    from runner.server.cli import parser as serve_parser

    options = serve_parser().parse_args(server_args)
    if options.threads:  # the server's core runs torch on that many threads; so does its offline twin
        torch.set_num_threads(options.threads)
    llm = LLM(config=engine_config(options))
    params = SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True)
    llm.generate(prompts[:1], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
    best = 0.0
    for _ in range(runs):
        if llm.device.type == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        if llm.device.type == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - started
        best = max(best, sum(len(out.token_ids) for out in outs) / seconds)
    del llm, outs
    gc.collect()
    return best


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    from bench.environment import collect
    from bench.serve import report
    from bench.serve.client import random_prompts, run_point
    from bench.serve.stats import summarize
    from runner.server.process import launched

    rate_mode = args.request_rate is not None
    points = args.request_rate if rate_mode else args.concurrency
    server_args = _server_args(args)
    log_dir = pathlib.Path(tempfile.mkdtemp(prefix="touchstone-bench-serve-"))
    with contextlib.ExitStack() as stack:
        if args.base_url:
            base, server = args.base_url.rstrip("/"), f"{args.base_url} (external)"
        else:
            base = stack.enter_context(launched(server_args, log_dir / "serve.log"))
            server = "touchstone serve " + " ".join(server_args)
        url = base + "/v1/completions"
        print(f"touchstone bench serve: {server}; {'rates' if rate_mode else 'concurrency'} {points}", flush=True)
        rows = []
        for i, point in enumerate(points):
            count = args.num_prompts or (32 if rate_mode else max(8, 4 * point))
            prompts = random_prompts(count, args.input_len, args.seed + i)
            warm = random_prompts(1, args.input_len, args.seed + 1000 + i)
            asyncio.run(run_point(url, args.model, warm, args.output_len, concurrency=1))
            kwargs = {"rate": point, "seed": args.seed} if rate_mode else {"concurrency": point}
            results, seconds = asyncio.run(run_point(url, args.model, prompts, args.output_len, **kwargs))
            row = {
                "mode": "rate" if rate_mode else "concurrency",
                "value": point,
                "input_len": args.input_len,
                "output_len": args.output_len,
                **summarize(results, seconds),
            }
            rows.append(row)
            print(
                f"  {row['mode']} {point}: {row['completed']}/{row['requests']} ok in {seconds:.1f} s, "
                f"{row['output_tok_per_s']:.1f} out tok/s, TTFT p50 {row['ttft_p50_ms']:.0f} ms "
                f"p99 {row['ttft_p99_ms']:.0f} ms, TPOT p50 {row['tpot_p50_ms']:.1f} ms p99 "
                f"{row['tpot_p99_ms']:.1f} ms, ITL p50 {row['itl_p50_ms']:.1f} ms p99 {row['itl_p99_ms']:.1f} ms"
                + (f"; first error: {row['first_error']}" if row["failed"] else ""),
                flush=True,
            )
    offline = None
    if not args.base_url and not args.no_offline:
        count = args.num_prompts or (32 if rate_mode else max(8, 4 * points[-1]))
        offline = offline_tok_per_s(
            server_args,
            random_prompts(count, args.input_len, args.seed + len(points) - 1),
            args.output_len,
            args.offline_runs,
        )
        print(
            f"  offline engine, the same {count} prompts: {offline:.1f} out tok/s (best of {args.offline_runs} runs)",
            flush=True,
        )
        for row in rows:
            row["offline_output_tok_per_s"] = offline
            row["served_over_offline"] = row["output_tok_per_s"] / offline
    env = collect()
    name = args.name or f"serve_{'rate' if rate_mode else 'concurrency'}"
    best = max(rows, key=lambda r: r["output_tok_per_s"])
    failed = sum(r["failed"] for r in rows)
    headline = (
        f"Peak {best['output_tok_per_s']:,.1f} output tok/s at {best['mode']} {best['value']}; "
        f"{failed} failed requests over the sweep; input {args.input_len} / output {args.output_len} tokens."
    )
    if offline is not None:
        last = rows[-1]
        headline += (
            f" The same engine offline on {last['mode']} {last['value']}'s prompts, same run: {offline:,.1f} "
            f"output tok/s (best of {args.offline_runs} runs); "
            f"served / offline = {last['served_over_offline']:.2f}x."
        )
    command = "touchstone bench serve " + " ".join(sys.argv[1:] if argv is None else argv)
    folder = report.write(args.out, env, name, rows, headline, {"server": server, "command": command})
    print(headline)
    print(f"wrote {folder}/{name}.csv, .md, .png")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
