"""The expert MLP of a MoE layer and the weighted combine: out[t] = sum_j w[t, j] * expert_{id[t, j]}(x[t]).

Weights, "NT" like F.linear: `w13` [E, 2I, H] (the fused gate/up projection) and `w2` [E, H, I]; optional
biases [E, 2I] and [E, H] (gpt-oss). Activations on the [.., 2I] gate/up product:
- "silu": silu(gate) * up, gate the first I columns, up the last I (vLLM, transformers 5.x);
- "swiglu_oai" (gpt-oss): gate the even columns, up the odd ones; gate clamped above at `limit` (7), up
  to [-limit, limit]; (up + 1) * gate * sigmoid(alpha * gate), alpha 1.702.
Expert parallelism: `expert_map` [E_global] gives each global expert's local index into w13/w2, or -1 for an
expert on another rank, which contributes nothing here (the ranks' outputs sum to the whole).

Two references, as for the dense GEMMs:
- `fused_moe_ideal`: float64 throughout (operands widened exactly), no rounding: what the layer means.
- `fused_moe_mirror`: the kernels' precision contract for bf16/fp16 operands: each GEMM sums in fp32 (bias
  added in fp32); the activation runs in fp32 and its result is rounded to the input dtype (the intermediate
  the second GEMM reads); the second GEMM's fp32 result (plus bias) times the routing weight is rounded to the
  input dtype once per (token, slot); the combine sums a token's k rounded products in fp32 and rounds once.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

ALPHA, LIMIT = 1.702, 7.0  # gpt-oss's clamped SwiGLU


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def swiglu_oai(gate_up: torch.Tensor, alpha: float = ALPHA, limit: float = LIMIT) -> torch.Tensor:
    gate, up = gate_up[..., ::2].clamp(max=limit), gate_up[..., 1::2].clamp(-limit, limit)
    return (up + 1) * gate * torch.sigmoid(alpha * gate)


ACTIVATIONS = {"silu": silu_and_mul, "swiglu_oai": swiglu_oai}


def check_moe_args(
    x, w13, w2, topk_weights, topk_ids, activation="silu", w13_bias=None, w2_bias=None, expert_map=None, values=True
):
    """TypeError/ValueError naming the argument. Returns the global expert count. values=False skips the
    checks that read tensor values (expert ids in range): a kernel launcher's, which must not sync."""
    for name, t in (("x", x), ("w13", w13), ("w2", w2), ("topk_weights", topk_weights)):
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            raise TypeError(f"{name}: must be a floating-point tensor, got {getattr(t, 'dtype', type(t))}")
    if x.dim() != 2:
        raise ValueError(f"x: must be [tokens, hidden], got shape {tuple(x.shape)}")
    tokens, hidden = x.shape
    if w13.dim() != 3 or w13.shape[2] != hidden or w13.shape[1] % 2:
        raise ValueError(f"w13: must be [experts, 2 * intermediate, hidden = {hidden}], got {tuple(w13.shape)}")
    local, inter = w13.shape[0], w13.shape[1] // 2
    if tuple(w2.shape) != (local, hidden, inter):
        want = f"[{local}, {hidden}, {inter}] (experts, hidden, intermediate)"
        raise ValueError(f"w2: must be {want}, got {tuple(w2.shape)}")
    if not isinstance(topk_ids, torch.Tensor) or topk_ids.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"topk_ids: must be an int32/int64 tensor, got {getattr(topk_ids, 'dtype', type(topk_ids))}")
    if topk_ids.dim() != 2 or topk_ids.shape[0] != tokens:
        raise ValueError(f"topk_ids: must be [{tokens}, top_k], got {tuple(topk_ids.shape)}")
    if tuple(topk_weights.shape) != tuple(topk_ids.shape):
        got, want = tuple(topk_weights.shape), tuple(topk_ids.shape)
        raise ValueError(f"topk_weights: shape {got} must equal topk_ids' {want}")
    experts = local if expert_map is None else expert_map.shape[0]
    if expert_map is not None:
        if expert_map.dim() != 1 or expert_map.dtype not in (torch.int32, torch.int64):
            got = f"{expert_map.dtype} {tuple(expert_map.shape)}"
            raise ValueError(f"expert_map: must be int [global experts], got {got}")
        if values and expert_map.numel() and (int(expert_map.min()) < -1 or int(expert_map.max()) >= local):
            raise ValueError(f"expert_map: entries must be -1 or a local expert in [0, {local})")
    if topk_ids.shape[1] > experts:
        raise ValueError(f"topk_ids: top_k {topk_ids.shape[1]} is larger than the {experts} experts")
    if values and topk_ids.numel() and (int(topk_ids.min()) < 0 or int(topk_ids.max()) >= experts):
        raise ValueError(f"topk_ids: expert ids must be in [0, {experts})")
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation: must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
    for name, b, want in (("w13_bias", w13_bias, (local, 2 * inter)), ("w2_bias", w2_bias, (local, hidden))):
        if b is not None and tuple(b.shape) != want:
            raise ValueError(f"{name}: must be {list(want)}, got {tuple(b.shape)}")
    return experts


def _assignments(topk_ids: torch.Tensor, experts: int, expert_map):
    """(local expert, token rows, slots) for each expert present on this rank; rows and slots on topk_ids' device."""
    mapping = expert_map.cpu().to(torch.int64) if expert_map is not None else torch.arange(experts)
    ids = topk_ids.to(torch.int64)
    for e in ids.unique().tolist():
        local = int(mapping[e])
        if local >= 0:
            rows, slots = torch.where(ids == e)
            yield local, rows, slots


def combine_ideal(topk_weights, topk_ids, experts: int, expert_map, hidden: int, expert_out) -> torch.Tensor:
    """float64 [T, H] on topk_ids' device: sum_j w[t, j] * expert_out(local expert, token rows)[row], no rounding."""
    out = torch.zeros(topk_ids.shape[0], hidden, dtype=torch.float64, device=topk_ids.device)
    wd = topk_weights.to(topk_ids.device, torch.float64)
    for e, rows, slots in _assignments(topk_ids, experts, expert_map):
        out.index_add_(0, rows, expert_out(e, rows).double() * wd[rows, slots, None])
    return out


def combine_mirror(topk_weights, topk_ids, experts: int, expert_map, hidden: int, dtype, expert_out) -> torch.Tensor:
    """dtype [T, H] on topk_ids' device: each (token, slot) product expert_out(...) * w rounded to dtype once, the
    k of a token summed in fp32, rounded once (expert_out returns the second GEMM's fp32 result, bias included)."""
    tokens, k = topk_ids.shape
    per_slot = torch.zeros(tokens, k, hidden, dtype=torch.float32, device=topk_ids.device)
    wf = topk_weights.to(topk_ids.device, torch.float32)
    for e, rows, slots in _assignments(topk_ids, experts, expert_map):
        per_slot[rows, slots] = (expert_out(e, rows).float() * wf[rows, slots, None]).to(dtype).float()
    return per_slot.sum(dim=1).to(dtype)


def bias_of(b, e: int, dtype, device="cpu") -> torch.Tensor | float:
    """Expert e's bias row in `dtype` on `device` (0 without a bias)."""
    return 0.0 if b is None else b[e].to(device, dtype)


def fused_moe_ideal(
    x, w13, w2, topk_weights, topk_ids, activation="silu", w13_bias=None, w2_bias=None, expert_map=None
):
    """float64 [T, H] on x's device: the layer without rounding."""
    experts = check_moe_args(x, w13, w2, topk_weights, topk_ids, activation, w13_bias, w2_bias, expert_map)
    act, xd, device = ACTIVATIONS[activation], x.double(), x.device

    def expert_out(e, rows):
        h = act(xd[rows] @ w13[e].to(device, torch.float64).T + bias_of(w13_bias, e, torch.float64, device))
        return h @ w2[e].to(device, torch.float64).T + bias_of(w2_bias, e, torch.float64, device)

    return combine_ideal(topk_weights, topk_ids.to(device), experts, expert_map, x.shape[1], expert_out)


def fused_moe_mirror(
    x, w13, w2, topk_weights, topk_ids, activation="silu", w13_bias=None, w2_bias=None, expert_map=None
):
    """x.dtype [T, H] on x's device: the kernels' roundings (module docstring). On a GPU its fp32 matmuls follow
    torch's TF32 setting, which is off by default (torch.backends.cuda.matmul.allow_tf32)."""
    experts = check_moe_args(x, w13, w2, topk_weights, topk_ids, activation, w13_bias, w2_bias, expert_map)
    act, dtype, xf, device = ACTIVATIONS[activation], x.dtype, x.float(), x.device

    def expert_out(e, rows):
        h = act(xf[rows] @ w13[e].to(device, torch.float32).T + bias_of(w13_bias, e, torch.float32, device))
        return h.to(dtype).float() @ w2[e].to(device, torch.float32).T + bias_of(w2_bias, e, torch.float32, device)

    return combine_mirror(topk_weights, topk_ids.to(device), experts, expert_map, x.shape[1], dtype, expert_out)
