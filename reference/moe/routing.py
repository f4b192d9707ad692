"""Routing: router logits [T, E] -> (top-k weights float32 [T, k], expert ids int64 [T, k]).

Three schemes, as the models define them (transformers 5.x is the oracle: suites/moe/test_routing.py):
- `softmax_topk`: softmax over the E logits in float32, the k largest probabilities, optionally divided by
  their sum (Mixtral always renormalizes; Qwen3-MoE does when norm_topk_prob).
- `topk_softmax` (gpt-oss): the k largest logits, then a softmax over those k only (the weights always sum 1).
- `grouped_topk` (DeepSeek-V3, "noaux_tc"): scores = sigmoid(logits) in float32; experts are *chosen* on
  scores + correction_bias: the E experts form n_group groups, a group's score is the sum of its two best
  biased scores, the topk_group best groups stay eligible, and the k best biased scores among their experts
  win. Each winner's *weight* is its unbiased score; renormalized when asked, then times
  routed_scaling_factor.
Ids come in the order torch.topk returns them (descending weight for the first two; DeepSeek-V3 takes
`sorted=False`, so any order): the experts' combine is a sum, so consumers must not depend on the order.
"""

from __future__ import annotations

import torch


def check_routing_args(logits: torch.Tensor, top_k: int, name: str = "router_logits") -> None:
    """TypeError/ValueError naming the argument: float [T, E] logits and 1 <= top_k <= E."""
    if not isinstance(logits, torch.Tensor) or not logits.is_floating_point():
        raise TypeError(f"{name}: must be a floating-point tensor, got {getattr(logits, 'dtype', type(logits))}")
    if logits.dim() != 2:
        raise ValueError(f"{name}: must be [tokens, experts], got shape {tuple(logits.shape)}")
    experts = logits.shape[1]
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= experts:
        raise ValueError(f"top_k: must be an int in [1, {experts}] (the router's expert count), got {top_k!r}")


def softmax_topk(logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    check_routing_args(logits, top_k)
    probs = torch.softmax(logits.float(), dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids


def topk_softmax(logits: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    check_routing_args(logits, top_k)
    top, ids = torch.topk(logits.float(), top_k, dim=-1)
    return torch.softmax(top, dim=-1), ids


def grouped_topk(
    logits: torch.Tensor,
    top_k: int,
    n_group: int,
    topk_group: int,
    correction_bias: torch.Tensor | None = None,
    routed_scaling_factor: float = 1.0,
    renormalize: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    check_routing_args(logits, top_k)
    tokens, experts = logits.shape
    if isinstance(n_group, bool) or not isinstance(n_group, int) or n_group < 1 or experts % n_group:
        raise ValueError(f"n_group: must divide the {experts} experts into equal groups, got {n_group!r}")
    per_group = experts // n_group
    if per_group < 2:
        raise ValueError(f"n_group: a group's score is its two best experts; {n_group} groups leave {per_group}")
    if isinstance(topk_group, bool) or not isinstance(topk_group, int) or not 1 <= topk_group <= n_group:
        raise ValueError(f"topk_group: must be an int in [1, n_group = {n_group}], got {topk_group!r}")
    if top_k > topk_group * per_group:
        raise ValueError(f"top_k: {top_k} exceeds the {topk_group * per_group} experts of the kept groups")
    if correction_bias is not None and tuple(correction_bias.shape) != (experts,):
        raise ValueError(f"correction_bias: must be [{experts}] (one per expert), got {tuple(correction_bias.shape)}")
    scores = torch.sigmoid(logits.float())
    choice = scores + correction_bias.float() if correction_bias is not None else scores
    group_scores = choice.view(tokens, n_group, per_group).topk(2, dim=-1).values.sum(dim=-1)
    keep = torch.zeros_like(group_scores, dtype=torch.bool)
    keep.scatter_(1, group_scores.topk(topk_group, dim=-1).indices, True)
    eligible = keep.unsqueeze(-1).expand(tokens, n_group, per_group).reshape(tokens, experts)
    ids = choice.masked_fill(~eligible, float("-inf")).topk(top_k, dim=-1).indices
    weights = scores.gather(1, ids)
    if renormalize:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)  # DeepSeek-V3's guard against 0 / 0
    return weights * routed_scaling_factor, ids
