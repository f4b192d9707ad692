"""Sweep the MXFP4 kernels' launch shapes on a GPU: GB/s against a memcpy of the same run.

    python -m bench.quant.mxfp4_launch_sweep [--mib 1024]

This is how the constants `_QUANTIZE_GPU` / `_DEQUANTIZE_GPU` in kernels/mxfp4.py were chosen (re-run it on a
new GPU before changing them). Each shape is checked bit-exact against the reference on the last 512 rows
before it is timed. GPU only: the interpreter says nothing about launch shapes.
"""

from __future__ import annotations

import functools
import itertools
import sys

import torch
import triton

from bench.launch_sweep import gpu_args, memcpy_gbps, parser, report, time_ms
from kernels import mxfp4 as kernel
from reference.quant import mxfp4 as ref

K = 4096
QUANTIZE_SHAPES = list(itertools.product(((32, 1), (64, 1), (64, 2), (128, 1), (128, 2)), (1, 2, 4, 8)))
DEQUANTIZE_SHAPES = [(32, 1), (64, 1), (64, 2), (128, 2), (128, 4)]


def main(argv: list[str] | None = None) -> int:
    cli = parser(__doc__)
    cli.add_argument("--mib", type=int, default=1024, help="size of the bf16 input in MiB")
    args = gpu_args(cli, argv, "mxfp4_launch_sweep")
    m = args.mib * (1 << 20) // (2 * K)
    x = torch.randn(m, K, device="cuda", dtype=torch.bfloat16)
    moved = x.numel() * 2 + m * K // 2 + m * K // 32
    n_blocks = m * K // 32
    memcpy = memcpy_gbps(x.numel() * 2)

    tail = slice(m - 512, m)
    want_codes, want_scales = ref.quantize_mxfp4(x[tail].cpu(), scale_mode="rceil")
    words = x.view(torch.int32)
    codes = torch.empty(m, K // 2, dtype=torch.uint8, device="cuda")
    scales = torch.empty(m, K // 32, dtype=torch.uint8, device="cuda")
    for (blocks, warps), tiles in QUANTIZE_SHAPES:
        grid = (triton.cdiv(n_blocks, blocks * tiles),)
        codes.fill_(0xAA)
        ms = time_ms(
            functools.partial(
                kernel._quantize_mxfp4_kernel[grid],
                words,
                codes,
                scales,
                n_blocks,
                K // 32,
                K // 2,
                BLOCKS=blocks,
                TILES=tiles,
                INPUT=0,
                SCALE_MODE=1,
                CONTIGUOUS=True,
                FAULT=0,
                num_warps=warps,
            )
        )
        exact = torch.equal(codes[tail].cpu(), want_codes) and torch.equal(scales[tail].cpu(), want_scales)
        report(f"quantize   blocks={blocks:4d} tiles={tiles} warps={warps}", ms, moved, memcpy, exact)

    codes, scales = kernel.quantize_mxfp4(x)
    want = ref.dequantize_mxfp4(codes[tail].cpu(), scales[tail].cpu())
    out = torch.empty_like(x)
    for blocks, warps in DEQUANTIZE_SHAPES:
        grid = (triton.cdiv(n_blocks, blocks),)
        ms = time_ms(
            functools.partial(
                kernel._dequantize_mxfp4_kernel[grid],
                codes,
                scales,
                out.view(torch.int32),
                n_blocks,
                K // 32,
                K // 2,
                K // 32,
                BLOCKS=blocks,
                OUTPUT=0,
                CONTIGUOUS=True,
                num_warps=warps,
            )
        )
        exact = torch.equal(out[tail].cpu().view(torch.int16), want.view(torch.int16))
        report(f"dequantize blocks={blocks:4d} warps={warps}", ms, moved, memcpy, exact)
    return 0


if __name__ == "__main__":
    sys.exit(main())
