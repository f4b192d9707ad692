"""Sweep the NVFP4 kernels' launch shapes on a GPU: GB/s against a memcpy of the same run.

    python -m bench.quant.nvfp4_launch_sweep [--mib 1024] [--k 7168]

How the constants `_QUANTIZE_GPU` / `_DEQUANTIZE_GPU` / `_MULTIPLIER_TABLE` in kernels/nvfp4.py are to be
chosen. Each shape is checked bit-exact against the reference on the last 256 rows before it is timed.
Quantize rows with table=1 time the launcher's 128-entry multiplier table (one small torch division) and
the kernel together, as one op call pays them; table=0 rows divide per block in the kernel instead. The bar
for quantize at >= 256 MiB is 0.90x memcpy. GPU only: the interpreter says nothing about
launch shapes.
"""

from __future__ import annotations

import functools
import itertools
import sys

import torch
import triton

from bench.launch_sweep import gpu_args, memcpy_gbps, parser, report, time_ms
from kernels import nvfp4 as kernel
from reference.quant import nvfp4 as ref
from reference.quant.nvfp4_global_scale import EncodeScale, tensor_amax

# ((blocks of 16 per tile, warps), tiles per program, multiplier table); with bf16 one block is one thread's
# two 16-byte loads. The in-kernel division (table 0) only at 8 tiles, where the previous sweep plateaued.
BLOCK_WARPS = ((64, 2), (128, 4), (128, 2), (256, 4), (256, 8), (512, 8))
QUANTIZE_SHAPES = [(bw, t, True) for bw, t in itertools.product(BLOCK_WARPS, (1, 2, 4, 8))]
QUANTIZE_SHAPES += [(bw, 8, False) for bw in BLOCK_WARPS]
DEQUANTIZE_SHAPES = [(64, 2), (128, 2), (128, 4), (256, 4), (256, 8), (512, 8)]


def main(argv: list[str] | None = None) -> int:
    cli = parser(__doc__)
    cli.add_argument("--mib", type=int, default=1024, help="size of the bf16 input in MiB")
    cli.add_argument("--k", type=int, default=7168, help="row length (a multiple of 16)")
    args = gpu_args(cli, argv, "nvfp4_launch_sweep")
    k = args.k
    m = args.mib * (1 << 20) // (2 * k)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    scale = EncodeScale.from_amax(tensor_amax(x))
    moved = x.numel() * 2 + m * k // 2 + m * k // 16
    n_blocks = m * k // 16
    memcpy = memcpy_gbps(x.numel() * 2, f"x [{m}, {k}] bf16")

    tail = slice(m - 256, m)
    want_codes, want_scales = ref.quantize_nvfp4(x[tail].cpu(), scale.to("cpu"))
    words = x.view(torch.int32)
    codes = torch.empty(m, k // 2, dtype=torch.uint8, device="cuda")
    scales = torch.empty(m, k // 16, dtype=torch.uint8, device="cuda")
    for (blocks, warps), tiles, table in QUANTIZE_SHAPES:
        grid = (triton.cdiv(n_blocks, blocks * tiles),)
        codes.fill_(0xAA)

        def call(grid=grid, blocks=blocks, warps=warps, tiles=tiles, table=table):
            multipliers = kernel.multipliers(scale.value) if table else scale.value
            kernel._quantize_nvfp4_kernel[grid](
                words,
                codes,
                scales,
                scale.value,
                multipliers,
                n_blocks,
                k // 16,
                k // 2,
                BLOCKS=blocks,
                TILES=tiles,
                INPUT=0,
                CONTIGUOUS=True,
                TABLE=table,
                FAULT=0,
                num_warps=warps,
                enable_fp_fusion=False,
            )

        ms = time_ms(call)
        exact = torch.equal(codes[tail].cpu(), want_codes) and torch.equal(scales[tail].cpu(), want_scales)
        config = f"quantize   blocks={blocks:4d} tiles={tiles} warps={warps} table={int(table)}"
        report(config, ms, moved, memcpy, exact)

    codes, scales = kernel.quantize_nvfp4(x, scale)
    decode = scale.to_decode()
    want = ref.dequantize_nvfp4(codes[tail].cpu(), scales[tail].cpu(), decode.to("cpu"))
    out = torch.empty_like(x)
    for blocks, warps in DEQUANTIZE_SHAPES:
        grid = (triton.cdiv(n_blocks, blocks),)
        ms = time_ms(
            functools.partial(
                kernel._dequantize_nvfp4_kernel[grid],
                codes,
                scales,
                decode.value,
                out.view(torch.int32),
                n_blocks,
                k // 16,
                k // 2,
                k // 16,
                BLOCKS=blocks,
                OUTPUT=0,
                CONTIGUOUS=True,
                num_warps=warps,
                enable_fp_fusion=False,
            )
        )
        exact = torch.equal(out[tail].cpu().view(torch.int16), want.view(torch.int16))
        report(f"dequantize blocks={blocks:4d} warps={warps}", ms, moved, memcpy, exact)
    return 0


if __name__ == "__main__":
    sys.exit(main())
