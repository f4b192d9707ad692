"""The MoE layer's combine as one PDL kernel: out[t] = the sum over j < k of slots[t * k + j] for the assignments
whose expert id is in [0, E), in fp32, rounded once to the output dtype.

An assignment the alignment dropped (an id outside [0, E), which only a caller's bug makes) is skipped by its id, so
the per-assignment workspace is never zeroed (a launch fewer than zeroing it and summing with torch, the layers'
first form), and the kernel launches with PDL (`kernels._pdl`): its programs are resident while the GEMM or GEMV
before it finishes. Used by every MoE layer: `kernels.fused_moe.run_layer` (bf16, block FP8, MXFP4 on codes and
scales) and `kernels.mxfp4_moe_fragment`."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._pdl import launch_args, wait_then_release

BLOCK = 1024  # output columns a program sums (gpt-oss's hidden 2880: 3 programs a token)


@triton.jit
def _combine_kernel(slots_ptr, ids_ptr, out_ptr, H, E, K: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    t, part = tl.program_id(0), tl.program_id(1)
    cols = part * BLOCK + tl.arange(0, BLOCK)
    mask = cols < H
    wait_then_release(PDL)  # the slots come from the kernel just before, the ids from the router
    acc = tl.zeros([BLOCK], tl.float32)
    for j in tl.static_range(K):
        f = t * K + j
        e = tl.load(ids_ptr + f)
        keep = (e >= 0) & (e < E)
        acc += tl.load(slots_ptr + f.to(tl.int64) * H + cols, mask=mask & keep, other=0.0).to(tl.float32)
    tl.store(out_ptr + t.to(tl.int64) * H + cols, acc.to(out_ptr.dtype.element_ty), mask=mask)


def combine(slots: torch.Tensor, topk_ids: torch.Tensor, experts: int) -> torch.Tensor:
    """[T, H] from the per-assignment rows `slots` [T * k, H] (contiguous) of the layer's `topk_ids` [T, k] (global
    ids; `experts` of them). The arguments are the layer's, validated by it."""
    tokens, top_k = topk_ids.shape
    hidden = slots.shape[1]
    out = slots.new_empty(tokens, hidden)
    if tokens and hidden:
        _combine_kernel[(tokens, triton.cdiv(hidden, BLOCK))](
            slots, topk_ids.reshape(-1), out, hidden, experts, K=top_k, BLOCK=BLOCK, num_warps=4,
            **launch_args(slots.device),
        )  # fmt: skip
    return out
