"""Selective state update benchmark (Mamba2 decode): batch 1 .. 512 at 64 heads, head dim 64, d_state
128 (bench/mamba/state_update_inputs.py), one op per state dtype:
- `mamba_state_update_fp32state`, `mamba_state_update_bf16state`: x = batch.
The bar: batch 256 >= 0.80x memcpy GB/s. Bytes per call (compulsory): the state read and written once (2 MiB
a request in fp32) plus the small inputs and out. Roof: the same-run memcpy. Implementations:
- reference-mirror: reference.mamba.state_update.selective_state_update (the baseline; it checks the slot
  table on the host, so it is timed without a CUDA graph);
- reference-compiled (ungated peer): torch.compile of the reference's math (`update_rows`) with the slot
  gather/scatter around it and no host-side checks (the bench's tables have no pads);
- triton: kernels.mamba_state_update (launch shape per state dtype from bench/mamba/state_update_launch_sweep.py).
Each impl updates its own copy of the state (copied untimed); the timed calls keep advancing it, which the
bounded recurrence (|dA| < 1) tolerates. The first (untimed) call returns the out and a snapshot of the first
CHECKED_REQUESTS requests' slots, compared with the mirror's by the ("mamba_state_update", dtype) rows of
kernels.tolerances (the state rows share the out rows' numbers). Timing: CUDA-graph replays (`cuda_graph=True`:
a batch-1 update moves 4 MiB, ~1-2 us on an H200, far below the host's op dispatch).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from bench.correctness import lossy_check
from bench.mamba.state_update_inputs import STATE_DTYPES, make_problem, moved_bytes
from bench.quant.sweeps import kernel, triton_skip
from bench.registry import Case, Impl, OpBench, register
from kernels.tolerances import families
from reference.mamba.state_update import selective_state_update, update_rows

FULL_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
SMALL_BATCHES = (1, 2)  # CPU: the harness only (the eager mirror takes ~50 ms a request there)
CHECKED_REQUESTS = 8


def _cases(batches: tuple[int, ...]) -> list[Case]:
    return [Case(f"B{b}", float(b), (b,)) for b in batches]


def _compiled_update(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, state_indices):
    slots = state_indices.long()
    new, out = update_rows(
        state[slots].float(),
        x.float(),
        dt.float(),
        A.float(),
        B.float(),
        C.float(),
        D.float(),
        z.float(),
        dt_bias.float(),
        dt_softplus,
        x.shape[1] // B.shape[1],
    )
    state[slots] = new.to(state.dtype)
    return out.to(x.dtype)


@functools.cache
def compiled_update() -> Callable:
    return torch.compile(_compiled_update, dynamic=True)


def updater(get_fn: Callable[[], Callable], state: str = "state"):
    """Impl factory of an in-place slot-state update (this op's `state`, the conv1d update's `conv_state`): each
    impl advances its own copy; the first call returns the first CHECKED_REQUESTS slots' new state and out."""

    def factory(problem: dict) -> Callable[[], object]:
        fn = get_fn()
        args = dict(problem, **{state: problem[state].clone()})  # untimed: each impl advances its own state
        checked = problem["state_indices"][:CHECKED_REQUESTS].long()
        first = [True]

        def call():
            out = fn(**args)
            if first[0]:  # the runner's correctness call: a snapshot, before timing advances the state
                first[0] = False
                return args[state][checked].clone(), out
            return out

        return call

    return factory


def _op(label: str, state_dtype: torch.dtype) -> OpBench:
    return OpBench(
        name=f"mamba_state_update_{label}state",
        area="mamba",
        dtype=f"state {label}, x bf16",
        x_name="batch",
        sweeps={"small": _cases(SMALL_BATCHES), "full": _cases(FULL_BATCHES)},
        make_inputs=lambda case, torch_device: make_problem(case.shape[0], state_dtype, torch_device),
        impls=(
            Impl("reference-mirror", updater(lambda: selective_state_update)),
            Impl("reference-compiled", updater(compiled_update), gated=False),
            Impl(
                "triton", updater(lambda: kernel("kernels.mamba_state_update", "selective_state_update")), triton_skip
            ),
        ),
        bytes_model=lambda case: moved_bytes(case.shape[0], state_dtype),
        flops_model=lambda case: 0,
        roof="memcpy",
        baselines=("reference-mirror",),
        compare_to="reference-compiled",
        headline=(("triton", "memcpy"), ("triton", "reference-compiled")),
        check=lossy_check(families.MAMBA_STATE_UPDATE_OUT),
        cuda_graph=True,
    )


OPS = {label: register(_op(label, dtype)) for label, dtype in STATE_DTYPES.items()}
