"""Sweep the selective state update kernel's launch shapes on a GPU: time, GB/s, and the ratio to memcpy.

    python -m bench.mamba.state_update_launch_sweep [--batch 256] [--quick]

How the `_GPU` table in kernels/mamba_state_update.py is to be chosen (its comment holds the H200 result).
Problem: the bench's shape (bench/mamba/state_update_inputs.py: 64 heads, head dim 64, d_state 128, 8 groups,
bf16 x, D, z, dt_bias, softplus, a permuted slot table) at batch 256, fp32 and bf16 state. Per config (BLOCK_D
head-dim rows per program, warps, stages): the kernel's median time, the compulsory bytes (state read +
written, small inputs, out) per second, the ratio to a same-run memcpy of the state's bytes (bar >= 0.80x),
and whether the first CHECKED requests' slots and out are within the ("mamba_state_update", dtype) rows of
the fp32 mirror. The kernel has no loop, so stages should not matter; the sweep shows it.
"""

from __future__ import annotations

import functools
import itertools
import sys

import torch

from bench.launch_sweep import gpu_args, line, memcpy_gbps, parser, timed_or_none
from bench.mamba.state_update_inputs import STATE_DTYPES, make_problem, moved_bytes
from kernels import mamba_state_update as kernel
from kernels.tolerances import families, lossy_bound, lossy_metrics, tolerance_verdict
from reference.mamba import state_update as ref

BLOCK_D, WARPS, STAGES = (4, 8, 16, 32, 64), (1, 2, 4, 8), (1, 2)
CHECKED = 16  # requests whose slots and out rows are compared (the whole state in fp64 would take seconds)


def verdict(problem: dict, config: dict, want_state, want_out, ideal_state, ideal_out) -> str:
    """One call from the initial state, compared on the first CHECKED requests."""
    args = dict(problem, state=problem["state"].clone())
    out = kernel.launch_selective_state_update(**args, config=config)
    slots = problem["state_indices"][:CHECKED].long()
    state = args["state"][slots]
    parts = [
        (families.MAMBA_STATE_UPDATE_STATE, state, want_state, ideal_state),
        (families.MAMBA_STATE_UPDATE_OUT, out[:CHECKED], want_out, ideal_out),
    ]
    verdicts = [
        tolerance_verdict(lossy_metrics(got, want, ideal), lossy_bound(family, got.dtype))
        for family, got, want, ideal in parts
    ]
    return "state " + verdicts[0] + "  out " + verdicts[1]


def sweep(batch: int, label: str, state_dtype: torch.dtype, configs) -> None:
    problem = make_problem(batch, state_dtype, "cuda")
    moved = moved_bytes(batch, state_dtype)
    state_bytes = problem["state"].numel() * state_dtype.itemsize
    memcpy = memcpy_gbps(state_bytes, f"the {label} state of batch {batch}")
    slots = problem["state_indices"][:CHECKED].long()
    mirror_state = problem["state"].clone()
    want_out = ref.selective_state_update(**dict(problem, state=mirror_state))[:CHECKED]
    ideal_state, ideal_out = ref.selective_state_update_ideal(**problem)
    checks = (mirror_state[slots], want_out, ideal_state[slots], ideal_out[:CHECKED])
    work = dict(problem, state=problem["state"].clone())  # timed calls keep advancing this copy
    for block_d, warps, stages in configs:
        config = dict(block_d=block_d, warps=warps, stages=stages)
        name = f"  {label} state B{batch} block_d={block_d:2d} warps={warps} stages={stages}"
        ms = timed_or_none(functools.partial(kernel.launch_selective_state_update, **work, config=config), name)
        if ms is None:
            continue
        gbps = moved / ms / 1e6
        line(name, ms, {"memcpy": gbps / memcpy}, verdict(problem, config, *checks), gbps=gbps)


def main(argv: list[str] | None = None) -> int:
    cli = parser(__doc__)
    cli.add_argument("--batch", type=int, default=256, help="requests (one state slot each)")
    cli.add_argument("--quick", action="store_true", help="block_d 8 and 16, warps 4 and 8, stages 1")
    args = gpu_args(cli, argv, "state_update_launch_sweep")
    configs = list(
        itertools.product(
            (8, 16) if args.quick else BLOCK_D, (4, 8) if args.quick else WARPS, (1,) if args.quick else STAGES
        )
    )
    for label, dtype in STATE_DTYPES.items():
        sweep(args.batch, label, dtype, configs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
