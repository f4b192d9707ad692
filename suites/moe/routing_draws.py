"""Hypothesis draws of a MoE layer's routing, shared by the quantized-layer kernel suites: experts, top-k, tokens
(0, 1, odd, more than E x block), skew (every token on the same experts) and an expert-parallel map."""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from suites.guard_bytes import POISON, fill_free_memory


def draw_routing(draw) -> tuple[int, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(experts, topk_ids [T, k], topk_weights [T, k], expert_map or None)."""
    experts = draw(st.sampled_from([1, 3, 8]))
    top_k = draw(st.integers(1, min(experts, 4)))
    tokens = draw(st.sampled_from([0, 1, 5, 33]))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    if draw(st.booleans()) or tokens == 0:
        ids = torch.randperm(experts, generator=g)[:top_k].repeat(tokens, 1)  # every token on the same experts
    else:
        ids = torch.stack([torch.randperm(experts, generator=g)[:top_k] for _ in range(tokens)])
    weights = torch.softmax(torch.randn(tokens, top_k, generator=g), -1)
    expert_map = None
    if draw(st.booleans()) and experts > 1:
        here = torch.randperm(experts, generator=g)[: (experts + 1) // 2]
        expert_map = torch.full((experts,), -1, dtype=torch.int32)
        expert_map[here] = torch.arange(here.numel(), dtype=torch.int32)
    return experts, ids, weights, expert_map


def decode_routing(tokens: int, expert_map: bool) -> tuple[int, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """A decode-sized routing (tokens x top-2 of 8 experts, `kernels.moe_gemv`'s path): the last expert routed
    to, and with `expert_map` half of the 8 global experts on this rank."""
    g = torch.Generator().manual_seed(11)
    ids = torch.stack([torch.randperm(8, generator=g)[:2] for _ in range(tokens)])
    ids[0, 0] = 7
    mapping = None
    if expert_map:
        mapping = torch.full((8,), -1, dtype=torch.int32)
        mapping[torch.tensor([1, 3, 5, 7])] = torch.arange(4, dtype=torch.int32)
    return 8, ids, torch.softmax(torch.randn(tokens, 2, generator=g), -1), mapping


def local_experts(experts: int, expert_map: torch.Tensor | None) -> int:
    return experts if expert_map is None else int((expert_map >= 0).sum())


def on(args: list, device: str) -> list:
    return [a.to(device) if isinstance(a, torch.Tensor) else a for a in args]


def drop_one(
    args: list, ids_at: int, weights_at: int, experts: int, device: str, kernel_args=list
) -> tuple[list, list]:  # fmt: skip
    """(the kernel's arguments on `device`, the references' on the host) for a layer whose assignment (0, 1) goes to
    id `experts` (outside [0, E): a caller's bug the alignment drops) in the kernel's routing, and stays at its valid
    id with weight 0 in the references': what "adds nothing" means. `kernel_args` maps the references' arguments to
    the kernel's (a weight layout the kernel takes). On a GPU the caching allocator's free memory is poisoned (NaN in
    bf16) first, so a per-assignment row nothing wrote and the combine summed would show."""
    host = list(args)
    ids, weights = host[ids_at].clone(), host[weights_at].clone()
    ids[0, 1], weights[0, 1] = experts, 0.0
    host[weights_at] = weights
    placed = on(kernel_args(args), device)
    placed[ids_at] = ids.to(device)
    fill_free_memory(device, POISON)
    return placed, host
