"""The MXFP4 MoE layer's two GEMMs at decode on tensor cores: the fragment GEMV's K loop
(`kernels.w4a16_mxfp4_fragment_gemv.fragment_rows`) over the alignment's blocks, on expert weights in the fragment
layout (`kernels.mxfp4_fragment_layout.prepare` of the [E, N, K / 2] codes: expert e's row tile t is tile
e * N / 16 + t of the stack).

Program (row tile t, block b) of `kernels.moe_align`'s output for blocks of 8 * GROUPS slots: the block's expert e
(expert_ids[b], already local through the expert map), its slots' flat assignments f (sorted_token_ids) as the MMA's
x columns (x row f // A_DIV; a sentinel's column reads row 0 and is never stored), and expert e's row tile t. Each
touched expert's weights are then read once for all the tokens routed to it (up to 8 a column group), where
`kernels.moe_gemv` reads them once an assignment, and on tensor cores, where it decodes and multiplies on CUDA
cores. Blocks past num_tokens_post_padded exit at once: the grid is the alignment's capacity, with no host sync.

Epilogue on the warps' fp32 sums (`warp_sums`: lane 4 g + c holds rows g, g + 8 of the tile and x columns 2c,
2c + 1), in `kernels.moe_gemm`'s order: the bias, then ACT 1 "silu" (the program also runs the up rows' tile
t + I / 16 and multiplies), ACT 2 "swiglu_oai" (rows 2i and 2i + 1 of a tile are a gate and up pair: the lanes of
rows g and g + 1 meet through a reshape), or the routing weight (MUL_WEIGHT); one rounding to bf16 into row f of
the per-assignment output. A block of expert -1 (another rank's) writes zeros for its slots.
Faults, `kernels.moe_gemm.FAULTS`' names and codes: 1 gate and up swapped, 2 the neighbouring expert's weights,
4 every step scaled by the next step's scale pairs (the last step of the last expert's last tile reads one step
past the end of the pairs).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._pdl import launch_args, pdl, wait_then_release
from kernels._tiles import mma_lanes
from kernels.moe_gemm import activate
from kernels.w4a16_mxfp4_fragment_gemv import fragment_rows, warp_sums

STEP_PAIRS: tl.constexpr = tl.constexpr(16)  # int32 scale pairs a step of a row tile holds (8 g x 2 blocks)
# ACT 1 ("silu"): a program walks K once for its gate tile and its up tile together (fragment_rows' TILES = 2, each
# turn's x pairs read once), not twice, one tile after the other. H100, the first GEMV alone on gpt-oss-20b's
# experts as silu's gate-then-up rows, CUDA-graph replays with a cold L2 (`python -m bench.moe.launch_sweep --cases
# mxfp4_fragment_gemvs` at ab8938d, reports/cuda-h100-80gb-hbm3/launch_sweeps/moe_launch_sweep.csv), at the table's
# configs: 1 token 23.0 us against 25.5 apart, 4 tokens 59.1 against 62.8, 16 95.7 against 104.6, 64 134.4 against
# 147.2 (6-11 % faster); the best config of each way 22.3 / 54.9 / 94.7 / 131.4 against 22.8 / 57.4 / 101.5 / 147.2.
UP_TOGETHER = True


@triton.jit
def _finish(
    gate, up, gate_row, up_row, out_col, f, bias_row, out_ptr, weights_ptr, n_assign, out_row_stride,
    ACT: tl.constexpr, HAS_BIAS: tl.constexpr, MUL_WEIGHT: tl.constexpr, FAULT: tl.constexpr,
):  # fmt: skip
    """fp32 row sums (any shape) -> bias, activation or routing weight, one rounding, stored at out[f, out_col]
    where f is an assignment (not the sentinel). `up` and `up_row` are unused without an activation."""
    valid = f < n_assign
    if HAS_BIAS:
        gate += tl.load(bias_row + gate_row).to(tl.float32)
        if ACT != 0:
            up += tl.load(bias_row + up_row).to(tl.float32)
    if ACT != 0:
        if FAULT == 1:
            gate, up = up, gate
    y = activate(gate, up, ACT)
    if MUL_WEIGHT:
        y = y * tl.load(weights_ptr + f, mask=valid, other=0.0)
    tl.store(out_ptr + f.to(tl.int64) * out_row_stride + out_col, y.to(out_ptr.dtype.element_ty), mask=valid)


@triton.jit
def _pairs(r):
    """[32] lane values (lane 4 g + c) -> the values of even rows g and of odd rows g + 1, each [4 (g // 2), 4 (c)]."""
    return tl.split(tl.permute(tl.reshape(r, [4, 2, 4]), (0, 2, 1)))


@triton.jit
def _swiglu_half(
    ra, rb, half, t, first, sorted_ptr, bias_row, out_ptr, weights_ptr, n_assign, out_row_stride,
    ACT: tl.constexpr, HAS_BIAS: tl.constexpr, MUL_WEIGHT: tl.constexpr, FAULT: tl.constexpr,
):  # fmt: skip
    """Rows 8 half .. 8 half + 7 of an interleaved tile (ra: x columns 2c, rb: 2c + 1) -> output columns
    t * 8 + 4 half + i, i < 4, from the gate row 2i and the up row 2i + 1 of those rows."""
    i = tl.arange(0, 4)[:, None]
    c = tl.arange(0, 4)[None, :]
    row = t * 16 + 8 * half + 2 * i
    col = t * 8 + 4 * half + i
    rest = (bias_row, out_ptr, weights_ptr, n_assign, out_row_stride, ACT, HAS_BIAS, MUL_WEIGHT, FAULT)
    gate, up = _pairs(ra)
    _finish(gate, up, row, row + 1, col, tl.load(sorted_ptr + first + 2 * c + 0 * i), *rest)
    gate, up = _pairs(rb)
    _finish(gate, up, row, row + 1, col, tl.load(sorted_ptr + first + 2 * c + 1 + 0 * i), *rest)


@triton.jit
def _group_out(
    acc, up_acc, j, t, slot0, sorted_ptr, bias_row, out_ptr, weights_ptr, n_assign, out_row_stride, up_first,
    ACT: tl.constexpr, HAS_BIAS: tl.constexpr, MUL_WEIGHT: tl.constexpr, FAULT: tl.constexpr, WARPS: tl.constexpr,
):  # fmt: skip
    """Column group j's accumulators (and, ACT 1, the up tile's) -> the group's 8 slots' output rows."""
    r0, r1, r2, r3 = warp_sums(acc[4 * j], acc[4 * j + 1], acc[4 * j + 2], acc[4 * j + 3], WARPS, 1)
    first = slot0 + 8 * j
    rest = (bias_row, out_ptr, weights_ptr, n_assign, out_row_stride, ACT, HAS_BIAS, MUL_WEIGHT, FAULT)
    if ACT == 2:  # 8 output columns a tile: column t * 8 + i from rows 2i (gate) and 2i + 1 (up), i < 8
        _swiglu_half(r0, r1, 0, t, first, sorted_ptr, *rest)  # rows 0..7
        _swiglu_half(r2, r3, 1, t, first, sorted_ptr, *rest)  # rows 8..15
    else:
        lanes = tl.arange(0, 32)
        n = t * 16 + lanes // 4
        f0 = tl.load(sorted_ptr + first + 2 * (lanes % 4))
        f1 = tl.load(sorted_ptr + first + 2 * (lanes % 4) + 1)
        if ACT == 1:
            u0, u1, u2, u3 = warp_sums(up_acc[4 * j], up_acc[4 * j + 1], up_acc[4 * j + 2], up_acc[4 * j + 3], WARPS, 1)
        else:
            u0, u1, u2, u3 = r0, r1, r2, r3
        _finish(r0, u0, n, up_first + n, n, f0, *rest)
        _finish(r1, u1, n, up_first + n, n, f1, *rest)
        _finish(r2, u2, n + 8, up_first + n + 8, n + 8, f0, *rest)
        _finish(r3, u3, n + 8, up_first + n + 8, n + 8, f1, *rest)


@triton.jit
def _moe_fragment_gemv_kernel(
    x_ptr, words_ptr, pairs_ptr, bias_ptr, out_ptr, sorted_ptr, expert_ids_ptr, post_ptr, weights_ptr,
    n_assign, tiles, n_steps, local, A_DIV, x_row_stride, out_row_stride, bias_e_stride, up_first,
    ACT: tl.constexpr, HAS_BIAS: tl.constexpr, MUL_WEIGHT: tl.constexpr, WARPS: tl.constexpr, U: tl.constexpr,
    DEPTH: tl.constexpr, GROUPS: tl.constexpr, FAULT: tl.constexpr, EARLY: tl.constexpr, PDL: tl.constexpr,
    UP_TOGETHER: tl.constexpr,
):  # fmt: skip
    # x_ptr: int32 words (bf16 pairs) [rows, K/2]; program (row tile t of an expert, block b of 8 * GROUPS slots).
    t, b = tl.program_id(0), tl.program_id(1)
    BM: tl.constexpr = 8 * GROUPS
    if not EARLY:
        wait_then_release(PDL)  # the alignment (expert ids, slots) comes from the kernel just before
    # A block past the used ones exits, EARLY without the wait: it writes nothing, and the grid's completion still
    # follows the first GEMV's (any live block's programs wait for it; with none live, that GEMV wrote nothing).
    if b * BM >= tl.load(post_ptr):
        return
    slot0 = b * BM
    e = tl.load(expert_ids_ptr + b)
    if e < 0:  # another rank's expert: zeros, so the ranks' partial outputs sum to the whole
        if EARLY:
            wait_then_release(PDL)  # nothing is written before the wait
        OUT_TILE: tl.constexpr = 8 if ACT == 2 else 16
        f = tl.load(sorted_ptr + slot0 + tl.arange(0, BM))[:, None]
        col = t * OUT_TILE + tl.arange(0, OUT_TILE)[None, :]
        zeros = tl.zeros([BM, OUT_TILE], tl.float32).to(out_ptr.dtype.element_ty)
        tl.store(out_ptr + f.to(tl.int64) * out_row_stride + col, zeros, mask=(f < n_assign) & (col >= 0))
        return
    if FAULT == 2:
        e = tl.minimum(e + 1, local - 1)
    if FAULT == 4:
        pairs_ptr += STEP_PAIRS
    _, _, g, _ = mma_lanes(WARPS)
    f = tl.load(sorted_ptr + slot0 + g)
    x_rows = tl.where(f < n_assign, f // A_DIV, 0)
    x_rows_2 = x_rows
    if GROUPS == 2:
        f = tl.load(sorted_ptr + slot0 + 8 + g)
        x_rows_2 = tl.where(f < n_assign, f // A_DIV, 0)
    tile = e * tiles + t
    where = (x_ptr, words_ptr, pairs_ptr)
    # EARLY: the first turn's weights are requested before the wait for the kernel that writes x (`kernels._pdl`)
    up_tile = tile + up_first // 16  # ACT 1: the up rows' tile, rows I + 16 t .. of the expert
    if ACT == 1 and UP_TOGETHER:  # one K loop for both tiles, each turn's x pairs read once
        acc, up_acc = fragment_rows(
            *where, tile, up_tile, n_steps, x_rows, x_rows_2, x_row_stride, WARPS, U, DEPTH, GROUPS, True, 0, EARLY,
            2, 1,
        )  # fmt: skip
    else:
        acc, _ = fragment_rows(
            *where, tile, tile, n_steps, x_rows, x_rows_2, x_row_stride, WARPS, U, DEPTH, GROUPS, True, 0, EARLY, 1, 1
        )  # fmt: skip
        up_acc = acc
        if ACT == 1:
            up_acc, _ = fragment_rows(
                *where, up_tile, up_tile, n_steps, x_rows, x_rows_2, x_row_stride, WARPS, U, DEPTH, GROUPS, True, 0,
                False, 1, 1,
            )  # fmt: skip
    bias_row = bias_ptr + e.to(tl.int64) * bias_e_stride
    rest = (t, slot0, sorted_ptr, bias_row, out_ptr, weights_ptr, n_assign, out_row_stride, up_first)
    _group_out(acc, up_acc, 0, *rest, ACT, HAS_BIAS, MUL_WEIGHT, FAULT, WARPS)
    if GROUPS == 2:
        _group_out(acc, up_acc, 1, *rest, ACT, HAS_BIAS, MUL_WEIGHT, FAULT, WARPS)


def launch_gemv(
    a, words, pairs, bias, out, alignment, weights, a_div: int, act: int, mul_weight: bool, config: tuple,
    fault: int = 0, early: bool = False, up_together: bool | None = None,
):  # fmt: skip
    """out[f] = epilogue(a[f // a_div] @ W[expert of f]^T) for the aligned assignments f (`alignment`: moe_align's
    (sorted_token_ids, expert_ids, num_tokens_post_padded) for blocks of 8 * GROUPS), W the prepared words and
    pairs [E, N_w / 16, K / 64, ...], a bf16 [rows, K], out [T * k, N] (N = N_w / 2 with an activation); `config`
    (WARPS, U, DEPTH, GROUPS). `early`: the alignment was written before the kernel just before this one (which
    waited for it), so it and the first weights are read before the PDL wait. `up_together`: UP_TOGETHER unless
    given. The arguments are the layer's, validated by it."""
    n_assign, n = out.shape
    sorted_ids, expert_ids, post = alignment
    if not n_assign or not n or not expert_ids.numel():
        return out
    warps, u, depth, groups = config
    tiles, n_steps = words.shape[1], words.shape[2]
    programs = tiles // 2 if act == 1 else tiles  # ACT 1: gate tile t with up tile t + I / 16
    a_words = a.view(torch.int32)
    _moe_fragment_gemv_kernel[(programs, expert_ids.numel())](
        a_words, words, pairs, bias if bias is not None else pairs, out, sorted_ids, expert_ids, post, weights,
        n_assign, tiles, n_steps, words.shape[0], a_div, a_words.stride(0), out.stride(0),
        bias.stride(0) if bias is not None else 0, n if act == 1 else 0,
        ACT=act, HAS_BIAS=bias is not None, MUL_WEIGHT=mul_weight, WARPS=warps, U=u, DEPTH=depth, GROUPS=groups,
        FAULT=fault, EARLY=early and pdl(a.device), UP_TOGETHER=UP_TOGETHER if up_together is None else up_together,
        num_warps=warps, num_stages=1, **launch_args(a.device),
    )  # fmt: skip
    return out
