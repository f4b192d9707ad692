"""Sweep the KV block zeroer's launch shape on a GPU: GB/s of the cleared bytes against a memset (zero_) of
the same number of bytes and a memcpy of the same run.

    python -m bench.kv.zeroer_launch_sweep [--mib 1024]

This is how `GPU_LAUNCH` in kernels/kv_zeroer.py is to be chosen (the measurement behind it is recorded
there). Both geometries of bench/kv/zeroer.py (DeepSeek-V4 packed rows, FlashAttention bf16
K/V-outermost), half of the cache's blocks cleared in random order. Each config is checked bit-exact
against the reference's bytes before it is timed. GPU only: the interpreter says nothing about launch shapes.
"""

from __future__ import annotations

import functools
import itertools
import sys

import torch

from bench.kv.zeroer import CANARY, DSV4_PACKED, FA_BF16, make_inputs
from bench.launch_sweep import gpu_args, memcpy_gbps, note, parser, report, time_ms
from kernels import kv_zeroer as kernel
from reference.kv import zeroer as ref

CHUNK_BYTES = (2048, 4096, 8192, 16384, 32768)
WARPS = (1, 2, 4, 8)


def main(argv: list[str] | None = None) -> int:
    cli = parser(__doc__)
    cli.add_argument("--mib", type=int, default=1024, help="bytes cleared per call, in MiB")
    args = gpu_args(cli, argv, "zeroer_launch_sweep")
    memcpy = memcpy_gbps(1 << 30)
    for name, geometry in (("dsv4_packed", DSV4_PACKED), ("fa_bf16", FA_BF16)):
        case = geometry.cases((args.mib,))[0]
        got, want = (make_inputs(geometry)(case, "cuda") for _ in range(2))
        ref.zero_kv_blocks(want.buffers, want.table, want.block_ids)
        cleared = got.cleared
        scratch = torch.empty(cleared, dtype=torch.uint8, device="cuda")
        memset = cleared / time_ms(scratch.zero_) / 1e6
        note(
            f"{name} memset",
            f"{name}: {case.shape[0]} of {case.shape[1]} blocks, {cleared / 2**20:.0f} MiB cleared; "
            f"memset {memset:.0f} GB/s",
            gbps=memset,
            bytes=cleared,
        )
        for chunk_bytes, warps in itertools.product(CHUNK_BYTES, WARPS):
            got.buffers[0].fill_(CANARY)
            call = functools.partial(
                kernel.launch_zero_kv_blocks,
                got.buffers,
                got.table,
                got.block_ids,
                chunk_bytes=chunk_bytes,
                num_warps=warps,
            )
            ms = time_ms(call)
            exact = torch.equal(got.buffers[0], want.buffers[0])
            report(f"{name:11s} chunk={chunk_bytes:5d} B warps={warps}", ms, cleared, memcpy, exact, memset=memset)
        del got, want, scratch
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
