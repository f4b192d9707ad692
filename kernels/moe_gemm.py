"""The grouped GEMM of a MoE layer over sorted assignments (`kernels.moe_align`'s layout), in Triton: bf16/fp16
operands, block-FP8 W8A8 (E4M3 operands, 1 x 128 activation-group and 128 x 128 weight-tile scales), or MXFP4
W4A16 (bf16 activations, E2M1 weight codes with an E8M0 scale per 32).

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
One rounding to the output dtype at the store.
Block FP8 (SCALED): each 128-deep K step is a fresh `tl.dot` of the E4M3 tiles, added to the fp32 accumulator
times (activation scale x weight scale), `reference.gemm.block_fp8`'s order (its docstring tells what the
Hopper FP8 dot's own accumulation is). With QUANT_A the input is bf16/fp16 and each program quantizes the
[BM, 128] input tile it loads, one scale a row (a 1 x 128 group), by `kernels._fp8_groups` (the reference
quantizer's arithmetic, bit for bit): the same codes and scales as a separate quantization pass, so the same
output bytes, without writing and re-reading the E4M3 copy (slower, as measured: FUSE_INPUT_QUANT).
MXFP4 (MX): `kernels.w4a16_mxfp4_gemm`'s dot path (`_mx_k_loop`): each K step decodes the weight tile exactly
to bf16 and takes two dots, the even K elements of the input with the codes' low nibbles and the odd ones with
the high nibbles, computed transposed (weights as the MMA's M side).

Launch sizes (`choose_tiles`) depend on the rows an expert gets on average, tokens x top_k / experts: decode
(a few rows) streams weights with BM 16 and long K steps; prefill runs BM 128 tiles. Both GEMMs share BM (the
alignment's block size) and pick their own BN / BK / warps / stages.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from kernels._boundary import f32_bits, runs_interpreted
from kernels._fp8_groups import e4m3fn_codes, row_scales
from kernels.w4a16_mxfp4_gemm import _weight_tile, packed_decode
from reference.quant.fp8 import DEFAULT_EPS

ACTIVATIONS = {"none": 0, "silu": 1, "swiglu_oai": 2}
ALPHA, LIMIT = 1.702, 7.0  # gpt-oss's clamped SwiGLU (reference.moe.experts)
ALPHA_C: tl.constexpr = tl.constexpr(ALPHA)
LIMIT_C: tl.constexpr = tl.constexpr(LIMIT)

# Planted bugs for the suite's negative controls; FAULT is a constexpr, so fault 0 compiles them away.
FAULTS = {
    "none": 0,
    "gate_up_swapped": 1,  # the up columns taken as the gate
    "neighbour_expert": 2,  # each block multiplies the next expert's weights (the last its own)
    "weight_scale_next_k_block": 3,  # block FP8: K block kb scaled by the weight scale of kb + 1 (wrapping)
    "mx_scale_past_end": 4,  # MXFP4: block j scaled by block j + 1's scale, read past the end for the last row
    "fused_amax_skips_last_lane": 5,  # QUANT_A: a group's last element never reaches its amax
}
MX_FAULT_C: tl.constexpr = tl.constexpr(3)  # `kernels.w4a16_mxfp4_gemm`'s "scale_past_end", which MX fault 4 plants


@triton.jit
def activate(gate, up, ACT: tl.constexpr):
    """The layer's activation on fp32 sums (bias added): ACT 1 silu(gate) * up, ACT 2 gpt-oss's clamped SwiGLU
    (gate clamped above at LIMIT, up to [-LIMIT, LIMIT], (up + 1) * gate * sigmoid(ALPHA * gate)), ACT 0 gate."""
    if ACT == 1:
        y = gate * tl.sigmoid(gate) * up
    elif ACT == 2:
        gate = tl.minimum(gate, LIMIT_C)
        up = tl.minimum(tl.maximum(up, -LIMIT_C), LIMIT_C)
        y = (up + 1.0) * gate * tl.sigmoid(ALPHA_C * gate)
    else:
        y = gate
    return y


class Tiles(NamedTuple):
    bm: int
    bn: int
    bk: int
    warps: int
    stages: int
    group_m: int = 1 << 16  # row blocks a program group sweeps before the next columns (default: all of them)


# (most rows per expert, first GEMM's tiles, second GEMM's tiles): the first row whose bound is not below the
# average rows per expert applies. The fastest of 4-7 candidates per GEMM in a sweep on the H200 (each GEMM
# alone as a CUDA-graph replay, cold L2; Mixtral-8x7B and Qwen3-30B-A3B shapes, 1-4,096 tokens):
# - <= 2 rows (decode): BM 16, long K steps; Mixtral at 1 token: 123 us + 70 us (3.8 and 3.3 TB/s of weights).
# - <= 8: wider N tiles; Mixtral at 16 tokens: 434 + 225 us.
# - <= 32: BM 32; Mixtral at 64 tokens: 440 + 228 us (BM 16: 483 + 250).
# - more: BM 128, the first GEMM's gate and up side by side (an effective BN of 256), 8 warps, 4 stages;
#   Mixtral at 4,096 tokens: 3.77 + 1.88 ms, ~510 TFLOP/s each (BM 64: 4.66 + 2.50 ms). From 64 rows an
#   expert BM 64 and BM 128 tie (within 1 %).
# - over 512 rows: programs in groups of 16 row blocks (L2 reuse of the input rows and weight tiles); the
#   Mixtral layer at 4,096 tokens: 5.74 ms against 5.92 ms in row-block order. Groups did not help at 256
#   rows an expert (Mixtral at 1,024 tokens: 1.77 ms grouped, 1.60 ms not); repeat runs vary by ~3 %.
GPU_TILES = (
    (2, Tiles(16, 32, 256, 4, 4), Tiles(16, 32, 512, 4, 3)),
    (8, Tiles(16, 128, 128, 4, 3), Tiles(16, 128, 128, 4, 4)),
    (32, Tiles(32, 64, 128, 4, 3), Tiles(32, 128, 128, 4, 3)),
    (512, Tiles(128, 128, 64, 8, 4), Tiles(128, 256, 64, 8, 4)),
    (None, Tiles(128, 128, 64, 8, 4, 16), Tiles(128, 256, 64, 8, 4, 16)),
)
INTERPRETER_TILES = Tiles(16, 16, 16, 1, 1, 2)  # a small program group: the suites cover the grouping
SCALE_BLOCK = 128  # block FP8's activation group and weight tile (DeepSeek-V3)


def _fit_k(tiles: Tiles, k: int) -> Tiles:
    """BK at most a quarter of K (rounded up to a power of 2, at least 64): Qwen3-30B-A3B's second GEMM (K 768)
    took 21.2 us with BK 512 and 16.4 us with BK 256 at 1 token on the H200."""
    return tiles._replace(bk=min(tiles.bk, max(64, triton.next_power_of_2(k) // 4)))


def choose_tiles(device: torch.device, assignments: int, experts: int, hidden: int, inter: int) -> tuple[Tiles, Tiles]:
    """(first GEMM's, second GEMM's) launch sizes for `assignments` = tokens x top_k rows over `experts`; the
    first GEMM's K is `hidden`, the second's `inter`."""
    if runs_interpreted(device):
        return INTERPRETER_TILES, INTERPRETER_TILES
    rows = assignments / max(experts, 1)
    first, second = next((f, s) for most, f, s in GPU_TILES if most is None or rows <= most)
    return _fit_k(first, hidden), _fit_k(second, inter)


def fp8_tiles(first: Tiles, second: Tiles) -> tuple[Tiles, Tiles]:
    """Block FP8's launch sizes from the bf16 ones: BK 128 (one scale step), and tiles small enough that the
    per-step partial products fit in registers beside the accumulators. With the bf16 prefill tiles (BN 128 x
    2 accumulators) the DeepSeek-V3-shaped layer ran at 105 TFLOP/s at 4,096 tokens on the H200 (register
    spills). From the sweep on that shape (each GEMM alone, CUDA-graph replays):
    - prefill (bf16 BM >= 64): BM 64, BN 64 then 128, 4 warps, 4 stages: 4.67 + 2.67 ms at 4,096 tokens
      (BM 128, BN 64 / 128, 8 warps: 5.03 + 3.04 ms);
    - decode (BM 16): BN at least 64: 77.6 + 50.5 us at 1 token (BN 32: 82.9 + 65.6 us); at up to 2 rows an
      expert (the bf16 table's BN 32 row) 6 stages: the whole layer at 4 tokens 0.870x memcpy on the touched bytes
      against 0.838x with 4 / 3 (`python -m bench.moe.launch_sweep --cases dsv3_decode`)."""
    if first.bm >= 64:
        return Tiles(64, 64, SCALE_BLOCK, 4, 4, first.group_m), Tiles(64, 128, SCALE_BLOCK, 4, 4, second.group_m)
    if first.bn < 64:
        first, second = first._replace(stages=6), second._replace(stages=6)
    return (
        first._replace(bk=SCALE_BLOCK, bn=min(max(first.bn, 64), 128)),
        second._replace(bk=SCALE_BLOCK, bn=min(max(second.bn, 64), 128)),
    )


# MXFP4's launch sizes: (most rows per expert, first GEMM's (BN, BK, warps, stages), second GEMM's); BM stays the
# bf16 table's. BN is the MMA's M side (the products are computed transposed), so at least 64 for Hopper's wgmma
# with 4 warps. The fastest of 4-7 candidates per GEMM on the H200 (gpt-oss-20b shape, each GEMM alone as a
# CUDA-graph replay): 1 token 74.9 + 47.2 us (BK 128: 106 + 67 us); 16 tokens (2 rows an expert) 226 + 115 us
# (BK 256: 326 + 162 us); 4,096 tokens 2.37 + 1.21 ms (BN 128, BK 128, 8 warps: 2.60 + 1.39 ms).
MX_GPU_TILES = (
    (0.5, (64, 256, 4, 3), (64, 512, 4, 2)),
    (32, (64, 128, 4, 3), (64, 128, 4, 3)),
    (None, (64, 128, 4, 3), (256, 64, 8, 3)),
)


def mx_tiles(device: torch.device, assignments: int, experts: int, first: Tiles, second: Tiles) -> tuple[Tiles, Tiles]:
    """MXFP4's launch sizes from the bf16 ones (same BM): BK a multiple of the 32-element scale block."""
    if runs_interpreted(device):
        return tuple(t._replace(bk=max(32, t.bk // 32 * 32)) for t in (first, second))
    rows = assignments / max(experts, 1)
    one, two = next((f, s) for most, f, s in MX_GPU_TILES if most is None or rows <= most)
    return (
        first._replace(**dict(zip(("bn", "bk", "warps", "stages"), one, strict=True))),
        second._replace(**dict(zip(("bn", "bk", "warps", "stages"), two, strict=True))),
    )


@triton.jit
def _mx_k_loop(
    a_ptr, w_base, ws_base, a_rows, valid, gate_rows, up_rows, cmask, K, stride_am, stride_wn, stride_wsn,
    ACT: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, EVEN_K: tl.constexpr,
    FAULT: tl.constexpr, PACKED: tl.constexpr,
):  # fmt: skip
    """MXFP4's K loop: (gate, up) accumulators [BM, BN]. `kernels.w4a16_mxfp4_gemm`'s dot path: the input read
    as int32 words of bf16 pairs (a_ptr, stride_am in words), whose even elements meet the codes' low nibbles and
    odd ones the high nibbles; weight tiles [BN, BK / 2] decoded exactly to bf16 by its `_packed_weights` on
    sm_90+ (the codes read as byte pairs: w_base and stride_wn in pairs) or `_tile_weights` (16 code bytes and one
    scale a row and 32-block, contiguous loads); the products computed transposed, W tile @ x^T, so BN is the
    MMA's M and a decode block of 16 rows costs no more MMA rows than BN.

    The dense GEMM's blocked decode (`_blocked_weights`: whole block rows a thread, one dot a K tile) was tried
    here and is slower at these tiles (H200, gpt-oss-20b shape, the MoE bench): decode 0.10x / 0.16x / 0.18x
    memcpy at 4 / 16 / 64 tokens against 0.16x / 0.27x / 0.28x with this decode, prefill 156 against 251
    TFLOP/s at 4,096 tokens."""
    HALF: tl.constexpr = BK // 2  # words (element pairs) per K tile
    GROUPS: tl.constexpr = BK // 32  # MX blocks per K tile
    word = tl.arange(0, HALF)
    n_blocks = K // 32
    gate_n = tl.where(cmask, gate_rows, 0).to(tl.int64)
    up_n = tl.where(cmask, up_rows, 0).to(tl.int64)
    mx_fault = MX_FAULT_C if FAULT == 4 else 0
    acc_t = tl.zeros([BN, BM], tl.float32)
    acc_up_t = tl.zeros([BN, BM], tl.float32)
    for tile in range(0, tl.cdiv(K, BK)):
        block = tile * GROUPS + tl.arange(0, GROUPS)
        x_offsets = a_rows[None, :] * stride_am + (tile * HALF + word)[:, None]  # x^T words [HALF, BM]
        in_k = (tile * HALF + word) < K // 2
        words = tl.load(a_ptr + x_offsets, mask=in_k[:, None] & valid[None, :], other=0).to(tl.uint32, bitcast=True)
        even = (words & 0xFFFF).to(tl.uint16).to(tl.bfloat16, bitcast=True)
        odd = (words >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
        low, high = _weight_tile(
            w_base, ws_base, gate_n, cmask, block, stride_wn, stride_wsn, n_blocks, EVEN_K, mx_fault, PACKED
        )
        acc_t = tl.dot(tl.reshape(low, [BN, HALF]).to(tl.bfloat16), even, acc_t)  # exact: bf16 values
        acc_t = tl.dot(tl.reshape(high, [BN, HALF]).to(tl.bfloat16), odd, acc_t)
        if ACT != 0:
            low, high = _weight_tile(
                w_base, ws_base, up_n, cmask, block, stride_wn, stride_wsn, n_blocks, EVEN_K, mx_fault, PACKED
            )
            acc_up_t = tl.dot(tl.reshape(low, [BN, HALF]).to(tl.bfloat16), even, acc_up_t)
            acc_up_t = tl.dot(tl.reshape(high, [BN, HALF]).to(tl.bfloat16), odd, acc_up_t)
    return tl.trans(acc_t), tl.trans(acc_up_t)


@triton.jit
def _quantized_tile(a, eps_bits, FAULT: tl.constexpr):
    """An input tile [BM, 128] (bf16/fp16) -> (its E4M3 codes, one fp32 scale a row): `reference.quant.fp8`'s
    per-token-group quantization of each row's 128-wide group (pad rows load 0 and are never stored)."""
    x = a.to(tl.float32)
    seen = x
    if FAULT == 5:  # "fused_amax_skips_last_lane"
        seen = tl.where((tl.arange(0, x.shape[1]) < x.shape[1] - 1)[None, :], x, 0.0)
    scale = row_scales(seen, eps_bits)
    return e4m3fn_codes(x, scale), scale


@triton.jit
def _moe_gemm_kernel(
    a_ptr, w_ptr, bias_ptr, out_ptr, sorted_ptr, expert_ids_ptr, post_ptr, weights_ptr,
    n_assign, N, K, A_DIV, num_experts, stride_am, stride_we, stride_wn, stride_be, stride_om,
    as_ptr, ws_ptr, stride_asm, stride_wse, stride_wsn, w_desc, eps_bits,
    ACT: tl.constexpr, HAS_BIAS: tl.constexpr, MUL_WEIGHT: tl.constexpr, SCALED: tl.constexpr, MX: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr, EVEN_K: tl.constexpr,
    FAULT: tl.constexpr, MX_PACKED: tl.constexpr = False, W_TMA: tl.constexpr = False, QUANT_A: tl.constexpr = False,
):  # fmt: skip
    # Program order: GROUP_M row blocks x every column tile, row blocks fastest, then the next GROUP_M row
    # blocks; programs running together share the blocks' input rows and the column tiles' weights in L2.
    pid, tiles_n = tl.program_id(0), tl.cdiv(N, BN)
    width = GROUP_M * tiles_n
    first_m = pid // width * GROUP_M
    size_m = tl.minimum(tl.num_programs(0) // tiles_n - first_m, GROUP_M)
    pid_m, pid_n = first_m + pid % width % size_m, pid % width // size_m
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
    # W_TMA: rows of the weights viewed as [E * N_w, K] (N_w = 2N with an activation), gate first
    gate_row0, up_row0 = e * stride_we // stride_wn + pid_n * BN, e * stride_we // stride_wn + N + pid_n * BN
    if FAULT == 1:
        if ACT != 0:
            gate_row0, up_row0 = up_row0, gate_row0
    w_base = w_ptr + e * stride_we
    ws_base = ws_ptr + e * stride_wse
    acc = tl.zeros([BM, BN], tl.float32)
    acc_up = tl.zeros([BM, BN], tl.float32)
    if MX:
        acc, acc_up = _mx_k_loop(
            a_ptr, w_base, ws_base, a_rows, valid, gate_rows, up_rows, cmask, K, stride_am, stride_wn, stride_wsn,
            ACT, BM, BN, BK, EVEN_K, FAULT, MX_PACKED,
        )  # fmt: skip
    else:
        for k0 in range(0, K, BK):
            kk = k0 + tl.arange(0, BK)
            kmask = kk < K
            a = tl.load(
                a_ptr + a_rows[:, None] * stride_am + kk[None, :], mask=valid[:, None] & kmask[None, :], other=0.0
            )
            wmask = kmask[:, None] & cmask[None, :]
            if W_TMA:
                w = w_desc.load([gate_row0.to(tl.int32), k0]).T
            else:
                w = tl.load(w_base + gate_rows[None, :].to(tl.int64) * stride_wn + kk[:, None], mask=wmask, other=0.0)
            if SCALED:  # block FP8: BK = 128, one activation scale per row and one weight scale per 128 rows
                kb = k0 // BK
                kb_w = kb
                if FAULT == 3:
                    kb_w = (kb + 1) % tl.cdiv(K, BK)
                if QUANT_A:
                    a, a_s = _quantized_tile(a, eps_bits, FAULT)
                else:
                    a_s = tl.load(as_ptr + a_rows * stride_asm + kb, mask=valid, other=0.0)
                w_s = tl.load(ws_base + (gate_rows // BK) * stride_wsn + kb_w, mask=cmask, other=0.0)
                acc += tl.dot(a, w) * (a_s[:, None] * w_s[None, :])
            else:
                acc = tl.dot(a, w, acc)
            if ACT != 0:
                if W_TMA:
                    wu = w_desc.load([up_row0.to(tl.int32), k0]).T
                else:
                    wu = tl.load(
                        w_base + up_rows[None, :].to(tl.int64) * stride_wn + kk[:, None], mask=wmask, other=0.0
                    )
                if SCALED:
                    w_s = tl.load(ws_base + (up_rows // BK) * stride_wsn + kb_w, mask=cmask, other=0.0)
                    acc_up += tl.dot(a, wu) * (a_s[:, None] * w_s[None, :])
                else:
                    acc_up = tl.dot(a, wu, acc_up)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + e * stride_be + gate_rows, mask=cmask, other=0.0).to(tl.float32)[None, :]
        if ACT != 0:
            acc_up += tl.load(bias_ptr + e * stride_be + up_rows, mask=cmask, other=0.0).to(tl.float32)[None, :]
    acc = activate(acc, acc_up, ACT)
    if MUL_WEIGHT:
        acc = acc * tl.load(weights_ptr + f, mask=valid, other=0.0).to(tl.float32)[:, None]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=omask)


# H200, gpt-oss-20b's experts (E 32, top 4, 2880 x 2880), the whole MoE layer as CUDA-graph replays, cold L2:
# 1 token (4 assignments) takes 151 us with the packed decode and 134 us with the fp32 one; 2 tokens (8) 177
# against 225 us, 4 tokens 274 against 326 us (the outputs are equal in every case). Top-8 models at 1 token
# (8 assignments) are not measured and keep the packed decode.
FP32_DECODE_MAX_ASSIGNMENTS = 4


# Whether the block-FP8 layer's grouped GEMMs quantize their inputs as they load them (QUANT_A) unless told
# otherwise, rather than after a separate pass (`kernels.fp8_quant`) writes an E4M3 copy. Raced on an H100 (`python
# -m bench.moe.launch_sweep --cases dsv3_quant`: DeepSeek-V3's experts, the table's tiles, CUDA-graph replays, at
# abdc78a): fused ran at 0.93x / 0.97x / 0.97x / 0.97x the separate pass's speed at 4 / 16 / 64 / 256 tokens (BM
# 16), 0.70x at 1,024 (BM 32) and 0.37x at 4,096 (BM 64). Every program repeats the quantization of each input
# tile it reads, once per column tile (and in the first GEMM top_k times a token): a reduction across the row and
# two IEEE divisions each K step, which cost more than the pass they save. So the layer quantizes in a pass of its
# own; QUANT_A stays for the race and its bit-for-bit test.
FUSE_INPUT_QUANT = False


def weights_through_tma(w: torch.Tensor, tiles: Tiles, activation: str, mx: bool) -> bool:
    """Whether the bf16 / block-FP8 weight tiles are read through a TMA descriptor over w viewed as [E * N_w, K]:
    prefill tiles (BM >= 64) on Hopper and later (and in the interpreter, which runs descriptors, whatever the
    tiles), w contiguous with 16-byte aligned rows, a tile row of at most 128 bytes (BK 64 in bf16, 128 in E4M3:
    the widest TMA swizzle), and gate and up as row ranges (not gpt-oss's interleaved rows). Rows past an
    expert's N read the next rows of the view (or TMA's zero fill past the last): their columns are masked at
    the store. H200, the whole layer as CUDA-graph replays (bench/moe/launch_sweep.py): Mixtral-8x7B shape at
    4,096 tokens 5.27-5.40 against 5.62-5.65 ms with pointer loads (the `torch._grouped_mm` layer: 5.63), at
    1,024 tokens 1.63 against 1.76 ms, equal outputs; at decode (BM 16) TMA was the slower, DeepSeek-V3's block-
    FP8 experts at 1 / 4 tokens 0.129 / 0.363 against 0.124 / 0.343 ms, so decode tiles keep pointer loads."""
    if mx or activation == "swiglu_oai" or not w.is_contiguous() or tiles.bk * w.element_size() > 128:
        return False
    if (w.shape[2] * w.element_size()) % 16 or w.data_ptr() % 16:
        return False
    if runs_interpreted(w.device):
        return True
    return tiles.bm >= 64 and torch.cuda.get_device_capability(w.device)[0] >= 9


def launch_moe_gemm(
    a, w, bias, out, sorted_ids, expert_ids, post, weights, a_div: int, activation: str, mul_weight: bool,
    tiles: Tiles, fault: str = "none", a_scales=None, w_scales=None, mx: bool = False, quantize_a: bool = False,
):  # fmt: skip
    """out[f] = epilogue(a[f // a_div] @ w[expert]^T) for every sorted assignment f (the module docstring).
    a [rows, K], w [E, N_w, K] contiguous in K, out [T * k, N] (N = N_w / 2 with an activation); `tiles.bm` must
    be the alignment's block size. Block FP8: a and w E4M3, a_scales [rows, K / 128] and w_scales [E, ceil(N_w /
    128), K / 128] fp32, contiguous in K, and tiles.bk = 128; or (`quantize_a`) a bf16/fp16, quantized per
    1 x 128 group as the kernel loads it, and no a_scales. MXFP4 (`mx`): w uint8 codes [E, N_w, K / 2], w_scales
    E8M0 bytes [E, N_w, K / 32], contiguous in K; a bf16; tiles.bk a multiple of 32."""
    n_assign, n = out.shape
    k = a.shape[1]
    bm, bn, bk, warps, stages, group_m = tiles
    scaled = a_scales is not None or quantize_a
    if quantize_a and (a_scales is not None or w_scales is None or a.dtype not in (torch.bfloat16, torch.float16)):
        raise ValueError(
            f"a: quantized in the kernel needs a bf16/fp16 input, weight scales and no a_scales, got a {a.dtype}, "
            f"a_scales {'none' if a_scales is None else 'given'}, w_scales {'none' if w_scales is None else 'given'}"
        )
    if mx and (bk % 32 or w_scales.stride(2) != 1 or a.dtype != torch.bfloat16 or k % 32 or a.stride(0) % 2):
        raise ValueError(
            f"tiles: MXFP4 needs a bf16 input with K and its row stride multiples of 32 and 2, BK a multiple of 32"
            f" and scales contiguous, got K = {k}, BK = {bk}"
        )
    if scaled and (bk != SCALE_BLOCK or (a_scales is not None and a_scales.stride(1) != 1) or w_scales.stride(2) != 1):
        raise ValueError(f"tiles: block FP8 needs BK = {SCALE_BLOCK} and scales contiguous in K, got BK = {bk}")
    if not expert_ids.numel() or not n:
        return out
    grid = (expert_ids.numel() * triton.cdiv(n, bn),)
    a_arg, stride_am = (a.view(torch.int32), a.stride(0) // 2) if mx else (a, a.stride(0))  # MX: bf16 pairs
    # MX on sm_90+: the codes are read as byte pairs by the packed decode (strides in pairs; K / 2 is even),
    # except for a handful of (token, expert) assignments, where each program has one row and the fp32 decode's
    # shorter dependency chain wins (both give the same bytes).
    packed = mx and packed_decode(a.device) and n_assign > FP32_DECODE_MAX_ASSIGNMENTS
    w_arg = w.view(torch.int16) if packed else w
    w_tma = weights_through_tma(w, tiles, activation, mx)
    w_desc = TensorDescriptor(w.view(-1, k), [w.shape[0] * w.shape[1], k], [k, 1], [bn, bk]) if w_tma else None
    _moe_gemm_kernel[grid](
        a_arg, w_arg, bias if bias is not None else w, out, sorted_ids, expert_ids, post, weights,
        n_assign, n, k, a_div, w.shape[0], stride_am, w_arg.stride(0), w_arg.stride(1),
        bias.stride(0) if bias is not None else 0, out.stride(0),
        a_scales if a_scales is not None else weights, w_scales if w_scales is not None else weights,
        a_scales.stride(0) if a_scales is not None else 0,
        *(w_scales.stride()[:2] if w_scales is not None else (0, 0)), w_desc, f32_bits(DEFAULT_EPS),
        ACT=ACTIVATIONS[activation], HAS_BIAS=bias is not None, MUL_WEIGHT=mul_weight, SCALED=scaled, MX=mx,
        BM=bm, BN=bn, BK=bk, GROUP_M=group_m, EVEN_K=k % bk == 0, FAULT=FAULTS[fault], MX_PACKED=packed,
        W_TMA=w_tma, QUANT_A=quantize_a, num_warps=warps, num_stages=stages,
    )  # fmt: skip
    return out
