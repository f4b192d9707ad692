"""Sweep the W4A16 MXFP4 GEMM's launch configs on a GPU (default N = K = 8192): time, speedup over the bf16 matmul
of the same run, and weight GB/s against a memcpy of the same run.

    python -m bench.gemm.w4a16_mxfp4_launch_sweep [--m 1 4 16 128 1024] [--shapes 8192x8192] [--set full|model]
        [--prepared]

`--prepared` times the kernels on the codes in the layout the runner prepares at load
(kernels.w4a16_mxfp4_layout; the op `w4a16_mxfp4_gemm_prepared`), which the table serves too.

`--fragment` times the tiled GEMM on the weights in mma fragment order (kernels.mxfp4_fragment_layout, the
layout the runner stores where the packed PTX runs; kernels.w4a16_mxfp4_fragment_gemm), over its own candidates
(`fragment_configs`: BLOCK_N 128 / 256, 8 or 16 row tiles a program, whole steps a K tile), which
is how `kernels.w4a16_mxfp4_fragment_gemm.GPU_CONFIGS` is chosen.

`--set model` is the shorter list for a model's projection shapes (e.g. Llama-3.1-8B's, N x K:
6144x4096,4096x4096,28672x4096,4096x14336), where the grid, not the decode, decides: GEMV and dot candidates
across split-K 1..16 and narrow tiles, so a shape with few N tiles still fills the SMs.

This is how `_GPU_CONFIGS` in kernels/w4a16_mxfp4_gemm.py is chosen (its comment says which rows are measured
and which are guesses). Every config is checked against the mirror reference (lossy bound of the suites)
before it is timed. Each time is the p50 of bench.timing over a CUDA-graph replay of one launch (the kernel(s)
alone: no Python dispatch), with bench.timing's 256 MB L2 flush before every repetition, so the 34 MiB of weights
stream from HBM; "dispatch" is the same op called eagerly through torch.ops.
Lines: M, config (kernel BLOCK_N BLOCK_M GROUPS SPLIT_K warps stages), us, x bf16 matmul, weight GB/s,
x memcpy, check.
"""

from __future__ import annotations

import itertools
import sys

import torch

from bench.gemm.w4a16_mxfp4 import random_weights
from bench.launch_sweep import best, checked_ms, dims, gpu_args, line, memcpy_gbps, note, parser, time_ms
from kernels import w4a16_mxfp4_gemm as kernel
from kernels.tolerances import families, lossy_bound
from kernels.w4a16_mxfp4_layout import prepare_codes
from reference.gemm.w4a16_mxfp4 import w4a16_mxfp4_gemm_mirror
from reference.quant.mxfp4 import dequantize_mxfp4

# ~2 s per config (compile + timing): ~50 s per M for the dot list, ~2.5 min for the GEMV one.
# GEMV: stages 2 is the register prefetch of the next K tile. Candidates keep 8..32 code words per thread and
# tile (fewer waste the x conversion, more pass ~170 registers: 3 programs per SM or fewer); the row first is
# the best of the previous sweep (no prefetch, old decode: 24.2 us), as a control.
GEMV = [("gemv", 64, 1, 16, 4, 4, 1)] + [
    ("gemv", bn, 1, g, s, w, 2)
    for bn, g, w, s in itertools.product((16, 32, 64), (8, 16, 32), (2, 4, 8), (1, 2, 4, 8, 16))
    if 8 <= bn * g * 4 // (32 * w) <= 32 and 2 <= 256 // g // s and 256 <= 8192 // bn * s <= 4096
]

# M = 2..4: the control, the table's M = 1 row and the runners-up behind it (see kernels/w4a16_mxfp4_gemm.py).
GEMV_SHORT = [
    ("gemv", 64, 1, 16, 4, 4, 1),
    ("gemv", 16, 1, 32, 1, 4, 2),
    ("gemv", 32, 1, 16, 2, 4, 2),
    ("gemv", 64, 1, 8, 4, 4, 2),
    ("gemv", 16, 1, 16, 2, 2, 2),
    ("gemv", 32, 1, 8, 4, 2, 2),
]


# `--set model`, M = 1: the table's GEMV row and its neighbours in BLOCK_N (8 doubles the N tiles of a
# 4096-row projection) and GROUPS, each at split-K 1, 2 and 4.
GEMV_MODEL = [
    ("gemv", bn, 1, g, s, w, 2)
    for (bn, g, w), s in itertools.product(((8, 32, 2), (8, 32, 4), (16, 32, 4), (16, 16, 2), (32, 16, 4)), (1, 2, 4))
]


def dot_configs(m: int, splits: tuple[int, ...] | None = None) -> list[tuple]:
    block_ms = [b for b in (16, 32, 64, 128) if b <= max(16, m)][-2:]
    splits = splits or ((2, 4, 8) if m <= 64 else (1, 2))
    return [("dot", bn, bm, 4, s, w, 3) for bn, bm, s, w in itertools.product((64, 128), block_ms, splits, (4, 8))]


def fragment_configs(m: int) -> list[tuple]:
    """Above 32 rows also split-K 8 and 4 stages: there a program's x tile is 2 to 4 times its weight bytes."""
    block_m = next(b for b in (16, 32, 64, 128) if b >= min(m, 128))
    splits, stages = ((1, 2, 4), (3,)) if m <= 32 else ((1, 2, 4, 8), (3, 4))
    return [
        ("dot", bn, block_m, g, s, w, st)
        for bn, g, s, w, st in itertools.product((128, 256), (2, 4), splits, (4, 8), stages)
        if not (bn == 256 and w == 4)
    ]


def candidates(m: int, model: bool = False) -> list[tuple]:
    """GEMV candidates up to M = 4 (one program per row of x; the full list at M = 1 only, so that --m 1 4 16
    fits one 10-minute run), tensor-core ones from M = 1 (padded to 16). `model`: GEMV_MODEL at M = 1 alone,
    dot candidates (M > 1) at split-K up to 16."""
    if model:
        return GEMV_MODEL if m == 1 else dot_configs(m, (1, 2, 4, 8, 16) if m <= 64 else None)
    gemv = GEMV if m == 1 else [c for c in GEMV if c in GEMV_SHORT] if m <= 4 else []
    return gemv + dot_configs(m)


def sweep_m(
    x, codes, scales, w, memcpy: float, only: str | None, model: bool, prepared: bool = False, fragment: bool = False
) -> None:
    m, n = x.shape[0], codes.shape[0]
    shape = f"N={n} K={x.shape[1]} M={m}"
    weight_bytes = codes.numel() + scales.numel()
    bound = lossy_bound(families.W4A16_MXFP4_GEMM, torch.bfloat16)
    want = w4a16_mxfp4_gemm_mirror(x, codes, scales)
    layout_codes = prepare_codes(codes) if prepared else codes
    if fragment:
        from kernels import mxfp4_fragment_layout, w4a16_mxfp4_fragment_gemm

        words, pairs = mxfp4_fragment_layout.prepare(codes, scales)

        def run(config):
            return w4a16_mxfp4_fragment_gemm.launch(x, words, pairs, config=config)
    else:

        def run(config):
            return kernel.launch(x, layout_codes, scales, config=config, prepared=prepared)

    matmul = time_ms(lambda: torch.matmul(x, w.T), cuda_graph=True)
    dispatch = time_ms(lambda: kernel.w4a16_mxfp4_gemm(x, codes, scales))
    note(f"{shape} bf16 matmul", f"{shape}: bf16 matmul {matmul * 1e3:.1f} us", time_us=matmul * 1e3)
    note(
        f"{shape} op through torch.ops",
        f"{shape}: op through torch.ops (default config, eager) {dispatch * 1e3:.1f} us",
        time_us=dispatch * 1e3,
    )
    table = w4a16_mxfp4_fragment_gemm.launch_config(m, n) if fragment else kernel.launch_config(m, n, x.device)
    results = []

    def ratios(ms: float) -> dict[str, float]:
        return {"bf16": matmul / ms, "memcpy": weight_bytes / ms / 1e6 / memcpy}

    configs = fragment_configs(m) if fragment else candidates(m, model)
    # the table's own row first where it is none of the candidates (a SPLIT_K of 0, resolved at launch)
    for config in ([] if tuple(table) in configs else [tuple(table)]) + configs:
        if only and config[0] != only:
            continue
        checked = checked_ms(lambda config=config: run(config), want, bound, f"{shape} {config}")
        if checked is None:
            continue
        ms, verdict = checked
        gbps = weight_bytes / ms / 1e6
        results.append((ms, config))
        label = " table" if config == tuple(table) else ""
        line(f"{shape} {config}{label}", ms, ratios(ms), verdict, gbps=gbps)
    best(shape, results, ratios)


def main(argv: list[str] | None = None) -> int:
    cli = parser(__doc__)
    cli.add_argument("--m", type=int, nargs="+", default=[1, 4, 16, 128, 1024])
    cli.add_argument(
        "--shapes", type=dims("NxK", (2,)), default="8192x8192", help="comma-separated NxK (weight rows x columns)"
    )
    cli.add_argument("--set", choices=("full", "model"), default="full", help="candidate list (see above)")
    cli.add_argument("--only", choices=("gemv", "dot"), help="restrict to one kernel")
    cli.add_argument("--prepared", action="store_true", help="the codes in the prepared layout")
    cli.add_argument("--fragment", action="store_true", help="the tiled GEMM on the fragment layout")
    args = gpu_args(cli, argv, "w4a16_mxfp4_launch_sweep")
    memcpy = memcpy_gbps(1 << 30, "shapes N x K " + ",".join(f"{n}x{k}" for n, k in args.shapes))
    for n, k in args.shapes:
        gen = torch.Generator(device="cuda").manual_seed(0)
        codes, scales = random_weights(n, k, gen)
        w = dequantize_mxfp4(codes, scales, dtype=torch.bfloat16)
        print(f"N = {n}, K = {k}: weights {(codes.numel() + scales.numel()) / 2**20:.1f} MiB", flush=True)
        for m in args.m:
            x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda", generator=gen)
            sweep_m(x, codes, scales, w, memcpy, args.only, args.set == "model", args.prepared, args.fragment)
        del codes, scales, w
    return 0


if __name__ == "__main__":
    sys.exit(main())
