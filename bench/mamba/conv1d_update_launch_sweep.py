"""Sweep the causal conv1d update kernel's launch shape on a GPU: time, GB/s, and the ratio to memcpy.

    python -m bench.mamba.conv1d_update_launch_sweep [--batch 256]

How the `_GPU` table in kernels/mamba_conv1d_update.py is to be chosen. Problem: bench/mamba/conv1d_update.py's
(6144 bf16 channels, width 4, SiLU, a permuted slot table). Per config (channels per program, warps): the
kernel's median time, the compulsory bytes per second, the ratio to a same-run memcpy of as many bytes, and
whether the new state rows are bit-exact and out is within the ("mamba_conv1d_update", bf16) row.
Limitation (H200, b7af659): at batch 256 the kernel runs ~14 us, below the eager launch path this times
(24-78 us a config): rank configs at --batch 4096 or more, or time CUDA-graph replays, before trusting it.
"""

from __future__ import annotations

import functools
import itertools
import sys

import torch

from bench.launch_sweep import gpu_args, line, memcpy_gbps, parser, timed_or_none
from bench.mamba.conv1d_update import make_problem, moved_bytes
from kernels import mamba_conv1d_update as kernel
from kernels.tolerances import families, lossy_bound, lossy_metrics, tolerance_verdict
from reference.mamba import conv1d as ref

BLOCK_C, WARPS = (128, 256, 512, 1024, 2048), (1, 2, 4, 8)


def main(argv: list[str] | None = None) -> int:
    cli = parser(__doc__)
    cli.add_argument("--batch", type=int, default=256, help="requests (one state slot each)")
    args = gpu_args(cli, argv, "conv1d_update_launch_sweep")
    problem = make_problem(args.batch, "cuda")
    moved = moved_bytes(args.batch)
    memcpy = memcpy_gbps(moved // 2, f"{moved / 2**20:.1f} MiB moved a call")
    want_state = problem["conv_state"].clone()
    want = ref.causal_conv1d_update(**dict(problem, conv_state=want_state))
    ideal = ref.causal_conv1d_ideal(
        problem["x"][:, None, :],
        problem["weight"],
        problem["bias"],
        problem["conv_state"][problem["state_indices"].long()],
        "silu",
    )[:, 0]
    bound = lossy_bound(families.MAMBA_CONV1D_UPDATE, torch.bfloat16)
    for block_c, warps in itertools.product(BLOCK_C, WARPS):
        config = dict(block_c=block_c, warps=warps)
        name = f"  B{args.batch} block_c={block_c:4d} warps={warps}"
        state = problem["conv_state"].clone()
        out = kernel.launch_causal_conv1d_update(**dict(problem, conv_state=state), config=config)
        exact = "state exact" if torch.equal(state, want_state) else "state MISMATCH"
        work = dict(problem, conv_state=problem["conv_state"].clone())  # timed calls keep shifting this copy
        ms = timed_or_none(functools.partial(kernel.launch_causal_conv1d_update, **work, config=config), name)
        if ms is None:
            continue
        gbps = moved / ms / 1e6
        line(
            name,
            ms,
            {"memcpy": gbps / memcpy},
            f"{exact}  out {tolerance_verdict(lossy_metrics(out, want, ideal), bound)}",
            gbps=gbps,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
