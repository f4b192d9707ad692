"""Causal conv1d update benchmark (Mamba2 decode): the conv in front of the selective state update,
one token per request through a rolling [width - 1, dim] state per slot.

Problem: the channels of the state-update bench's layer (bench/mamba/state_update_inputs.py): x, B and C go
through the conv, dim = 64 heads x 64 + 2 x 8 groups x 128 = 6144; width 4; bf16 x, state, weight and bias;
SiLU; a permuted slot table. One op, `mamba_conv1d_update`, x = batch 1 .. 512. Bytes per call
(compulsory): the state read and written (2 x 3 rows), x read and out written, weight and bias once. Roof:
the same-run memcpy. Implementations:
- reference-mirror: reference.mamba.conv1d.causal_conv1d_update (the baseline; it reads the slot table on the
  host, so it is timed without a CUDA graph);
- reference-compiled (ungated peer): torch.compile of the same math (gather, fp32 taps, SiLU, scatter) with
  no host-side checks (the bench's tables have no pads);
- triton: kernels.mamba_conv1d_update.
Each impl updates its own copy of the state (copied untimed); the first call returns the first
CHECKED_REQUESTS requests' new state rows and the out, compared with the mirror's by the ("mamba_conv1d_update",
bf16) row. Timing: CUDA-graph replays (a batch-256 update moves ~25 MB, a few microseconds).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from bench.correctness import lossy_check
from bench.mamba.state_update import updater
from bench.mamba.state_update_inputs import DSTATE, HEAD_DIM, NGROUPS, NHEADS
from bench.quant.sweeps import kernel, triton_skip
from bench.registry import Case, Impl, OpBench, register
from kernels.tolerances import families
from reference.mamba.conv1d import causal_conv1d_update

DIM, WIDTH, DTYPE = NHEADS * HEAD_DIM + 2 * NGROUPS * DSTATE, 4, torch.bfloat16
FULL_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
SMALL_BATCHES = (1, 2)


def make_problem(batch: int, torch_device: str, seed: int = 0) -> dict:
    """Keyword arguments of causal_conv1d_update (conv_state included), seeded, on `torch_device`."""
    gen = torch.Generator().manual_seed(seed)
    problem = dict(
        x=torch.randn(batch, DIM, generator=gen).to(DTYPE),
        conv_state=torch.randn(batch, WIDTH - 1, DIM, generator=gen).to(DTYPE),
        weight=(torch.randn(DIM, WIDTH, generator=gen) / WIDTH).to(DTYPE),
        bias=(torch.randn(DIM, generator=gen) / 10).to(DTYPE),
        activation="silu",
        state_indices=torch.randperm(batch, generator=gen).to(torch.int32),
    )
    return {k: (v.to(torch_device) if isinstance(v, torch.Tensor) else v) for k, v in problem.items()}


def moved_bytes(batch: int) -> int:
    per_request = 2 * (WIDTH - 1) * DIM + 2 * DIM  # state read + written, x read, out written
    return (batch * per_request + DIM * (WIDTH + 1)) * DTYPE.itemsize + batch * 4


def _compiled_math(x, conv_state, weight, bias, activation, state_indices):
    slots = state_indices.long()
    window = torch.cat([conv_state[slots], x[:, None, :].to(conv_state.dtype)], dim=1)  # [B, width, dim]
    acc = (window.float() * weight.float().t()[None]).sum(1) + bias.float()
    conv_state[slots] = window[:, 1:]
    return torch.nn.functional.silu(acc).to(x.dtype)


@functools.cache
def compiled_update() -> Callable:
    return torch.compile(_compiled_math, dynamic=True)


OP = register(
    OpBench(
        name="mamba_conv1d_update",
        area="mamba",
        dtype="bfloat16",
        x_name="batch",
        sweeps={
            "small": [Case(f"B{b}", float(b), (b,)) for b in SMALL_BATCHES],
            "full": [Case(f"B{b}", float(b), (b,)) for b in FULL_BATCHES],
        },
        make_inputs=lambda case, torch_device: make_problem(case.shape[0], torch_device),
        impls=(
            Impl("reference-mirror", updater(lambda: causal_conv1d_update, "conv_state")),
            Impl("reference-compiled", updater(compiled_update, "conv_state"), gated=False),
            Impl(
                "triton",
                updater(lambda: kernel("kernels.mamba_conv1d_update", "causal_conv1d_update"), "conv_state"),
                triton_skip,
            ),
        ),
        bytes_model=lambda case: moved_bytes(case.shape[0]),
        flops_model=lambda case: 0,
        roof="memcpy",
        baselines=("reference-mirror",),
        compare_to="reference-compiled",
        headline=(("triton", "memcpy"), ("triton", "reference-compiled")),
        check=lossy_check(families.MAMBA_CONV1D_UPDATE),
        cuda_graph=True,
    )
)
