"""Sweep the RMSNorm kernel's warps per row on a GPU: time, GB/s, ratio to memcpy and to the runner's eager norm.

    python -m bench.norm.rms_norm_launch_sweep

This is how `_WARPS` in kernels/rms_norm.py is to be chosen (it is untuned until this has run on the H200).
Every config is timed as a CUDA-graph replay (decode rows run for microseconds; launch cost would hide them)
and checked against the reference with the "rms_norm" tolerance row. GPU only.
"""

from __future__ import annotations

import functools
import sys

import torch
import triton

from bench.launch_sweep import gpu_args, line, memcpy_gbps, parser, time_ms
from kernels import rms_norm as kernel
from kernels._boundary import f32_bits
from kernels._pdl import launch_args
from kernels.tolerances import families, lossy_bound, lossy_metrics, tolerance_verdict
from reference.norm.rms_norm import rms_norm, rms_norm_ideal
from reference.quant.fp8 import DEFAULT_EPS

EPS = 1e-5
HIDDENS = (576, 4096)
ROWS = (1, 64, 4096)
WARPS = (1, 2, 4, 8, 16)


def main(argv: list[str] | None = None) -> int:
    args = gpu_args(parser(__doc__), argv, "rms_norm_launch_sweep")
    del args
    memcpy = memcpy_gbps(1 << 30)
    bound = lossy_bound(families.RMS_NORM, torch.bfloat16)
    for hidden in HIDDENS:
        block = triton.next_power_of_2(hidden)
        weight = (1 + torch.randn(hidden, device="cuda") / 4).to(torch.bfloat16)
        for rows in ROWS:
            x = torch.randn(rows, hidden, device="cuda", dtype=torch.bfloat16)
            residual = torch.randn_like(x)
            for fused in (True, False):
                res = residual if fused else None
                moved = ((4 if fused else 2) * rows + 1) * hidden * 2
                eager = time_ms(
                    functools.partial(rms_norm, x, weight, EPS, res), cuda_graph=True
                )  # the runner's op sequence
                want = rms_norm(x, weight, EPS, res)
                ideal = rms_norm_ideal(x, weight, EPS, res)
                want, ideal = (want[0], ideal[0]) if fused else (want, ideal)
                out, new_res = torch.empty_like(x), torch.empty_like(x)
                scales = torch.empty(rows, 0, dtype=torch.float32, device=x.device)  # FP8 off: never read
                for warps in WARPS:
                    launch = functools.partial(
                        kernel._rms_norm_kernel[(rows,)],
                        x,
                        residual,
                        weight,
                        out,
                        new_res,
                        hidden,
                        hidden,
                        hidden,
                        EPS,
                        scales,
                        f32_bits(DEFAULT_EPS),
                        BLOCK=block,
                        HAS_RESIDUAL=fused,
                        FP8=False,
                        FAULT=0,
                        num_warps=warps,
                        **launch_args(x.device),
                    )
                    ms = time_ms(launch, cuda_graph=True)
                    verdict = tolerance_verdict(lossy_metrics(out.cpu(), want.cpu(), ideal.cpu()), bound)
                    if fused and not torch.equal(new_res, x + residual):
                        verdict = "MISMATCH in new residual; " + verdict
                    gbps = moved / ms / 1e6
                    config = f"{'fused' if fused else 'plain'} rows={rows:5d} hidden={hidden:5d} warps={warps:2d}"
                    line(config, ms, {"memcpy": gbps / memcpy, "eager-speedup": eager / ms}, verdict, gbps=gbps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
