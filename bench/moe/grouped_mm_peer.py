"""The bf16 MoE layer written with torch's grouped GEMM, the peer of `kernels.fused_moe` in bench/moe/fused_moe.py.

The conventional unfused formulation (what a MoE layer looks like in plain PyTorch on Hopper): sort the k x T
assignments by expert, gather their token rows, `torch._grouped_mm` with the per-expert row ends as `offs`
(CUTLASS grouped GEMM on sm_90; b [E, K, N] as a transposed view of the [E, N, K] weights), SiLU-and-mul in
bf16, the second grouped GEMM, the routing weights, unsort, and sum the k rows of each token. No host
synchronization (the counts stay on the device), so it is timed as a CUDA-graph replay like the kernel.
Its roundings differ from the kernel's (gate and up rounded to bf16 before the activation, the routing weight
applied after the second GEMM's rounding), so it is checked against the mirror with a bound, not bit for bit.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def grouped_mm_moe(x, w13, w2, topk_weights, topk_ids) -> torch.Tensor:
    tokens, top_k = topk_ids.shape
    experts, inter = w13.shape[0], w13.shape[1] // 2
    flat = topk_ids.reshape(-1).long()
    order = torch.argsort(flat, stable=True)
    counts = torch.zeros(experts, dtype=torch.int32, device=x.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat, dtype=torch.int32))
    offs = torch.cumsum(counts, 0, dtype=torch.int32)
    h = torch._grouped_mm(x[order // top_k], w13.transpose(1, 2), offs=offs)
    act = F.silu(h[:, :inter]) * h[:, inter:]
    y = torch._grouped_mm(act, w2.transpose(1, 2), offs=offs) * topk_weights.reshape(-1)[order, None].to(x.dtype)
    per_slot = torch.empty_like(y)
    per_slot[order] = y
    return per_slot.view(tokens, top_k, -1).sum(dim=1, dtype=torch.float32).to(x.dtype)
