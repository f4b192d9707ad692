"""Sweep the FP8 group quantizer's launch shape on a GPU: GB/s against a memcpy of the same run.

    python -m bench.quant.fp8_launch_sweep [--mib 1024]

How `_GPU_TILE_ELEMENTS` and the warp count in kernels/fp8_quant.py were chosen (re-run it on a new GPU
before changing them). Group 128, e4m3fn, DeepSeek-V3 activations [M, 7168] bf16; fp32 and UE8M0 scales.
Each shape is checked bit-exact against the reference on the last 256 rows before its time counts.
"""

from __future__ import annotations

import functools
import sys

import torch
import triton

from bench.launch_sweep import gpu_args, memcpy_gbps, parser, report, time_ms
from kernels import fp8_quant as kernel
from kernels._boundary import f32_bits
from kernels._pdl import launch_args
from reference.quant import fp8 as ref

K = 7168
GROUP = 128
SHAPES = [(g, w) for g in (8, 16, 32, 64, 128) for w in (1, 2, 4, 8) if g * GROUP // (32 * w) >= 4]


def main(argv: list[str] | None = None) -> int:
    cli = parser(__doc__)
    cli.add_argument("--mib", type=int, default=1024, help="size of the bf16 input in MiB")
    args = gpu_args(cli, argv, "fp8_launch_sweep")
    m = args.mib * (1 << 20) // (2 * K)
    x = torch.randn(m, K, device="cuda", dtype=torch.bfloat16)
    n_groups = m * K // GROUP
    moved = x.numel() * 2 + x.numel() + n_groups * 4
    memcpy = memcpy_gbps(x.numel() * 2)
    tail = slice(m - 256, m)
    q = torch.empty(m, K, dtype=torch.uint8, device="cuda")
    scales = torch.empty(m, K // GROUP, dtype=torch.float32, device="cuda")
    eps_bits = f32_bits(ref.DEFAULT_EPS)
    for ue8m0 in (False, True):
        want_q, want_s = ref.quantize_fp8(x[tail].cpu(), granularity="group", group_size=GROUP, ue8m0=ue8m0)
        for block_g, warps in SHAPES:
            q.fill_(0xAA)
            ms = time_ms(
                functools.partial(
                    kernel._quantize_fp8_kernel[(triton.cdiv(n_groups, block_g),)],
                    x,
                    q,
                    scales,
                    scales,
                    n_groups,
                    K // GROUP,
                    GROUP,
                    K,
                    eps_bits,
                    BLOCK_G=block_g,
                    GROUP=GROUP,
                    FMT=0,
                    FP8_MAX=448.0,
                    UE8M0=ue8m0,
                    SOURCE=0,
                    CONTIGUOUS=True,
                    FAULT=0,
                    num_warps=warps,
                    **launch_args(x.device),
                )
            )
            exact = torch.equal(q[tail].cpu(), want_q.view(torch.uint8)) and torch.equal(scales[tail].cpu(), want_s)
            report(f"ue8m0={int(ue8m0)} groups={block_g:4d} warps={warps}", ms, moved, memcpy, exact)
    return 0


if __name__ == "__main__":
    sys.exit(main())
