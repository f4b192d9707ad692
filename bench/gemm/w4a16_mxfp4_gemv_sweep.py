"""Sweep the MXFP4 fragment GEMV's launch (WARPS, U, DEPTH, TILES[, WTILES]) on a GPU the way a decode step runs it:
time, weight GB/s against a memcpy of the same run, and the ratio to the launcher's own choice.

    python -m bench.gemm.w4a16_mxfp4_gemv_sweep [--m 1 8 16 24 32] [--n 2048 4096 8192 14336 28672]
        [--k 2048 4096 8192 14336] [--shapes 8192x8192,4096x14336] [--teams]

`--shapes` names the N x K pairs (one run, one CSV); without it every N is swept against every K.

Each time is one GEMV of a CUDA graph of CHAIN launches, each on its own copy of the weights (an N x K layer of a
model in prepared fragment layout, kernels.mxfp4_fragment_layout), launched with programmatic dependent launch where
the device has it (kernels._pdl): a launch's ramp-up overlaps the one before, as in a decode step, and the weights
stream from HBM (CHAIN copies outgrow the L2). bench.timing's p50 of the graph, divided by CHAIN. Every config is
checked against the mirror reference (the suites' lossy bound) before it is timed.

This is how `kernels.w4a16_mxfp4_fragment_gemv.gpu_config` is chosen (its comment quotes the run). Lines: N, K, M,
(WARPS, U, DEPTH, TILES[, WTILES]), us a GEMV, weight GB/s, x memcpy, x the launcher's choice, check; `table` marks
the choice. Above M = 8, a `tiled GEMM` line times the op's other kernel on the same words (a control: the GEMV's M
bound).
"""

from __future__ import annotations

import itertools
import sys

import torch

from bench.gemm.w4a16_mxfp4 import random_weights
from bench.launch_sweep import dims, failed, gpu_args, line, memcpy_gbps, parser, time_ms
from kernels import mxfp4_fragment_layout as layout
from kernels import w4a16_mxfp4_fragment_gemv as kernel
from kernels.tolerances import families, lossy_bound, lossy_metrics
from reference.gemm.w4a16_mxfp4 import w4a16_mxfp4_gemm_mirror

CHAIN = 8  # copies of the weights a graph walks: 8 x 9.4 MB (4096 x 4096) already exceeds the H200's 50 MB L2
# Candidates (WARPS, U, DEPTH, TILES): 4, 8 and 16 warps at the table's U and DEPTH with one or two row tiles a
# program, and the other (U, DEPTH) at 8 warps as controls.
CONFIGS = [(w, kernel.U_STEPS, kernel.DEPTH_TURNS, t) for t in (1, 2) for w in (4, 8, 16)]
CONFIGS += [(8, 1, 1, 1), (8, 1, 1, 2), (8, 2, 0, 1), (8, 2, 2, 1)]
# Warp teams, each on its own row tile (x pairs read by every team of a program at the same steps, from L1): 2, 4
# and 8 teams of 1 to 4 warps, and 2 teams of two-tile warps.
TEAMS = [(8, 2, 1, 1, 4), (16, 2, 1, 1, 4), (16, 2, 1, 1, 8), (8, 2, 1, 1, 8), (8, 2, 1, 1, 2), (16, 2, 1, 1, 2)]
TEAMS += [(8, 2, 1, 2, 2), (4, 2, 1, 2, 2)]


def chain_ms(x: torch.Tensor, copies: list[tuple], **launch: object) -> float:
    """ms a launch of the op's kernel on x, timed as one CUDA graph of a launch on each copy's words (`launch`:
    the kernel's `config` and `gemv` arguments)."""

    def chain():
        for *_, words, pairs in copies:
            kernel.launch(x, words, pairs, **launch)

    return time_ms(chain, cuda_graph=True) / len(copies)


def sweep_shape(n: int, k: int, rows: list[int], memcpy: float, teams_only: bool = False) -> None:
    gen = torch.Generator(device="cuda").manual_seed(0)
    copies = []
    for _ in range(CHAIN):
        codes, scales = random_weights(n, k, gen)
        copies.append((codes, scales, *layout.prepare(codes, scales)))
    weight_bytes = copies[0][2].numel() * 4 + copies[0][3].numel() * 4
    bound = lossy_bound(families.W4A16_MXFP4_GEMM, torch.bfloat16)
    for m in rows:
        shape = f"N={n} K={k} M={m}"
        x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda", generator=gen)
        want = w4a16_mxfp4_gemm_mirror(x, copies[0][0], copies[0][1])
        table = kernel.gpu_config(n // layout.ROWS, k // layout.STEP_K, m)
        times = {}
        for config in dict.fromkeys([*CONFIGS, *TEAMS] if not teams_only else [table, *TEAMS]):
            try:
                metrics = lossy_metrics(kernel.launch(x, *copies[0][2:], config=config, gemv=True), want, want)
                ok = metrics.max_rel <= bound.max_rel and metrics.rms_rel <= bound.rms_rel
                times[config] = (chain_ms(x, copies, config=config, gemv=True), ok, metrics)
            except Exception as err:  # a config that does not compile or fit is a line, not the end of the sweep
                failed(f"{shape} {config}", err)
        for config, (ms, ok, metrics) in times.items():
            gbps = weight_bytes / ms / 1e6
            ratios = {"memcpy": gbps / memcpy}
            if table in times:
                ratios["table"] = times[table][0] / ms
            label = " table" if config == table else ""
            line(f"{shape} {config}{label}", ms, ratios, "ok" if ok else f"MISMATCH {metrics}", gbps=gbps)
        if m > kernel.GROUP:  # control: the tiled GEMM on the same words (what the op runs above GEMV_MAX_M)
            tiled = chain_ms(x, copies, gemv=False)
            gbps = weight_bytes / tiled / 1e6
            line(f"{shape} tiled GEMM", tiled, {"memcpy": gbps / memcpy}, "control", gbps=gbps)
        if table in times:
            best = min(times, key=lambda c: times[c][0])
            slower = times[table][0] / times[best][0]
            print(f"BEST {shape}: {best} {times[best][0] * 1e3:.2f} us; the table's {table}: {slower:.3f}x", flush=True)


def main(argv: list[str] | None = None) -> int:
    cli = parser(__doc__)
    cli.add_argument("--m", type=int, nargs="+", default=[1, 8, 16, 24, 32])
    cli.add_argument("--n", type=int, nargs="+", default=[2048, 4096, 8192, 14336, 28672])
    cli.add_argument("--k", type=int, nargs="+", default=[2048, 4096, 8192, 14336])
    cli.add_argument("--shapes", type=dims("NxK", (2,)), help="comma-separated NxK pairs, in place of --n x --k")
    cli.add_argument("--teams", action="store_true", help="time only the warp-team configs and the table's")
    args = gpu_args(cli, argv, "w4a16_mxfp4_gemv_sweep")
    memcpy = memcpy_gbps(1 << 30, "weights of N x K x M")
    for n, k in args.shapes or itertools.product(args.n, args.k):
        sweep_shape(n, k, args.m, memcpy, args.teams)
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
