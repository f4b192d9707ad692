"""Sweep the W4A16 NVFP4 GEMM's launch configs on a GPU (default N = K = 8192): time, speedup over the bf16 matmul
and over dequantize-then-matmul of the same run, and weight GB/s against a memcpy of the same run.

    python -m bench.gemm.w4a16_nvfp4_launch_sweep [--m 1 16 64 256] [--shapes 8192x8192] [--table-only]

This is how `_GPU_CONFIGS` in kernels/w4a16_nvfp4_gemm.py is chosen, and where the runner's nvfp4 scheme stops
calling the kernel (`runner.model.quant.nvfp4.KERNEL_ROWS`: the M from which dequantize-then-matmul wins;
`--table-only` times only the table's config, at the M and shapes given, for that crossover). Every config is checked
against the mirror reference (the lossy row "w4a16_nvfp4_gemm") before it is timed. Each time is the p50 of
bench.timing over a CUDA-graph replay of one launch (bench.timing's 256 MB L2 flush before every repetition, so the
weights stream from HBM). Lines: M, config (BLOCK_N BLOCK_M GROUPS SPLIT_K warps stages), us, x bf16 matmul,
x dequantize-matmul, weight GB/s, x memcpy, check. The configs run the decode the op takes (the packed PTX on
sm_90+); the table's config also runs the fp32 decode ("fp32-decode"), the packed decode's control.
"""

from __future__ import annotations

import itertools
import sys
from types import SimpleNamespace

import torch

from bench.gemm.w4a16_nvfp4 import inputs
from bench.launch_sweep import best, checked_ms, dims, gpu_args, line, memcpy_gbps, note, parser, time_ms
from kernels import w4a16_nvfp4_gemm as kernel
from kernels.nvfp4 import dequantize_nvfp4
from kernels.tolerances import families, lossy_bound
from reference.gemm.w4a16_nvfp4 import w4a16_nvfp4_gemm_mirror
from reference.quant.nvfp4_global_scale import DecodeScale


def candidates(m: int) -> list[tuple]:
    """(BLOCK_N, BLOCK_M, GROUPS, SPLIT_K, warps, stages): the tile M covers (16 at least: the MMA's rows),
    K tiles of 4 .. 16 blocks of 16, split-K for the few-row shapes where N tiles alone leave SMs idle; 3 stages
    (the table's). ~2 s a config (compile + timing): 36 candidates ~1.2 min an M."""
    block_m = next(b for b in (16, 32, 64, 128) if b >= min(m, 128))
    splits = (1, 2, 4, 8) if m <= 64 else (1, 2)
    return [
        (bn, block_m, g, s, w, 3)
        for bn, g, s, w in itertools.product((64, 128), (4, 8, 16), splits, (4, 8))
        if not (bn == 64 and w == 8)
    ]


def sweep_m(x, codes, scales, decode, w, memcpy: float, table_only: bool = False) -> None:
    m, n = x.shape[0], codes.shape[0]
    shape = f"N={n} K={x.shape[1]} M={m}"
    weight_bytes = codes.numel() + scales.numel()
    bound = lossy_bound(families.W4A16_NVFP4_GEMM, torch.bfloat16)
    want = w4a16_nvfp4_gemm_mirror(x, codes, scales, DecodeScale(decode))
    matmul = time_ms(lambda: torch.matmul(x, w.T), cuda_graph=True)
    dequant = time_ms(
        lambda: torch.matmul(x, dequantize_nvfp4(codes, scales, DecodeScale(decode), dtype=torch.bfloat16).T),
        cuda_graph=True,
    )
    note(f"{shape} bf16 matmul", f"{shape}: bf16 matmul {matmul * 1e3:.1f} us", time_us=matmul * 1e3)
    note(f"{shape} dequantize-matmul", f"{shape}: dequantize-matmul {dequant * 1e3:.1f} us", time_us=dequant * 1e3)
    table = kernel.launch_config(m, x.device)
    results = []

    def ratios(ms: float) -> dict[str, float]:
        return {"bf16": matmul / ms, "dequantize_matmul": dequant / ms, "memcpy": weight_bytes / ms / 1e6 / memcpy}

    variants = [(c, None) for c in ([] if table_only else candidates(m))] + [
        (tuple(table), None),
        (tuple(table), False),
    ]
    variants = list(dict.fromkeys(variants))  # the table's config once
    for config, packed in variants:
        name = f"{config}{' fp32-decode' if packed is False else ''}"
        checked = checked_ms(
            lambda c=config, p=packed: kernel.launch(x, codes, scales, decode, config=c, packed=p),
            want, bound, f"{shape} {name}",
        )  # fmt: skip
        if checked is None:
            continue
        ms, verdict = checked
        gbps = weight_bytes / ms / 1e6
        if packed is None:
            results.append((ms, config))
        label = " table" if config == tuple(table) else ""
        line(f"{shape} {name}{label}", ms, ratios(ms), verdict, gbps=gbps)
    best(shape, results, ratios)


def main(argv: list[str] | None = None) -> int:
    cli = parser(__doc__)
    cli.add_argument("--m", type=int, nargs="+", default=[1, 16, 64, 256])
    cli.add_argument(
        "--shapes", type=dims("NxK", (2,)), default="8192x8192", help="comma-separated NxK (weight rows x columns)"
    )
    cli.add_argument("--table-only", action="store_true", help="only the launch table's config (the crossover)")
    args = gpu_args(cli, argv, "w4a16_nvfp4_launch_sweep")
    memcpy = memcpy_gbps(1 << 30, "shapes N x K " + ",".join(f"{n}x{k}" for n, k in args.shapes))
    for n, k in args.shapes:
        for m in args.m:
            x, codes, scales, decode, w = inputs(SimpleNamespace(shape=(m, n, k)), "cuda")
            if m == args.m[0]:
                print(f"N = {n}, K = {k}: weights {(codes.numel() + scales.numel()) / 2**20:.1f} MiB", flush=True)
            sweep_m(x, codes, scales, decode, w, memcpy, args.table_only)
    return 0


if __name__ == "__main__":
    sys.exit(main())
