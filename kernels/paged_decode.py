"""Paged decode in Triton, split-K: the kernel twin of `reference.attention.paged.paged_decode_mirror`, whose
module docstring is the contract (layouts, FP8 caches, precision, edge cases).

Op: `touchstone::paged_decode(q, k_cache, v_cache, block_table, seq_lens, scale, num_splits, k_scale, v_scale)
-> out`; call it through `paged_decode`.

Two launches:
1. `_split_kernel`, grid (B, Hkv, num_splits). A program takes one sequence, one KV head and the group's
   Hq / Hkv query heads together (GQA-packed: the K/V bytes of a head are read once for the whole group;
   the group is padded to 16 rows, tl.dot's smallest M). Its range of whole cache blocks is the reference's
   `split_blocks`, computed from seq_lens on the device (no host sync, no max_seq_len argument). It walks the
   range a tile of TILE_N tokens (TILE_N / block_size blocks, each gathered through the block table) at a time
   with an online softmax in the exp2 domain, p = exp2(s * scale * log2 e - m), and writes the unnormalised
   acc [group, D] and (m, l) in fp32. Keys, values and table entries past the sequence are never loaded
   (masked to 0, scores to -inf). FP8 caches (the constexpr FP8, `_fp8_tiles`): the codes are read as 32-bit
   words of four and converted to fp16 in the load's layout (kernels._e4m3: one cvt per two codes on sm_90),
   and q goes to the tensor cores in fp16 too (a bf16 q scaled by a power of two); each score column is
   multiplied by its K scale; V's scales fold into p, which is rounded to fp16 within the tile's power-of-two
   range. The codes are never dequantized, so neither K nor V costs a rounding of its own. On NVIDIA sm_90+,
   for head 128 and groups up to 8 (`takes_mma`) with splits of at least mma_min_split_tokens, the FP8 split
   kernel is `kernels.paged_decode_fp8_mma` instead: the same grid, outputs and arithmetic, on `mma.sync` fed
   straight from the registers the codes are loaded into.
2. `_combine_kernel`, grid (B, Hq): the mirror's combine with 2^(m_s - M) weights (IEEE division), rounded
   once to q's dtype. With one split (the runner's decode) there is no combine launch: the split kernel ends
   with the same arithmetic, whose weight is then 2^0 = 1 (out = acc / l, 0 where l = 0), so the bits are the
   two-launch path's. Measured on the H200 W1 decode step (batch 256, 30 layers): the combine cost 2.4 us a
   layer, 0.07 ms of a ~6.3 ms step.

A sequence of length 0 (invalid for the reference) gives a 0 output here (no split holds anything).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels import paged_decode_fp8_mma, platform
from kernels._boundary import runs_interpreted
from kernels._e4m3 import e4m3_words_to_fp16, fp16_range
from kernels._packed_ptx import packed_ptx
from kernels._paged import FAULTS, LOG2E, MIN_DOT, check_launch, split_of_program
from kernels._pdl import launch_args, wait_then_release
from reference.attention.paged import check_num_splits, check_paged_args

# GPU launch shapes: tokens per tile of the split kernel (a power of two; raised to the block size when
# smaller), warps and pipeline stages of the split kernel, warps of the combine kernel. H200
# (`python -m bench.attention.paged_decode_launch_sweep`, bf16, block size 16, 32/8 heads of 128): batch 128 x
# 4096, 1 split: 507 us = 0.966x SDPA on contiguous KV, 0.998x memcpy; batch 8 x 32k, 8 splits: 0.970x memcpy.
# Tiles of 32 lose 15-20 %, 8 warps 5-25 %; tiles of 128 are within 3 % at batch 128 and 15 % slower at 8 x 32k;
# stages 2-4 are within 1 %. FP8 caches, same shapes (`--fp8`; GB/s on the codes and scales read): tile 128, 4
# warps, 2 stages: batch 128 x 4096 0.65x memcpy (402 us, against 490-500 us for the bf16 cache), 8 x 32k at 16
# splits 0.58x. Tile 64 ran 0.44x at 4 warps and 0.62x at 2; 8 warps 0.31-0.38x, and 3 stages within 1 % of 2
# (those two on an earlier build of the same loop, with V's codes in bf16). More programs an SM do not help the FP8
# loop (`--fp8 --shapes 128x4096 --configs ...` at 24b1705, reports/cuda-h200/launch_sweeps/
# paged_decode_launch_sweep.csv; two earlier runs within 2 %): tile 128 / 4 warps / 2 stages 396 us (0.66x; 142
# registers and 75 KB of shared memory: 3 programs an SM, 2.6 waves); 1 stage 591 us; 1 stage capped at 128
# registers (4 programs an SM, 1.9 waves) 476 us, at 96 (5, spills) 706 us; tile 64 630 us, capped at 128
# registers 495-532 us, with 2 warps 414 us; 8 warps 839 us, capped at 96 or 128 registers (2 programs of 8 warps
# an SM) 568-590 us; 2 or 3 splits 417 us. In sm_90 SASS (triton.compile for sm_90a, Triton's ptxas) the loop issues
# 1,106 instructions a warp a tile (8.6 a token; the bf16 loop 6.9), about 40 % of the issue slots at 396 us (an
# estimate from the count and the time): the warps wait, on shared memory among others, which each tile's codes
# cross four times (cp.async in, read as words, written back as fp16 for the MMA, read by ldmatrix).
# maxnreg: a cap on registers a thread (None: ptxas's choice), which sets how many programs an SM holds (NVIDIA).
# mma_warps, mma_sub: warps a program and 16-token sub-tiles an iteration of `kernels.paged_decode_fp8_mma`, which
# takes FP8 caches where its PTX runs (`takes_mma`). `--fp8 --mma WARPSxSUB,...` on the H200 at 9428f7f (the generic
# kernel's table row in the same run 395.1 us, 0.665x memcpy): batch 128 x 4096 2 x 1 272.6 us (0.964x), 2 x 2 285.7,
# 4 x 1 288.9, 4 x 2 313.1, 8 x 1 330.7, 1 x 1 331.6; batch 256 2 x 1 0.948x (1 x 1 0.983x, 4 x 1 0.881x, generic
# 0.649x); 8 x 32k 4 x 1 at 8 splits 153.4 us (0.857x), 2 x 1 at 32 splits 172.9, the generic kernel's best 215.9 at
# 32 splits. In sm_90 SASS (triton.compile for sm_90a) its loop issues 605 instructions a warp for 32 tokens (4
# warps, SUB 2; 18.9 a token, all of the KV head's work, against the generic loop's 34.6 over its 4 warps).
# A grid of mma_few_programs programs or fewer takes mma_few_warps: at 8 x 32k with 8 splits (64 programs) 4 warps
# ran 153.4 us against 184.5 with 2 (at 9428f7f), and the report's small batches (1-8 sequences, 64-256 programs)
# ran 2 warps at 0.10-0.37x memcpy, below the generic kernel's 0.12-0.35x.
# mma_min_split_tokens: by default the MMA kernel takes a launch only where a split can hold that many tokens (the
# block table's width in tokens over the splits; below it the generic kernel runs): in the report at 121a441
# (reports/cuda-h200/paged_decode_fp8_ctx4096.md, CUDA-graph replays) it ran 0.90x, 0.76x and 0.93x the generic
# kernel at batch 1, 2 and 4 x 4096 (8 splits of 512 tokens), 1.05x at batch 8 (1,024 tokens a split), 1.21x at
# 16 (2,048) and 1.45x at 128 (4,096).
_GPU = {
    "tile_n": 64, "warps": 4, "stages": 2, "maxnreg": None,
    "fp8_tile_n": 128, "fp8_warps": 4, "fp8_stages": 2, "fp8_maxnreg": None, "combine_warps": 4,
    "mma_warps": 2, "mma_sub": 1, "mma_few_programs": 128, "mma_few_warps": 4, "mma_min_split_tokens": 1024,
}  # fmt: skip
# The interpreter costs per program and per loop step, not per element: one wide tile a step.
_INTERPRETER = {
    "tile_n": 64,
    "warps": 4,
    "stages": 1,
    "fp8_tile_n": 64,
    "fp8_warps": 4,
    "fp8_stages": 1,
    "combine_warps": 4,
    "maxnreg": None,
    "fp8_maxnreg": None,
}


# Arguments that change from step to step in a serving loop (how wide the step's block table is, how many splits)
# and carry no alignment the kernel uses: not specialized, so a new value (== 1, % 16 == 0, other) never
# recompiles inside a timed run. The q/cache strides stay specialized (their % 16 lets loads vectorize).
_PER_STEP = ("num_splits", "table_stride")


@triton.jit
def _kv_tile(ptr, rows, valid, HEAD: tl.constexpr, HEAD_PAD: tl.constexpr, FP8: tl.constexpr, PTX: tl.constexpr):
    """A K or V tile [TILE_N, HEAD_PAD], 0 in rows not `valid` and columns past HEAD: the cache's dtype, or for
    an FP8 cache its codes in fp16. `rows`: each token's offset in the cache, in elements; for FP8 caches in
    32-bit words of four codes, read whole and decoded before the tile changes layout (`e4m3_words_to_fp16`)."""
    if FP8:
        w = tl.arange(0, HEAD_PAD // 4)
        words = tl.load(
            ptr.to(tl.pointer_type(tl.uint32)) + rows[:, None] + w[None, :],
            mask=valid[:, None] & (w < HEAD // 4)[None, :],
            other=0,
        )
        tile = e4m3_words_to_fp16(words, PTX)
    else:
        d = tl.arange(0, HEAD_PAD)
        tile = tl.load(ptr + rows[:, None] + d[None, :], mask=valid[:, None] & (d < HEAD)[None, :], other=0.0)
    return tile


@triton.jit
def _physical(table_row, logical, in_split, FAULT: tl.constexpr):
    """The cache blocks of logical blocks `logical` (int64; 0 outside the split, never used)."""
    if FAULT == 1:
        physical = tl.load(table_row + logical + 1, mask=in_split, other=0)
    else:
        physical = tl.load(table_row + logical, mask=in_split, other=0)
    return physical.to(tl.int64)


@triton.jit
def _fp8_tiles(
    q, k_ptr, v_ptr, ks_ptr, vs_ptr, table_row, first, last, length, kv_head, qk_scale,
    k_block_stride, k_pos_stride, k_head_stride, v_block_stride, v_pos_stride, v_head_stride,
    ks_block_stride, ks_pos_stride, ks_head_stride, vs_block_stride, vs_pos_stride, vs_head_stride,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD: tl.constexpr, HEAD_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, TILE_N: tl.constexpr, PTX: tl.constexpr, FAULT: tl.constexpr,
):  # fmt: skip
    """The split's online softmax over an FP8 cache: (acc [GROUP_PAD, HEAD_PAD], m, l) as the bf16/fp16 loop
    gives them. The codes go to the tensor cores in fp16 (`_kv_tile`), so q does: a bf16 q is scaled by the
    power of two that puts its largest |q| in [2**14, 2**15), undone on the score (exact). (Transposed, tokens
    as the MMA's M, Triton issues Hopper's warpgroup MMA from shared memory with 20 % fewer instructions, but
    the H200 decode at batch 128 x 4096 ran 0.51x memcpy against this orientation's 0.64x.)"""
    q_up = 1.0
    if q.dtype == tl.bfloat16:
        q_down, q_up = fp16_range(tl.max(tl.max(tl.abs(q.to(tl.float32)), axis=1), axis=0))
        q = (q.to(tl.float32) * q_down).to(tl.float16)
    g = tl.arange(0, GROUP_PAD)
    spare = g == GROUP_PAD - 1  # a padding row when GROUP < GROUP_PAD
    n = tl.arange(0, TILE_N)
    in_block = n % BLOCK_SIZE
    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_PAD], tl.float32)
    # The tile walk repeats the bf16 loop's four lines: one helper returning (valid, physical) for both took the
    # bf16 loop from 115 to 149 registers (sm_90 SASS), a CTA fewer per SM.
    for start in range(first, last, TILE_N // BLOCK_SIZE):
        logical = start + n // BLOCK_SIZE
        in_split = logical < last
        valid = in_split & (logical * BLOCK_SIZE + in_block < length)
        physical = _physical(table_row, logical, in_split, FAULT)
        k_sc = tl.load(
            ks_ptr + physical * ks_block_stride + in_block * ks_pos_stride + kv_head * ks_head_stride,
            mask=valid,
            other=0.0,
        )
        v_sc = tl.load(
            vs_ptr + physical * vs_block_stride + in_block * vs_pos_stride + kv_head * vs_head_stride,
            mask=valid,
            other=0.0,
        )
        k_rows = physical * k_block_stride + in_block * k_pos_stride + kv_head * k_head_stride
        k = _kv_tile(k_ptr, k_rows, valid, HEAD, HEAD_PAD, True, PTX)
        # exact fp16 products, fp32 sums; q's power of two back (exact), then K's scale, then the softmax's
        s = tl.dot(q, tl.trans(k)) * q_up * k_sc[None, :] * qk_scale  # [GROUP_PAD, TILE_N]
        s = tl.where(valid[None, :], s, float("-inf"))
        if GROUP < GROUP_PAD:  # the tile's largest V scale rides in the padding row of the max: one reduction
            tile_max = tl.max(tl.where(spare[:, None], v_sc[None, :], s), axis=1)
            v_range = fp16_range(tl.max(tl.where(spare, tile_max, 0.0), axis=0))
        else:
            tile_max = tl.max(s, axis=1)
            v_range = fp16_range(tl.max(v_sc, axis=0))
        m_new = tl.maximum(m_i, tile_max)
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v_rows = physical * v_block_stride + in_block * v_pos_stride + kv_head * v_head_stride
        v = _kv_tile(v_ptr, v_rows, valid, HEAD, HEAD_PAD, True, PTX)
        # V's scale folds into p, rounded to fp16 in the tile's power-of-two range, undone after the MMA
        pv = tl.dot((p * (v_sc * v_range[0])[None, :]).to(tl.float16), v) * v_range[1]
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    return acc, m_i, l_i


@triton.jit(do_not_specialize=_PER_STEP)
def _split_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    table_ptr,
    seq_lens_ptr,
    acc_ptr,
    ml_ptr,
    out_ptr,
    qk_scale,
    num_splits,
    out_seq_stride,
    out_head_stride,
    q_seq_stride,
    q_head_stride,
    k_block_stride,
    k_pos_stride,
    k_head_stride,
    v_block_stride,
    v_pos_stride,
    v_head_stride,
    table_stride,
    ks_ptr,
    vs_ptr,
    ks_block_stride,
    ks_pos_stride,
    ks_head_stride,
    vs_block_stride,
    vs_pos_stride,
    vs_head_stride,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    HEAD: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    TILE_N: tl.constexpr,
    FP8: tl.constexpr,
    PTX: tl.constexpr,
    FAULT: tl.constexpr,
    DIRECT: tl.constexpr,
    PDL: tl.constexpr,
):
    wait_then_release(PDL)  # kernels._pdl: before any read of an earlier kernel's output
    seq, kv_head, split, length, first, last = split_of_program(seq_lens_ptr, num_splits, BLOCK_SIZE)

    g = tl.arange(0, GROUP_PAD)
    d = tl.arange(0, HEAD_PAD)
    heads = kv_head * GROUP + g
    d_ok = d < HEAD
    q = tl.load(
        q_ptr + seq * q_seq_stride + heads[:, None] * q_head_stride + d[None, :],
        mask=(g < GROUP)[:, None] & d_ok[None, :],
        other=0.0,
    )
    n = tl.arange(0, TILE_N)
    in_block = n % BLOCK_SIZE
    table_row = table_ptr + seq * table_stride
    if FP8:
        acc, m_i, l_i = _fp8_tiles(
            q, k_ptr, v_ptr, ks_ptr, vs_ptr, table_row, first, last, length, kv_head, qk_scale,
            k_block_stride, k_pos_stride, k_head_stride, v_block_stride, v_pos_stride, v_head_stride,
            ks_block_stride, ks_pos_stride, ks_head_stride, vs_block_stride, vs_pos_stride, vs_head_stride,
            GROUP, GROUP_PAD, HEAD, HEAD_PAD, BLOCK_SIZE, TILE_N, PTX, FAULT,
        )  # fmt: skip
    else:
        m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
        l_i = tl.zeros([GROUP_PAD], tl.float32)
        acc = tl.zeros([GROUP_PAD, HEAD_PAD], tl.float32)
        for start in range(first, last, TILE_N // BLOCK_SIZE):
            logical = start + n // BLOCK_SIZE
            in_split = logical < last
            valid = in_split & (logical * BLOCK_SIZE + in_block < length)
            physical = _physical(table_row, logical, in_split, FAULT)
            k_rows = physical * k_block_stride + in_block * k_pos_stride + kv_head * k_head_stride
            k = _kv_tile(k_ptr, k_rows, valid, HEAD, HEAD_PAD, False, False)
            s = tl.dot(q, tl.trans(k)) * qk_scale  # [GROUP_PAD, TILE_N], log2 domain
            s = tl.where(valid[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, axis=1)
            v_rows = physical * v_block_stride + in_block * v_pos_stride + kv_head * v_head_stride
            v = _kv_tile(v_ptr, v_rows, valid, HEAD, HEAD_PAD, False, False)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            m_i = m_new

    g_ok = g < GROUP
    if DIRECT:  # one split: the combine's arithmetic with weight 2^0 = 1 (same bits), without its launch
        res = tl.where(l_i[:, None] == 0.0, 0.0, tl.div_rn(acc, tl.full(acc.shape, 1.0, tl.float32) * l_i[:, None]))
        tl.store(
            out_ptr + seq * out_seq_stride + heads[:, None] * out_head_stride + d[None, :],
            res.to(out_ptr.dtype.element_ty),
            mask=g_ok[:, None] & d_ok[None, :],
        )
        return
    row = (seq * tl.num_programs(1) * GROUP + heads) * num_splits + split  # [B, Hq, num_splits] index
    tl.store(acc_ptr + row[:, None] * HEAD + d[None, :], acc, mask=g_ok[:, None] & d_ok[None, :])
    tl.store(ml_ptr + row * 2, m_i, mask=g_ok)
    tl.store(ml_ptr + row * 2 + 1, l_i, mask=g_ok)


@triton.jit(do_not_specialize=("num_splits",))
def _combine_kernel(
    acc_ptr,
    ml_ptr,
    out_ptr,
    num_splits,
    out_seq_stride,
    out_head_stride,
    HEAD: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    SPLITS_PAD: tl.constexpr,
    PDL: tl.constexpr,
):
    wait_then_release(PDL)  # kernels._pdl: before any read of an earlier kernel's output
    seq = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    row = (seq * tl.num_programs(1) + head) * num_splits
    s = tl.arange(0, SPLITS_PAD)
    d = tl.arange(0, HEAD_PAD)
    s_ok = s < num_splits
    m = tl.load(ml_ptr + (row + s) * 2, mask=s_ok, other=float("-inf"))
    l_s = tl.load(ml_ptr + (row + s) * 2 + 1, mask=s_ok, other=0.0)
    big_m = tl.max(m, axis=0)
    big_m = tl.where(big_m == float("-inf"), 0.0, big_m)  # every split empty: weights 2^-inf = 0
    w = tl.exp2(m - big_m)
    acc = tl.load(acc_ptr + (row + s)[:, None] * HEAD + d[None, :], mask=s_ok[:, None] & (d < HEAD)[None, :], other=0.0)
    num = tl.sum(w[:, None] * acc, axis=0)
    den = tl.sum(w * l_s, axis=0)
    out = tl.where(den == 0.0, 0.0, tl.div_rn(num, tl.full(num.shape, 1.0, tl.float32) * den))
    tl.store(
        out_ptr + seq * out_seq_stride + head * out_head_stride + d, out.to(out_ptr.dtype.element_ty), mask=d < HEAD
    )


def _config(device: torch.device) -> dict:
    return _INTERPRETER if runs_interpreted(device) else _GPU


def _register_cap(maxnreg: int | None) -> dict:
    """The launch's `maxnreg` where there is one to give: NVIDIA's backend only (AMD's refuses the option)."""
    return {"maxnreg": maxnreg} if maxnreg and platform.current_platform.is_cuda() else {}


def _word_strides(name: str, cache: torch.Tensor) -> tuple[int, int, int]:
    """An FP8 cache's block, position and head strides in 32-bit words; ValueError naming the cache unless its
    head size, strides and address allow whole-word reads."""
    strides = cache.stride()[:3]
    if cache.shape[3] % 4 or any(st % 4 for st in strides) or cache.data_ptr() % 4:
        raise ValueError(
            f"{name}: an FP8 cache is read in 4-byte words: head size, strides and address must be multiples of 4, "
            f"got head {cache.shape[3]}, strides {cache.stride()}, address {cache.data_ptr()}"
        )
    return tuple(st // 4 for st in strides)


def takes_mma(q: torch.Tensor, k_cache: torch.Tensor, group: int) -> bool:
    """Whether the FP8 split kernel is `kernels.paged_decode_fp8_mma`: an FP8 cache on a device that runs its PTX,
    head size 128, a group of at most 8, cache blocks of a multiple of 16 tokens, q readable as bf16/fp16 pairs (even
    strides, 4-byte aligned)."""
    return (
        k_cache.dtype == torch.float8_e4m3fn
        and k_cache.shape[1] % 16 == 0
        and packed_ptx(q.device)
        and q.shape[2] == paged_decode_fp8_mma.HEAD
        and group <= paged_decode_fp8_mma.MAX_GROUP
        and q.stride(0) % 2 == 0
        and q.stride(1) % 2 == 0
        and q.data_ptr() % 4 == 0
    )


def launch_paged_decode(
    q, k_cache, v_cache, block_table, seq_lens, scale, num_splits, k_scale=None, v_scale=None, fault="none",
    config=None, mma=None,
):  # fmt: skip
    """Validate and launch both kernels; `fault` plants a named bug (negative controls only); `config` overrides
    entries of the launch table (sweeps); `mma` False keeps an FP8 cache on the generic split kernel, True puts it
    on `kernels.paged_decode_fp8_mma` (ValueError unless `takes_mma`), None: that kernel where `takes_mma` and a
    split can hold the table's mma_min_split_tokens."""
    check_paged_args(q, k_cache, v_cache, block_table, seq_lens, None, scale, (k_scale, v_scale))
    check_num_splits(num_splits)
    fp8 = k_scale is not None
    scales = dict(k_scale=k_scale, v_scale=v_scale) if fp8 else {}
    device = check_launch(q, k_cache=k_cache, v_cache=v_cache, block_table=block_table, seq_lens=seq_lens, **scales)
    batch, hq, head = q.shape
    block_size, hkv = k_cache.shape[1], k_cache.shape[2]
    if block_size < 1 or block_size & (block_size - 1):
        raise ValueError(f"k_cache: block size must be a power of two, got {block_size}")
    out = torch.empty(q.shape, dtype=q.dtype, device=device)
    if out.numel() == 0:
        return out
    cfg = _config(device) | (config or {})
    group = hq // hkv
    head_pad = max(MIN_DOT, triton.next_power_of_2(head))
    key = "fp8_" if fp8 else ""
    tile_n = max(cfg[key + "tile_n"], block_size, MIN_DOT)
    direct = num_splits == 1  # the split kernel writes `out` itself; no partials, no combine launch
    acc = out if direct else torch.empty((batch, hq, num_splits, head), dtype=torch.float32, device=device)
    ml = out if direct else torch.empty((batch, hq, num_splits, 2), dtype=torch.float32, device=device)
    if not fp8:
        k_scale = v_scale = ml  # never read: FP8 is a constexpr
    ks = k_scale.stride() if fp8 else (0, 0, 0)
    vs = v_scale.stride() if fp8 else (0, 0, 0)
    k_strides, v_strides = k_cache.stride()[:3], v_cache.stride()[:3]
    if fp8:  # the codes are read as 32-bit words of four
        k_strides, v_strides = _word_strides("k_cache", k_cache), _word_strides("v_cache", v_cache)
    can_mma = fp8 and takes_mma(q, k_cache, group)
    if mma is None:  # the default: short splits stay on the generic kernel (the launch table's comment)
        mma = can_mma and block_table.shape[1] * block_size >= cfg["mma_min_split_tokens"] * num_splits
    if mma and not can_mma:
        raise ValueError("mma: the FP8 MMA kernel takes FP8 caches, head 128, groups up to 8, blocks of 16k, sm_90+")
    if can_mma and mma:
        few = batch * hkv * num_splits <= cfg["mma_few_programs"]
        warps = cfg["mma_few_warps"] if few else cfg["mma_warps"]
        paged_decode_fp8_mma.fp8_mma_split_kernel[(batch, hkv, num_splits)](
            q, k_cache, v_cache, block_table, seq_lens, acc, ml, out, float(scale) * LOG2E, num_splits,
            out.stride(0), out.stride(1), q.stride(0), q.stride(1), *k_strides, *v_strides, block_table.stride(0),
            k_scale, v_scale, *ks, *vs, GROUP=group, BLOCK_SIZE=block_size, WARPS=warps, SUB=cfg["mma_sub"],
            FAULT=FAULTS[fault], DIRECT=direct, num_warps=warps, num_stages=1, **launch_args(device),
        )  # fmt: skip
    else:
        _split_kernel[(batch, hkv, num_splits)](
            q,
            k_cache,
            v_cache,
            block_table,
            seq_lens,
            acc,
            ml,
            out,
            float(scale) * LOG2E,
            num_splits,
            out.stride(0),
            out.stride(1),
            q.stride(0),
            q.stride(1),
            *k_strides,
            *v_strides,
            block_table.stride(0),
            k_scale,
            v_scale,
            *ks,
            *vs,
            GROUP=group,
            GROUP_PAD=max(MIN_DOT, triton.next_power_of_2(group)),
            HEAD=head,
            HEAD_PAD=head_pad,
            BLOCK_SIZE=block_size,
            TILE_N=tile_n,
            FP8=fp8,
            PTX=fp8 and packed_ptx(device),
            FAULT=FAULTS[fault],
            DIRECT=direct,
            num_warps=cfg[key + "warps"],
            num_stages=cfg[key + "stages"],
            **_register_cap(cfg[key + "maxnreg"]),
            **launch_args(device),
        )
    if direct:
        return out
    _combine_kernel[(batch, hq)](
        acc,
        ml,
        out,
        num_splits,
        out.stride(0),
        out.stride(1),
        HEAD=head,
        HEAD_PAD=head_pad,
        SPLITS_PAD=triton.next_power_of_2(num_splits),
        num_warps=cfg["combine_warps"],
        **launch_args(device),
    )
    return out


@torch.library.custom_op("touchstone::paged_decode", mutates_args=())
def _paged_decode_op(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    num_splits: int,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    return launch_paged_decode(q, k_cache, v_cache, block_table, seq_lens, scale, num_splits, k_scale, v_scale)


@_paged_decode_op.register_fake
def _(q, k_cache, v_cache, block_table, seq_lens, scale, num_splits, k_scale=None, v_scale=None):
    check_paged_args(q, k_cache, v_cache, block_table, seq_lens, None, scale, (k_scale, v_scale))
    check_num_splits(num_splits)
    return torch.empty_like(q, memory_format=torch.contiguous_format)


def paged_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    scale: float,
    num_splits: int = 1,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Kernel twin of `reference.attention.paged.paged_decode_mirror` (same arguments), [B, Hq, D]."""
    return torch.ops.touchstone.paged_decode(
        q, k_cache, v_cache, block_table, seq_lens, scale, num_splits, k_scale, v_scale
    )
