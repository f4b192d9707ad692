"""Sweep the block-FP8 GEMM's launch configs on a GPU: TFLOP/s and the ratio to cuBLAS blockwise `_scaled_mm`
of the same run, per shape.

    python -m bench.gemm.block_fp8_launch_sweep [--shapes 8192x8192x8192,4096x2112x7168] [--quick]

`--quick`: at M > 64 only the Gluon kernel's candidates (`wgmma=True`), at M <= 64 the first three.
Default shapes: 8192^3 (the bar: >= 0.95x cuBLAS blockwise) and the DeepSeek-V3 projections (N, K) in
{(2112, 7168), (24576, 1536), (7168, 16384), (7168, 2048)} x M in {1, 16, 128, 1024, 4096}. One line per
(shape, config): time, TFLOP/s, ratio to cuBLAS blockwise, and the check against the mirror reference with
the suites' tolerance row. The launcher's own choice (`kernels.block_fp8_gemm.GPU_CONFIGS`) is the line
marked "table"; the winners go into that table. GPU only: the interpreter says nothing about launch shapes.
"""

from __future__ import annotations

import dataclasses
import sys

import torch

from bench.gemm import block_fp8_peers as peers
from bench.launch_sweep import dims, failed, gpu_args, line, parser, time_ms
from kernels import block_fp8_gemm as kernel
from kernels.tolerances import families, lossy_bound, lossy_metrics
from reference.gemm.block_fp8 import block_fp8_gemm_mirror

C = kernel.LaunchConfig
# Compute-bound candidates (M > 64). sm_90 compile checks (ptxas, no GPU): 128x128 / 8 warps: 160 registers,
# no spills, 96 KiB shared at 3 stages; 64x128 / 4 warps: 159 registers (up to 3 CTAs per SM by registers),
# so one CTA's scaling FMAs can overlap another's wgmma; warp_specialize splits 64x128 and 128x64 tiles into a
# TMA producer and two MMA partitions (168 registers, no spills) but leaves 128x128 / 8 warps as it is;
# 128x256 / 8 warps spills (~68 spill stores: the dot's fresh accumulator doubles the register tile).
LARGE_M = (
    # The Gluon kernel of kernels.block_fp8_gemm_wgmma (sm_90; elsewhere these run as their tiled twins): the table's
    # row (warp-specialized, GROUP_M 8, 6 stages), then both forms around it. bf16 C: 6 x 32 KiB of stages and two
    # 16 KiB halves of C are 224 KiB of shared memory, under the H200's 227; 128x64 tiles take 24 KiB a stage. sm_90
    # compile checks (ptxas, no GPU): 226 registers one partition, 248 / 232 / 24 warp-specialized; no spills, no
    # serialized wgmma. 128x64 tiles would even out waves that 128-wide ones leave mostly idle (N 2112 at M 4096:
    # 544 tiles are 4.12 waves of 132 SMs, 1056 tiles of 64 are 8.0), but ran at 0.62-0.79x cuBLAS.
    kernel.WGMMA_WS_CONFIG,
    dataclasses.replace(kernel.WGMMA_WS_CONFIG, tma_store=not kernel.WGMMA_WS_CONFIG.tma_store),
    dataclasses.replace(kernel.WGMMA_WS_CONFIG, num_stages=4),
    dataclasses.replace(kernel.WGMMA_WS_CONFIG, num_stages=5),
    dataclasses.replace(kernel.WGMMA_WS_CONFIG, group_m=16),
    dataclasses.replace(kernel.WGMMA_WS_CONFIG, group_m=16, num_stages=4),
    dataclasses.replace(kernel.WGMMA_WS_CONFIG, persistent=False),
    dataclasses.replace(kernel.WGMMA_WS_CONFIG, block_n=64, num_stages=8),
    kernel.WGMMA_CONFIG,
    dataclasses.replace(kernel.WGMMA_CONFIG, num_stages=5),
    C(128, 128, 8, 1, num_warps=8, num_stages=3),
    C(128, 128, 8, 1, num_warps=8, num_stages=4),
    C(128, 128, 8, 1, persistent=True, num_warps=8, num_stages=3),
    C(128, 128, 8, 1, persistent=True, num_warps=8, num_stages=4),
    C(128, 128, 16, 1, num_warps=8, num_stages=3),
    C(64, 128, 8, 1, num_warps=4, num_stages=3),
    C(64, 128, 8, 1, num_warps=4, num_stages=4),
    C(64, 128, 8, 1, warp_specialize=True, num_warps=4, num_stages=3),
    C(64, 128, 8, 1, warp_specialize=True, num_warps=4, num_stages=4),
    C(64, 128, 8, 1, persistent=True, warp_specialize=True, num_warps=4, num_stages=3),
    # 128x64 warp-specialized (4 warps, 4 stages) did not finish within a 400 s H200 slot: left out.
    C(128, 256, 8, 1, num_warps=8, num_stages=3),
)
# Weight-bandwidth-bound candidates (M <= 64): few tiles, so split K (0 = from the SM count); BLOCK_M 16 takes
# the mma.sync path (fp8 widened to fp16), 64 the wgmma one.
# The rows: (BLOCK_M, BLOCK_N, split-K choices); stages 4 at BLOCK_N 128, 6 at 64. Narrow tiles at fixed
# splits too: a decode step's 4096-row projections have only 32 tiles of 128.
SMALL_M = (
    *(
        C(bm, bn, 1, split, num_warps=4, num_stages=4 if bn == 128 else 6)
        for bm, bn, splits in (
            (64, 128, (0, 1, 2, 4, 8)),
            (64, 64, (0, 2, 4)),
            (16, 128, (0, 2, 4)),
            (16, 64, (0, 2, 4, 8)),
        )
        for split in splits
    ),
    C(64, 128, 1, 0, warp_specialize=True, num_warps=4, num_stages=4),
)
DSV3 = [
    (m, n, k) for n, k in ((2112, 7168), (24576, 1536), (7168, 16384), (7168, 2048)) for m in (1, 16, 128, 1024, 4096)
]
DEFAULT_SHAPES = [(8192, 8192, 8192), *DSV3]


def sweep_shape(m: int, n: int, k: int, quick: bool) -> None:
    ops = peers.make_operands(m, n, k, "cuda")
    flops = peers.gemm_flops(m, n, k)
    mirror = block_fp8_gemm_mirror(*ops.args, out_dtype=torch.bfloat16)
    bound = lossy_bound(families.BLOCK_FP8_GEMM, torch.bfloat16)
    try:
        cublas_ms = time_ms(peers.cublas_blockwise(ops), cuda_graph=True)
    except RuntimeError as err:
        cublas_ms = float("nan")
        failed(f"{m}x{n}x{k} cublas-blockwise", err)
    for name, make in (
        ("cublas-blockwise", None),
        ("cublas-rowwise-fp8", peers.cublas_rowwise),
        ("cublas-bf16", peers.bf16_matmul),
    ):
        try:
            ms = cublas_ms if make is None else time_ms(make(ops), cuda_graph=True)
            line(f"{m}x{n}x{k} {name:<40}", ms, {"blockwise": cublas_ms / ms}, "peer", tflops=flops / ms / 1e9)
        except RuntimeError as err:
            failed(f"{m}x{n}x{k} {name}", err)
    table = kernel.choose_config(m, n, k, torch.device("cuda"))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    candidates = SMALL_M[: 3 if quick else None] if m <= 64 else [c for c in LARGE_M if c.wgmma or not quick]
    for label, config in [("table", table), *(("", c) for c in candidates)]:
        split = config.split_k or kernel.auto_split_k(m, n, k, config.block_m, config.block_n, sms)
        text = (
            f"bm={config.block_m} bn={config.block_n} g={config.group_m} sk={split} "
            f"p={int(config.persistent)} ws={int(config.warp_specialize)} w={config.num_warps} "
            f"s={config.num_stages} wg={int(config.wgmma)} ts={int(config.tma_store)}"
        )
        try:

            def fn(config=config, args=ops.args):
                return kernel.launch_block_fp8_gemm(*args, out_dtype=torch.bfloat16, config=config)

            metrics = lossy_metrics(fn(), mirror, mirror)
            verdict = "ok" if metrics.max_rel <= bound.max_rel and metrics.rms_rel <= bound.rms_rel else "MISMATCH"
            ms = time_ms(fn, cuda_graph=True)
        except Exception as err:  # a config that does not compile or launch is a result, not a stop
            failed(f"{m}x{n}x{k} triton {text} {label}", err)
            continue
        line(
            f"{m}x{n}x{k} triton {text:<40}",
            ms,
            {"blockwise": cublas_ms / ms},
            f"{verdict} (max_rel {metrics.max_rel:.2g}, rms_rel {metrics.rms_rel:.2g}) {label}".rstrip(),
            tflops=flops / ms / 1e9,
        )
    del ops, mirror
    torch.cuda.empty_cache()


def main(argv: list[str] | None = None) -> int:
    cli = parser(__doc__)
    cli.add_argument(
        "--shapes", type=dims("MxNxK", (3,)), help="comma-separated MxNxK; default 8192^3 and the DeepSeek-V3 shapes"
    )
    cli.add_argument(
        "--quick", action="store_true", help="M > 64: only the Gluon kernel's candidates; M <= 64: the first three"
    )
    args = gpu_args(cli, argv, "block_fp8_launch_sweep")
    for m, n, k in args.shapes or DEFAULT_SHAPES:
        sweep_shape(m, n, k, args.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
