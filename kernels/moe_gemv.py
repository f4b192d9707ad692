"""The quantized MoE layers' two GEMMs at decode as one GEMV per (token, expert) assignment, in Triton.

At a few assignments every expert the routing touches has about one row, and the grouped GEMM
(`kernels.moe_gemm`) pays for a tensor-core tile of 16 rows, an alignment and (MXFP4) its decode per row block.
Here program (column tile, assignment f) takes the assignment's expert straight from topk_ids (through the expert
map) and streams the expert's rows against the assignment's input row a[f // A_DIV]; no alignment launch. Two
modes, one kernel:
- MXFP4 W4A16 (`launch_mx_moe_gemv`): the dense W4A16 GEMV's K loop (`kernels.w4a16_mxfp4_gemm._gemv_rows`: E2M1
  codes read as int32 words, decoded in 2 integer ops a weight, fp32 FMAs, each MX block's sum scaled once).
- Block FP8 W8A8 (`launch_fp8_moe_gemv`): E4M3 weights times the layer's per-token, 128-wide-group E4M3
  activations (products exact), each 128-wide K block summed in fp32 and scaled by a_scale x w_scale of its
  1 x 128 and 128 x 128 tiles before it is added, the mirror's per-block form. On NVIDIA sm_90+ on tensor cores
  straight from the bytes (`kernels._fp8_fragment_rows`, 16 rows a program, the block summed in the MMA's fp32
  accumulator); elsewhere on CUDA cores (`_fp8_rows`: thread tensors, each thread's 16 products summed in fp32).
The epilogues are `kernels.moe_gemm`'s, in fp32 on the row sums: bias, then the activation (ACT 1 "silu": gate
rows c and up rows N + c; ACT 2 "swiglu_oai": gate rows 2c and up rows 2c + 1, one tile of interleaved rows split
in pairs), or the routing weight (MUL_WEIGHT, the second GEMM); one rounding to bf16 at the store.
Routing: an id outside [0, E) is dropped (its rows are not written, and the layer's combine, `kernels.moe_combine`,
skips them by their id, so it adds nothing); an expert the map sends to -1 (another rank's) writes zeros, as the
grouped GEMM's blocks do. Faults: `kernels.moe_gemm.FAULTS` (gate/up swapped, the neighbouring expert, a weight
scale of the next K block, an MX scale read past the end), so the layers' negative controls hold on this path too.
Sums are fp32 in the GEMV's order (not the mirror's): each layer's lossy row bounds both.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._boundary import runs_interpreted
from kernels._fp8_fragment_rows import SCALE_K, fp8_fragment_rows
from kernels._packed_ptx import packed_ptx
from kernels.moe_gemm import ACTIVATIONS, FAULTS, MX_FAULT_C, SCALE_BLOCK, activate
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
# Block FP8 on tensor cores (`kernels._fp8_fragment_rows`, 16 rows a program): (U blocks a turn, warps). H200,
# DeepSeek-V3's experts (E 256, top 8, 7168 x 2048), the whole layer as CUDA-graph replays, cold L2
# (`python -m bench.moe.launch_sweep --cases dsv3_decode`): (2, 4) 115.8 us at 1 token (0.718x memcpy on the
# touched bytes) and 0.829x at 2; (1, 2) 0.723x / 0.787x, (1, 4) 0.689x / 0.848x, 8 warps 0.55-0.69x; the grouped
# GEMM's decode tiles 0.662x / 0.729x (6 stages: 0.677x / 0.795x).
FP8_MMA_LAUNCH = (2, 4)
# Block FP8 on CUDA cores, where the PTX cannot run (`_fp8_rows`): (BLOCK_N rows a program, U 128-wide K blocks a
# tile, warps); 8 threads a row, so BLOCK_N = 4 x warps uses every thread once. The GPU row is not measured (it
# serves GPUs before sm_90 and ROCm, none of which this project's runs have).
FP8_GPU_LAUNCH = (16, 2, 4)
FP8_INTERPRETER_LAUNCH = (4, 1, 1)
# The block-FP8 layer takes this path up to this many assignments: DeepSeek-V3 at 2 tokens (16) 0.829x memcpy here
# against 0.795x for the grouped GEMM's best tiles; at 4 tokens (32) 0.839x against 0.870x.
FP8_MAX_ASSIGNMENTS = 16


@triton.jit
def _fp8_tile_loads(
    a_row, a_scales_row, w, w_scales, row, valid, lane_k, tile, live, n_blocks, stride_wn, stride_wsn,
    U: tl.constexpr, FAULT: tl.constexpr,
):  # fmt: skip
    """K tile `tile` (U blocks of 128; `live` False masks it all), per thread: its row's 16 codes at lane_k of each
    block [T, U, 16], the a row's 16 there [T, U, 16], and each block's a_scale x w_scale [T, U]."""
    block = tile * U + tl.arange(0, U)
    bmask = (block < n_blocks) & live
    k = (block * SCALE_K)[None, :] + lane_k[:, None]  # [T, U]
    sixteen = tl.arange(0, 16)[None, None, :]
    mask = (valid[:, None] & bmask[None, :])[:, :, None]
    codes = tl.load(w + (row[:, None] * stride_wn + k)[:, :, None] + sixteen, mask=mask, other=0.0)
    a = tl.load(a_row + k[:, :, None] + sixteen, mask=bmask[None, :, None], other=0.0)
    a_s = tl.load(a_scales_row + block[None, :] + 0 * lane_k[:, None], mask=bmask[None, :], other=0.0)
    w_block = block
    if FAULT == 3:  # "weight_scale_next_k_block": block kb scaled by kb + 1's weight scale (wrapping)
        w_block = (block + 1) % n_blocks
    w_s = tl.load(
        w_scales + (row // SCALE_K)[:, None] * stride_wsn + w_block[None, :], mask=mask.reshape(a_s.shape), other=0.0
    )  # fmt: skip
    return codes, a, a_s * w_s


@triton.jit
def _fp8_rows(
    a_row, a_scales_row, w, w_scales, first, end, n_blocks, stride_wn, stride_wsn,
    BLOCK_N: tl.constexpr, U: tl.constexpr, FAULT: tl.constexpr,
):  # fmt: skip
    """fp32 [BLOCK_N]: the expert's E4M3 rows first .. first + BLOCK_N - 1 (those below `end`) times the E4M3 a
    row over all of K. Thread tensors: 8 threads share a row, each taking 16 of every 128-wide block's K (one
    16-byte load a block), so every thread's loads, conversions and sums stay in its own registers: per block it
    sums its 16 exact products in fp32 and adds them, scaled by the block's a_scale x w_scale, to its own
    accumulator; a row's 8 accumulators meet once, after the K loop. U blocks a tile, one tile of loads in flight
    ahead of the one summed (register prefetch, as `_gemv_rows`)."""
    LANES: tl.constexpr = SCALE_K // 16
    t = tl.arange(0, BLOCK_N * LANES)
    row = first + t // LANES
    valid = row < end
    row = tl.where(valid, row, 0).to(tl.int64)
    lane_k = (t % LANES) * 16
    acc = tl.zeros([BLOCK_N * LANES], dtype=tl.float32)
    tiles = tl.cdiv(n_blocks, U)
    where = (a_row, a_scales_row, w, w_scales, row, valid, lane_k)
    codes, a, scale = _fp8_tile_loads(*where, 0, True, n_blocks, stride_wn, stride_wsn, U, FAULT)
    for tile in range(0, tiles):
        ahead = _fp8_tile_loads(*where, tile + 1, tile + 1 < tiles, n_blocks, stride_wn, stride_wsn, U, FAULT)
        acc += tl.sum(tl.sum(codes.to(tl.float32) * a.to(tl.float32), axis=2) * scale, axis=1)
        codes, a, scale = ahead
    return tl.sum(tl.reshape(acc, [BLOCK_N, LANES]), axis=1)


@triton.jit
def _rows(
    x_row, a_scales_row, w, w_scales, bias, rows, rmask, first, end, n_blocks, stride_wn, stride_wsn, spread_mask,
    FP8: tl.constexpr, HAS_BIAS: tl.constexpr, GROUPS: tl.constexpr, EVEN_K: tl.constexpr, FAULT: tl.constexpr,
    WARPS: tl.constexpr,
):  # fmt: skip
    """fp32 [len(rows)]: the expert's `rows` (first .. first + len - 1, those below `end`) times the x row over all
    of K in the layer's mode: FP8 2, block FP8 on tensor cores (`kernels._fp8_fragment_rows`, 16 rows, x and the
    weights as int32 words, GROUPS its U); 1, block FP8 on CUDA cores (`_fp8_rows`, GROUPS its U); 0, MXFP4
    (`_gemv_rows` with its prefetch, x as int32 words). Plus the rows' bias (`bias`: the expert's bias row) where
    the layer has one."""
    if FP8 == 2:
        y = fp8_fragment_rows(
            x_row, a_scales_row, w, w_scales, first, end, n_blocks, stride_wn, stride_wsn, WARPS, GROUPS, FAULT
        )
    elif FP8 == 1:
        y = _fp8_rows(
            x_row, a_scales_row, w, w_scales, first, end, n_blocks, stride_wn, stride_wsn, rows.shape[0], GROUPS,
            FAULT,
        )  # fmt: skip
    else:
        y = _gemv_rows(
            x_row, w, w_scales, rows, rmask, 0, tl.cdiv(n_blocks, GROUPS), n_blocks, stride_wn, stride_wsn,
            spread_mask, GROUPS, True, EVEN_K, MX_FAULT_C if FAULT == 4 else 0, False,
        )  # fmt: skip
    if HAS_BIAS:
        y += tl.load(bias + rows, mask=rmask, other=0.0).to(tl.float32)
    return y


@triton.jit
def _moe_gemv_kernel(
    x_ptr, as_ptr, w_ptr, ws_ptr, bias_ptr, out_ptr, ids_ptr, map_ptr, weights_ptr,
    N, E, LOCAL, A_DIV, n_blocks, x_row_stride, stride_asm, stride_we, stride_wn, stride_wse, stride_wsn,
    bias_e_stride, out_row_stride, spread_mask,
    FP8: tl.constexpr, ACT: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_MAP: tl.constexpr, MUL_WEIGHT: tl.constexpr,
    BLOCK_N: tl.constexpr, GROUPS: tl.constexpr, EVEN_K: tl.constexpr, FAULT: tl.constexpr, WARPS: tl.constexpr,
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
    e = e.to(tl.int64)
    row = (f // A_DIV).to(tl.int64)
    x_row = x_ptr + row * x_row_stride
    a_scales_row = as_ptr + row * stride_asm
    w = w_ptr + e * stride_we
    w_scales = ws_ptr + e * stride_wse
    bias = bias_ptr + e * bias_e_stride
    where = (x_row, a_scales_row, w, w_scales, bias)
    strides = (n_blocks, stride_wn, stride_wsn, spread_mask)
    if ACT == 2:  # gate rows 2c, up rows 2c + 1: one tile of BLOCK_N interleaved rows
        rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        rmask = rows < 2 * N
        rows = tl.where(rmask, rows, 0).to(tl.int64)
        y = _rows(*where, rows, rmask, pid_n * BLOCK_N, 2 * N, *strides, FP8, HAS_BIAS, GROUPS, EVEN_K, FAULT, WARPS)
        gate, up = tl.split(tl.reshape(y, [OUT_N, 2]))
        if FAULT == 1:
            gate, up = up, gate
        acc = activate(gate, up, 2)
    else:
        n = tl.where(cmask, cols, 0).to(tl.int64)
        gate_n, up_n = n, N + n
        gate_0, up_0 = pid_n * OUT_N, N + pid_n * OUT_N  # the same rows as (first, end) pairs
        gate_end, up_end = N, 2 * N
        if FAULT == 1:
            if ACT == 1:
                gate_n, up_n = up_n, gate_n
                gate_0, up_0, gate_end, up_end = up_0, gate_0, up_end, gate_end
        acc = _rows(*where, gate_n, cmask, gate_0, gate_end, *strides, FP8, HAS_BIAS, GROUPS, EVEN_K, FAULT, WARPS)
        if ACT == 1:
            up = _rows(*where, up_n, cmask, up_0, up_end, *strides, FP8, HAS_BIAS, GROUPS, EVEN_K, FAULT, WARPS)
            acc = activate(acc, up, 1)
    if MUL_WEIGHT:
        acc = acc * tl.load(weights_ptr + f).to(tl.float32)
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=cmask)


def takes(assignments: int, fp8: bool = False) -> bool:
    """Whether the MXFP4 (or, `fp8`, the block-FP8) layer runs its GEMMs here (a few assignments) rather than as
    grouped GEMMs."""
    return assignments <= (FP8_MAX_ASSIGNMENTS if fp8 else MAX_ASSIGNMENTS)


def _launch(
    a, a_scales, w, w_scales, bias, out, topk_ids, expert_map, weights, a_div, activation, mul_weight, fault,
    fp8: int, launch: tuple[int, int, int], k: int, strides: tuple, spread_mask: int,
):  # fmt: skip
    n_assign, n = out.shape
    block_n, groups, warps = launch
    n_blocks = k // (SCALE_BLOCK if fp8 else MX_BLOCK_SIZE)
    act = ACTIVATIONS[activation]
    out_n = block_n // 2 if act == 2 else block_n
    ids = topk_ids.reshape(-1)
    _moe_gemv_kernel[(triton.cdiv(n, out_n), n_assign)](
        a, a_scales if a_scales is not None else weights, w, w_scales, bias if bias is not None else w_scales, out,
        ids, expert_map if expert_map is not None else ids, weights,
        n, w.shape[0] if expert_map is None else expert_map.shape[0], w.shape[0], a_div, n_blocks, *strides,
        bias.stride(0) if bias is not None else 0, out.stride(0), spread_mask,
        FP8=fp8, ACT=act, HAS_BIAS=bias is not None, HAS_MAP=expert_map is not None, MUL_WEIGHT=mul_weight,
        BLOCK_N=block_n, GROUPS=groups, EVEN_K=n_blocks % groups == 0, FAULT=FAULTS[fault], WARPS=warps,
        num_warps=warps, num_stages=1,
    )  # fmt: skip
    return out


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
    words, code_words = a.view(torch.int32), codes.view(torch.int32)
    strides = (words.stride(0), 0, code_words.stride(0), code_words.stride(1), scales.stride(0), scales.stride(1))
    launch = INTERPRETER_LAUNCH if runs_interpreted(a.device) else GPU_LAUNCH
    return _launch(
        words, None, code_words, scales, bias, out, topk_ids, expert_map, weights, a_div, activation, mul_weight,
        fault, 0, launch, k, strides, SPREAD_MASK,
    )  # fmt: skip


def launch_fp8_moe_gemv(
    a, a_scales, w, w_scales, out, topk_ids, expert_map, weights, a_div: int, activation: str, mul_weight: bool,
    fault: str = "none",
):  # fmt: skip
    """out[f] = epilogue(a[f // a_div] @ W[expert of f]^T) for every assignment f of topk_ids (flattened): a E4M3
    [rows, K] with fp32 scales [rows, K / 128], W E4M3 [E, N_w, K] with fp32 scales [E, ceil(N_w / 128), K / 128],
    all contiguous in K; out [T * k, N] (N = N_w / 2 with an activation). The arguments are the layer's,
    validated by it (no bias: the block-FP8 layer has none)."""
    n_assign, n = out.shape
    k = a.shape[1]
    if not n_assign or not n:
        return out
    if packed_ptx(a.device):  # tensor cores, the bytes as int32 words (K is a multiple of 128)
        a, w, mode, launch = a.view(torch.int32), w.view(torch.int32), 2, (16, *FP8_MMA_LAUNCH)
        if launch[1] not in (1, 2):
            raise ValueError(f"FP8_MMA_LAUNCH: U (blocks a turn) must be 1 or 2, got {launch[1]}")
    else:
        mode = 1
        launch = FP8_INTERPRETER_LAUNCH if runs_interpreted(a.device) else FP8_GPU_LAUNCH
    strides = (a.stride(0), a_scales.stride(0), w.stride(0), w.stride(1), w_scales.stride(0), w_scales.stride(1))
    return _launch(
        a, a_scales, w, w_scales, None, out, topk_ids, expert_map, weights, a_div, activation, mul_weight, fault,
        mode, launch, k, strides, 0,
    )  # fmt: skip
