"""The MXFP4 MoE layer's two GEMMs at decode as one GEMV per (token, expert) assignment, in Triton.

At a few assignments every expert the routing touches has about one row, and the grouped GEMM
(`kernels.moe_gemm`) pays for a tensor-core tile of 16 rows, an alignment and its decode per row block. Here
program (column tile, assignment f) takes the assignment's expert straight from topk_ids (through the expert
map) and runs the dense W4A16 GEMV's K loop (`kernels.w4a16_mxfp4_gemm._gemv_rows`: E2M1 codes read as int32
words, decoded in 2 integer ops a weight, fp32 FMAs, each MX block's sum scaled once) on the expert's rows and
the assignment's input row a[f // A_DIV]; no alignment launch. The epilogues are `kernels.moe_gemm`'s, in fp32
on the row sums: bias, then the activation (ACT 1 "silu": gate rows c and up rows N + c; ACT 2 "swiglu_oai":
gate rows 2c and up rows 2c + 1, one tile of interleaved rows split in pairs), or the routing weight
(MUL_WEIGHT, the second GEMM); one rounding to bf16 at the store.
Routing: an id outside [0, E) is dropped (its rows are not written; the layer's per-assignment workspace starts
zeroed, so it adds nothing); an expert the map sends to -1 (another rank's) writes zeros, as the grouped GEMM's
blocks do. Faults: `kernels.moe_gemm.FAULTS` (gate/up swapped, the neighbouring expert, a scale read past the
end), so the layer's negative controls hold on this path too.
Products are exact and sums fp32, in the GEMV's order (not the mirror's): the layer's lossy row bounds both.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._boundary import runs_interpreted
from kernels.moe_gemm import ACTIVATIONS, ALPHA_C, FAULTS, LIMIT_C, MX_FAULT_C
from kernels.w4a16_mxfp4_gemm import SPREAD_MASK, _gemv_rows
from reference.quant.mxfp4 import MX_BLOCK_SIZE

# (BLOCK_N rows a program, GROUPS MX blocks a K tile, warps), with the dense GEMV's one-tile register prefetch.
# H200, gpt-oss-20b's experts (K 2880 = 90 MX blocks), the whole layer as CUDA-graph replays, cold L2
# (`python -m bench.moe.launch_sweep --cases mxfp4_decode`, reports/cuda-h200/launch_sweeps/moe_launch_sweep.csv):
# 32 x 16 / 4 warps 46.0 us at 1 token (0.271x memcpy on the touched bytes) and 123 us at 4 (0.355x); the dense
# GEMV's M = 1 row (16 x 32 / 4 warps) 49.2 / 142 us, 16 x 16 at 2 or 4 warps within 1 %, 8 warps 26-51 %
# slower; the grouped GEMM 128 / 266 us.
GPU_LAUNCH = (32, 16, 4)
INTERPRETER_LAUNCH = (16, 2, 1)  # the interpreter: few programs, short tiles
# The layer takes this path up to this many (token, expert) assignments (the grouped GEMM beyond): gpt-oss at 4
# tokens (16 assignments) runs 123 us here against 266 us grouped; at 16 tokens (64) the grouped GEMM's 290 us
# (0.28x memcpy) was not raced against this path.
MAX_ASSIGNMENTS = 16


@triton.jit
def _biased_rows(
    x_row, codes, scales, bias, rows, rmask, n_blocks, codes_row_stride, scales_row_stride, spread_mask,
    HAS_BIAS: tl.constexpr, GROUPS: tl.constexpr, EVEN_K: tl.constexpr, FAULT: tl.constexpr,
):  # fmt: skip
    """fp32 [len(rows)]: the expert's `rows` times the x row over all of K (`_gemv_rows`, with its prefetch),
    plus the rows' bias (`bias`: the expert's bias row) where the layer has one."""
    y = _gemv_rows(
        x_row, codes, scales, rows, rmask, 0, tl.cdiv(n_blocks, GROUPS), n_blocks, codes_row_stride,
        scales_row_stride, spread_mask, GROUPS, True, EVEN_K, FAULT, False,
    )  # fmt: skip
    if HAS_BIAS:
        y += tl.load(bias + rows, mask=rmask, other=0.0).to(tl.float32)
    return y


@triton.jit
def _mx_moe_gemv_kernel(
    x_ptr, codes_ptr, scales_ptr, bias_ptr, out_ptr, ids_ptr, map_ptr, weights_ptr,
    N, E, LOCAL, A_DIV, n_blocks, x_row_stride, codes_e_stride, codes_row_stride, scales_e_stride, scales_row_stride,
    bias_e_stride, out_row_stride, spread_mask,
    ACT: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_MAP: tl.constexpr, MUL_WEIGHT: tl.constexpr,
    BLOCK_N: tl.constexpr, GROUPS: tl.constexpr, EVEN_K: tl.constexpr, FAULT: tl.constexpr,
):  # fmt: skip
    pid_n, f = tl.program_id(0), tl.program_id(1)
    OUT_N: tl.constexpr = BLOCK_N // 2 if ACT == 2 else BLOCK_N  # output columns a program writes
    cols = pid_n * OUT_N + tl.arange(0, OUT_N)
    cmask = cols < N
    out = out_ptr + f.to(tl.int64) * out_row_stride + cols
    e = tl.load(ids_ptr + f).to(tl.int32)
    if (e < 0) | (e >= E):  # dropped: nothing written
        return
    if HAS_MAP:
        e = tl.load(map_ptr + e)
        if e < 0:  # another rank's expert: zeros, so the ranks' partial outputs sum to the whole
            tl.store(out, tl.zeros([OUT_N], tl.float32).to(out_ptr.dtype.element_ty), mask=cmask)
            return
    if FAULT == 2:
        e = tl.minimum(e + 1, LOCAL - 1)
    mx_fault = MX_FAULT_C if FAULT == 4 else 0  # the GEMV's "scale_past_end"
    e = e.to(tl.int64)
    x_row = x_ptr + (f // A_DIV).to(tl.int64) * x_row_stride
    codes = codes_ptr + e * codes_e_stride
    scales = scales_ptr + e * scales_e_stride
    bias = bias_ptr + e * bias_e_stride
    strides = (n_blocks, codes_row_stride, scales_row_stride, spread_mask)
    if ACT == 2:  # gate rows 2c, up rows 2c + 1: one tile of BLOCK_N interleaved rows
        rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        rmask = rows < 2 * N
        rows = tl.where(rmask, rows, 0).to(tl.int64)
        y = _biased_rows(x_row, codes, scales, bias, rows, rmask, *strides, HAS_BIAS, GROUPS, EVEN_K, mx_fault)
        gate, up = tl.split(tl.reshape(y, [OUT_N, 2]))
        if FAULT == 1:
            gate, up = up, gate
        gate = tl.minimum(gate, LIMIT_C)
        up = tl.minimum(tl.maximum(up, -LIMIT_C), LIMIT_C)
        acc = (up + 1.0) * gate * tl.sigmoid(ALPHA_C * gate)
    else:
        n = tl.where(cmask, cols, 0).to(tl.int64)
        gate_n, up_n = n, N + n
        if FAULT == 1:
            if ACT == 1:
                gate_n, up_n = up_n, gate_n
        acc = _biased_rows(x_row, codes, scales, bias, gate_n, cmask, *strides, HAS_BIAS, GROUPS, EVEN_K, mx_fault)
        if ACT == 1:
            up = _biased_rows(x_row, codes, scales, bias, up_n, cmask, *strides, HAS_BIAS, GROUPS, EVEN_K, mx_fault)
            acc = acc * tl.sigmoid(acc) * up
    if MUL_WEIGHT:
        acc = acc * tl.load(weights_ptr + f).to(tl.float32)
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=cmask)


def takes(assignments: int) -> bool:
    """Whether the MXFP4 layer runs its GEMMs here (a few assignments) rather than as grouped GEMMs."""
    return assignments <= MAX_ASSIGNMENTS


def launch_mx_moe_gemv(
    a, codes, scales, bias, out, topk_ids, expert_map, weights, a_div: int, activation: str, mul_weight: bool,
    fault: str = "none",
):  # fmt: skip
    """out[f] = epilogue(a[f // a_div] @ W[expert of f]^T) for every assignment f of topk_ids (flattened), W the
    MXFP4 codes [E, N_w, K / 2] with E8M0 scales [E, N_w, K / 32] (both contiguous in K), a bf16 [rows, K]; out
    [T * k, N] (N = N_w / 2 with an activation). The arguments are the layer's, validated by it."""
    n_assign, n = out.shape
    k = a.shape[1]
    if not n_assign or not n:
        return out
    if k % 8 or a.stride(0) % 2 or codes.stride(1) % 4 or codes.stride(0) % 4:
        raise ValueError(f"a, codes: the GEMV reads int32 words: K must be a multiple of 8, got K = {k}")
    block_n, groups, warps = INTERPRETER_LAUNCH if runs_interpreted(a.device) else GPU_LAUNCH
    n_blocks = k // MX_BLOCK_SIZE
    act = ACTIVATIONS[activation]
    out_n = block_n // 2 if act == 2 else block_n
    words, code_words = a.view(torch.int32), codes.view(torch.int32)
    ids = topk_ids.reshape(-1)
    _mx_moe_gemv_kernel[(triton.cdiv(n, out_n), n_assign)](
        words, code_words, scales, bias if bias is not None else scales, out, ids,
        expert_map if expert_map is not None else ids, weights,
        n, codes.shape[0] if expert_map is None else expert_map.shape[0], codes.shape[0], a_div, n_blocks,
        words.stride(0),
        code_words.stride(0), code_words.stride(1), scales.stride(0), scales.stride(1),
        bias.stride(0) if bias is not None else 0, out.stride(0), SPREAD_MASK,
        ACT=act, HAS_BIAS=bias is not None, HAS_MAP=expert_map is not None, MUL_WEIGHT=mul_weight,
        BLOCK_N=block_n, GROUPS=groups, EVEN_K=n_blocks % groups == 0, FAULT=FAULTS[fault],
        num_warps=warps, num_stages=1,
    )  # fmt: skip
    return out
