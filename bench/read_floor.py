"""The read floor: what one lone kernel takes to read N bytes once from HBM (cold L2, a CUDA-graph replay), the
bound on any op that must read those bytes in one launch. The memcpy roof is a 1 GiB copy's rate; a decode kernel
reads tens of MB in a single wave, and at that size a launch's ramp-up and tail are a large part of the time, so
an op can miss a fraction of the memcpy roof that no kernel reaching its bytes in one launch could meet.

    python -m bench.read_floor [--mb 37.7 53.0 185.4] [--flush read zero]

The kernel: each program loads BLOCK contiguous int32 and stores their sum (so the loads are live), the grid covers
the bytes once; the best of BLOCK in `BLOCKS` is the floor. Each size is timed after each L2 flush asked for
(`bench.timing.FLUSHES`; the harness times with "read", and "zero" is do_bench's own: the difference is what the
dirty lines a zeroing flush leaves behind cost the read). GPU only.
"""

from __future__ import annotations

import argparse
import functools

import torch
import triton
import triton.language as tl

from bench.roofs import measure_memcpy
from bench.timing import FLUSHES, bench

BLOCKS = (2048, 4096, 8192)  # int32 a program; 8 warps


@triton.jit
def _read_kernel(src, sums, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(sums + tl.program_id(0), tl.sum(tl.load(src + i, mask=i < n, other=0), axis=0))


def read_floor_ms(nbytes: int, flush: str = "read") -> float:
    """ms (p50, cold L2 by `flush`, graph replay) of the fastest lone read of `nbytes` on the current CUDA
    device."""
    n = nbytes // 4
    src = torch.ones(n, dtype=torch.int32, device="cuda")
    best = float("inf")
    for block in BLOCKS:
        sums = torch.empty(triton.cdiv(n, block), dtype=torch.int32, device="cuda")
        launch = functools.partial(_read_kernel[(triton.cdiv(n, block),)], src, sums, n, BLOCK=block, num_warps=8)
        launch()  # compiles it for this block
        best = min(best, bench(launch, "cuda", cuda_graph=True, flush=flush).p50)
    return best


def main(argv: list[str] | None = None) -> None:
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--mb", type=float, nargs="+", default=[37.7, 53.0, 185.4], help="sizes in MB (1e6 bytes)")
    cli.add_argument("--flush", nargs="+", choices=sorted(FLUSHES), default=["read", "zero"], help="L2 flushes")
    args = cli.parse_args(argv)
    roof = measure_memcpy("cuda", 1 << 30).value
    for mb in args.mb:
        for flush in args.flush:
            ms = read_floor_ms(int(mb * 1e6), flush)
            rate = mb / ms / roof
            print(f"read floor {mb:.1f} MB, {flush} flush: {ms * 1e3:.1f} us = {rate:.3f}x the 1 GiB memcpy rate")


if __name__ == "__main__":
    main()
