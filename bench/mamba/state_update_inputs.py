"""The selective-state-update bench problem: Mamba2 decode with 64 heads, head dim 64, d_state 128,
8 groups, bf16 activations, fp32 or bf16 state, the full vLLM argument set (D, z gate, dt_bias, softplus),
one slot per request in a permuted slot table. Shared by the registered bench and the launch sweep."""

from __future__ import annotations

import torch

NHEADS, HEAD_DIM, DSTATE, NGROUPS = 64, 64, 128, 8
X_DTYPE = torch.bfloat16
STATE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def make_problem(batch: int, state_dtype: torch.dtype, torch_device: str, seed: int = 0) -> dict:
    """Keyword arguments of selective_state_update (state included), seeded, on `torch_device`."""
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape, dtype=X_DTYPE):
        return torch.randn(shape, generator=gen).to(dtype)

    problem = dict(
        state=randn(batch, NHEADS, HEAD_DIM, DSTATE, dtype=state_dtype),
        x=randn(batch, NHEADS, HEAD_DIM),
        dt=randn(batch, NHEADS),
        A=-torch.exp(randn(NHEADS, dtype=torch.float32)),
        B=randn(batch, NGROUPS, DSTATE),
        C=randn(batch, NGROUPS, DSTATE),
        D=randn(NHEADS, dtype=torch.float32),
        z=randn(batch, NHEADS, HEAD_DIM),
        dt_bias=randn(NHEADS, dtype=torch.float32) - 3.0,
        dt_softplus=True,
        state_indices=torch.randperm(batch, generator=gen).to(torch.int32),
    )
    return {k: (v.to(torch_device) if isinstance(v, torch.Tensor) else v) for k, v in problem.items()}


def moved_bytes(batch: int, state_dtype: torch.dtype) -> int:
    """Compulsory bytes of one call: the state read and written once, x, z, dt, B, C read and out written
    (bf16), A, D, dt_bias (fp32) and the slot table (int32)."""
    state = batch * NHEADS * HEAD_DIM * DSTATE * state_dtype.itemsize
    activations = 3 * batch * NHEADS * HEAD_DIM + batch * NHEADS + 2 * batch * NGROUPS * DSTATE
    return 2 * state + activations * X_DTYPE.itemsize + 3 * NHEADS * 4 + batch * 4
