"""The grouped GEMM of a MoE layer over sorted assignments (`kernels.moe_align`'s layout), bf16/fp16, in Triton.

One program computes a [BM, BN] tile: BM consecutive rows of `sorted_token_ids` (one block: one expert) by BN
output columns. Row r holds flat assignment f (token f // top_k, slot f % top_k); its input row is
a[f // A_DIV] (A_DIV = top_k: the hidden states, read in place; 1: the first GEMM's per-assignment output),
and its output row is out[f]. Pad rows (f = T * k) are neither read nor written; a block whose expert is -1
(another rank's) writes zeros to its rows, so the ranks' outputs sum to the whole. Programs past
num_tokens_post_padded return at once: the grid is sized by the most blocks any routing needs, so no host
sync decides it.

Epilogues, in fp32 on the accumulator (the mirror's order, `reference.moe.experts`):
- ACT 1 "silu": the program accumulates the gate columns c and the up columns I + c of w13 at once and writes
  silu(gate) * up; ACT 2 "swiglu_oai": gate rows 2c, up rows 2c + 1, clamped, (up + 1) * gate *
  sigmoid(1.702 gate); ACT 0: the plain product (the second GEMM).
- bias (gpt-oss) added before the activation, or before the routing weight;
- MUL_WEIGHT: times the assignment's routing weight (the second GEMM).
One rounding to the output dtype at the store. Launch sizes are not tuned (no GPU measurement yet).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._boundary import runs_interpreted

ACTIVATIONS = {"none": 0, "silu": 1, "swiglu_oai": 2}
ALPHA, LIMIT = 1.702, 7.0  # gpt-oss's clamped SwiGLU (reference.moe.experts)
ALPHA_C: tl.constexpr = tl.constexpr(ALPHA)
LIMIT_C: tl.constexpr = tl.constexpr(LIMIT)

# Planted bugs for the suite's negative controls; FAULT is a constexpr, so fault 0 compiles them away.
FAULTS = {
    "none": 0,
    "gate_up_swapped": 1,  # the up columns taken as the gate
    "neighbour_expert": 2,  # each block multiplies the next expert's weights (the last its own)
}

GPU_TILES = (64, 64, 32, 4, 3)  # BM, BN, BK, warps, stages: not tuned
INTERPRETER_TILES = (16, 16, 16, 1, 1)


def block_rows(device: torch.device) -> int:
    """BM: the rows of a block, the block size `moe_align_block_size` must pad to."""
    return (INTERPRETER_TILES if runs_interpreted(device) else GPU_TILES)[0]


@triton.jit
def _moe_gemm_kernel(
    a_ptr, w_ptr, bias_ptr, out_ptr, sorted_ptr, expert_ids_ptr, post_ptr, weights_ptr,
    n_assign, N, K, A_DIV, num_experts, stride_am, stride_we, stride_wn, stride_be, stride_om,
    ACT: tl.constexpr, HAS_BIAS: tl.constexpr, MUL_WEIGHT: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, FAULT: tl.constexpr,
):  # fmt: skip
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    if pid_m * BM >= tl.load(post_ptr):
        return
    f = tl.load(sorted_ptr + pid_m * BM + tl.arange(0, BM))
    valid = f < n_assign
    cols = pid_n * BN + tl.arange(0, BN)
    cmask = cols < N
    out_ptrs = out_ptr + f.to(tl.int64)[:, None] * stride_om + cols[None, :]
    omask = valid[:, None] & cmask[None, :]
    e = tl.load(expert_ids_ptr + pid_m).to(tl.int64)
    if e < 0:
        tl.store(out_ptrs, tl.zeros([BM, BN], tl.float32).to(out_ptr.dtype.element_ty), mask=omask)
        return
    if FAULT == 2:
        e = tl.minimum(e + 1, num_experts - 1)
    if ACT == 2:
        gate_rows, up_rows = 2 * cols, 2 * cols + 1
    else:
        gate_rows, up_rows = cols, N + cols
    if FAULT == 1:
        if ACT != 0:
            gate_rows, up_rows = up_rows, gate_rows
    a_rows = (f // A_DIV).to(tl.int64)
    w_base = w_ptr + e * stride_we
    acc = tl.zeros([BM, BN], tl.float32)
    acc_up = tl.zeros([BM, BN], tl.float32)
    for k0 in range(0, K, BK):
        kk = k0 + tl.arange(0, BK)
        kmask = kk < K
        a = tl.load(a_ptr + a_rows[:, None] * stride_am + kk[None, :], mask=valid[:, None] & kmask[None, :], other=0.0)
        wmask = kmask[:, None] & cmask[None, :]
        w = tl.load(w_base + gate_rows[None, :].to(tl.int64) * stride_wn + kk[:, None], mask=wmask, other=0.0)
        acc = tl.dot(a, w, acc)
        if ACT != 0:
            wu = tl.load(w_base + up_rows[None, :].to(tl.int64) * stride_wn + kk[:, None], mask=wmask, other=0.0)
            acc_up = tl.dot(a, wu, acc_up)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + e * stride_be + gate_rows, mask=cmask, other=0.0).to(tl.float32)[None, :]
        if ACT != 0:
            acc_up += tl.load(bias_ptr + e * stride_be + up_rows, mask=cmask, other=0.0).to(tl.float32)[None, :]
    if ACT == 1:
        acc = acc * tl.sigmoid(acc) * acc_up
    elif ACT == 2:
        gate = tl.minimum(acc, LIMIT_C)
        up = tl.minimum(tl.maximum(acc_up, -LIMIT_C), LIMIT_C)
        acc = (up + 1.0) * gate * tl.sigmoid(ALPHA_C * gate)
    if MUL_WEIGHT:
        acc = acc * tl.load(weights_ptr + f, mask=valid, other=0.0).to(tl.float32)[:, None]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=omask)


def launch_moe_gemm(
    a, w, bias, out, sorted_ids, expert_ids, post, weights, a_div: int, activation: str, mul_weight: bool,
    fault: str = "none",
):  # fmt: skip
    """out[f] = epilogue(a[f // a_div] @ w[expert]^T) for every sorted assignment f (the module docstring).
    a [rows, K], w [E, N_w, K] contiguous in K, out [T * k, N] (N = N_w / 2 with an activation)."""
    n_assign, n = out.shape
    k = a.shape[1]
    bm, bn, bk, warps, stages = INTERPRETER_TILES if runs_interpreted(a.device) else GPU_TILES
    grid = (expert_ids.numel(), triton.cdiv(n, bn))
    if not grid[0] or not n:
        return out
    _moe_gemm_kernel[grid](
        a, w, bias if bias is not None else w, out, sorted_ids, expert_ids, post, weights,
        n_assign, n, k, a_div, w.shape[0], a.stride(0), w.stride(0), w.stride(1),
        bias.stride(0) if bias is not None else 0, out.stride(0),
        ACT=ACTIVATIONS[activation], HAS_BIAS=bias is not None, MUL_WEIGHT=mul_weight,
        BM=bm, BN=bn, BK=bk, FAULT=FAULTS[fault], num_warps=warps, num_stages=stages,
    )  # fmt: skip
    return out
