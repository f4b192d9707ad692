"""Paged prefill in Triton: the kernel twin of `reference.attention.paged.paged_prefill_mirror` at
`tile_n = kv_tile(device)`, whose module docstring is the contract (layouts, causality, precision, edge cases).

Op: `touchstone::paged_prefill(q, k_cache, v_cache, block_table, seq_lens, cu_seqlens, scale) -> out`; call it
through `paged_prefill`. The caches already hold the new tokens (stored before attention runs, as vLLM does).

One launch, grid (Hq, T // TILE_M + B). A program takes TILE_M query rows of one query head of one sequence
(FlashAttention's shape; the heads of a GQA group are neighbours on grid axis 0, so they run together and
share K/V through L2). Axis 1 enumerates every sequence's query tiles without a host sync: sequence b's tiles
start at cu_seqlens[b] // TILE_M + b (strictly increasing in b, and sequence b's last tile ends before
sequence b + 1's first), so a binary search over cu_seqlens finds the program's sequence; at most B
programs of the axis find no tile and exit. Axis 1 is walked backwards so the longest tiles (latest in their
sequence) start first (the usual causal load balance; not measured).

K and V are read through the block table a KV tile of TILE_N positions at a time (any block size: the tile
may span blocks or part of one), tiles aligned at position 0 as in the mirror, with the mirror's online
softmax in the exp2 domain and one IEEE division at the end. Two loops: tiles wholly at or before the tile's
first query position need no mask (every row sees every key); the rest, up to the tile's last query
position, are masked causally and at the sequence end. No position at or past the tile's last query + 1
(<= seq_lens[b]) is loaded, nor any table entry past it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._boundary import runs_interpreted
from kernels._paged import FAULTS, LOG2E, MIN_DOT, check_launch
from reference.attention.paged import check_paged_args

# GPU launch shapes: query rows and KV positions per tile (powers of two >= 16), warps, pipeline stages. H200
# (`python -m bench.attention.paged_prefill_launch_sweep`, bf16, 32/8 heads of 128, block size 16): 8 x 2048
# causal: 932 us = 1.003x SDPA flash (K/V repeated to 32 heads); 8 x 512 after a 1536-token cached prefix:
# 1.034x. 128 x 64 at 8 warps: 0.918x; 128 x 128 at 8 warps: 0.99x; every 8-warp 64-row tile
# and every 4-warp 128 x 64+ tile is slower (0.46-0.87x); stages 3 beats 2 by up to 10 %. tile_n also fixes
# where the mirror rounds p (kv_tile).
_GPU = {"tile_m": 64, "tile_n": 64, "warps": 4, "stages": 3}
# The interpreter costs per program and per loop step, not per element: few programs, few steps.
_INTERPRETER = {"tile_m": 32, "tile_n": 32, "warps": 4, "stages": 1}


@triton.jit
def _kv_tile(
    k_ptr,
    v_ptr,
    table_row,
    start,
    end,
    kv_head,
    d,
    d_ok,
    k_block_stride,
    k_pos_stride,
    k_head_stride,
    v_block_stride,
    v_pos_stride,
    v_head_stride,
    BLOCK_SIZE: tl.constexpr,
    TILE_N: tl.constexpr,
    MASKED: tl.constexpr,
    FAULT: tl.constexpr,
):
    """K and V [TILE_N, HEAD_PAD] of positions start + arange(TILE_N), gathered through the block table;
    positions >= end (MASKED only) are neither looked up nor loaded (0)."""
    pos = start + tl.arange(0, TILE_N)
    logical = pos // BLOCK_SIZE
    if FAULT == 1:
        logical = logical + 1
    if MASKED:
        ok = pos < end
        physical = tl.load(table_row + logical, mask=ok, other=0).to(tl.int64)
        mask = ok[:, None] & d_ok[None, :]
    else:
        physical = tl.load(table_row + logical).to(tl.int64)
        mask = d_ok[None, :]
    in_block = pos % BLOCK_SIZE
    k_rows = k_ptr + physical * k_block_stride + in_block * k_pos_stride + kv_head * k_head_stride
    v_rows = v_ptr + physical * v_block_stride + in_block * v_pos_stride + kv_head * v_head_stride
    k = tl.load(k_rows[:, None] + d[None, :], mask=mask, other=0.0)
    v = tl.load(v_rows[:, None] + d[None, :], mask=mask, other=0.0)
    return k, v


@triton.jit
def _softmax_step(s, v, m_i, l_i, acc):
    """One online-softmax step over a KV tile (both loops'): scores s [TILE_M, TILE_N] in the log2 domain, -inf
    where unseen; p rounded to the cache dtype before p @ v. Returns the new (m, l, acc)."""
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return m_new, l_i, acc


# Arguments that change from step to step in a serving loop (sequences in the step, width of its block table) and
# carry no alignment the kernel uses: not specialized, so a new value (== 1, % 16 == 0, other) never recompiles
# inside a timed run. The q/cache/out strides stay specialized (their % 16 lets loads vectorize).
_PER_STEP = ("num_seqs", "table_stride")


@triton.jit(do_not_specialize=_PER_STEP)
def _prefill_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    table_ptr,
    seq_lens_ptr,
    cu_ptr,
    out_ptr,
    qk_scale,
    num_seqs,
    q_tok_stride,
    q_head_stride,
    k_block_stride,
    k_pos_stride,
    k_head_stride,
    v_block_stride,
    v_pos_stride,
    v_head_stride,
    table_stride,
    out_tok_stride,
    out_head_stride,
    GROUP: tl.constexpr,
    HEAD: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    TILE_M: tl.constexpr,
    TILE_N: tl.constexpr,
    FAULT: tl.constexpr,
):
    head = tl.program_id(0)
    tile = tl.num_programs(1) - 1 - tl.program_id(1)
    # the last sequence b with cu[b] // TILE_M + b <= tile
    lo = head * 0  # int32 tensors from the start (loop-carried types must not change)
    hi = lo + num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        before = tl.load(cu_ptr + mid) // TILE_M + mid <= tile
        lo = tl.where(before, mid + 1, lo)
        hi = tl.where(before, hi, mid)
    seq = lo - 1
    first_row = tl.load(cu_ptr + seq)
    count = tl.load(cu_ptr + seq + 1) - first_row
    q_start = (tile - first_row // TILE_M - seq) * TILE_M
    if q_start < count:
        length = tl.load(seq_lens_ptr + seq)
        prefix = length - count
        r = tl.arange(0, TILE_M)
        d = tl.arange(0, HEAD_PAD)
        d_ok = d < HEAD
        row_ok = q_start + r < count
        rows = (first_row + q_start + r).to(tl.int64)
        q = tl.load(
            q_ptr + rows[:, None] * q_tok_stride + head * q_head_stride + d[None, :],
            mask=row_ok[:, None] & d_ok[None, :],
            other=0.0,
        )
        kv_head = head // GROUP
        table_row = table_ptr + seq.to(tl.int64) * table_stride
        pos_q = prefix + q_start + r
        end = prefix + tl.minimum(q_start + TILE_M, count)  # one past the tile's last query position
        full_end = (prefix + q_start + 1) // TILE_N * TILE_N  # keys below it are seen by every row
        m_i = tl.full([TILE_M], float("-inf"), tl.float32)
        l_i = tl.zeros([TILE_M], tl.float32)
        acc = tl.zeros([TILE_M, HEAD_PAD], tl.float32)
        for start in range(0, full_end, TILE_N):
            k, v = _kv_tile(
                k_ptr,
                v_ptr,
                table_row,
                start,
                end,
                kv_head,
                d,
                d_ok,
                k_block_stride,
                k_pos_stride,
                k_head_stride,
                v_block_stride,
                v_pos_stride,
                v_head_stride,
                BLOCK_SIZE,
                TILE_N,
                False,
                FAULT,
            )
            s = tl.dot(q, tl.trans(k)) * qk_scale
            m_i, l_i, acc = _softmax_step(s, v, m_i, l_i, acc)
        for start in range(full_end, end, TILE_N):
            k, v = _kv_tile(
                k_ptr,
                v_ptr,
                table_row,
                start,
                end,
                kv_head,
                d,
                d_ok,
                k_block_stride,
                k_pos_stride,
                k_head_stride,
                v_block_stride,
                v_pos_stride,
                v_head_stride,
                BLOCK_SIZE,
                TILE_N,
                True,
                FAULT,
            )
            pos_k = start + tl.arange(0, TILE_N)
            seen = (pos_k[None, :] <= pos_q[:, None]) & (pos_k < end)[None, :]
            s = tl.where(seen, tl.dot(q, tl.trans(k)) * qk_scale, float("-inf"))
            m_i, l_i, acc = _softmax_step(s, v, m_i, l_i, acc)
        out = tl.div_rn(acc, tl.full(acc.shape, 1.0, tl.float32) * l_i[:, None])
        tl.store(
            out_ptr + rows[:, None] * out_tok_stride + head * out_head_stride + d[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=row_ok[:, None] & d_ok[None, :],
        )


def _config(device: torch.device) -> dict:
    return _INTERPRETER if runs_interpreted(device) else _GPU


def kv_tile(device: torch.device | str) -> int:
    """KV positions per tile of the kernel on `device`: the mirror's `tile_n` (it fixes where p is rounded)."""
    return _config(torch.device(device))["tile_n"]


def launch_paged_prefill(q, k_cache, v_cache, block_table, seq_lens, cu_seqlens, scale, fault="none"):
    """Validate and launch; `fault` plants a named bug (negative controls only)."""
    if cu_seqlens is None:
        raise TypeError("cu_seqlens: prefill needs the int32 [B + 1] query offsets, got None")
    check_paged_args(q, k_cache, v_cache, block_table, seq_lens, cu_seqlens, scale)
    device = check_launch(
        q, k_cache=k_cache, v_cache=v_cache, block_table=block_table, seq_lens=seq_lens, cu_seqlens=cu_seqlens
    )
    tokens, hq, head = q.shape
    out = torch.empty(q.shape, dtype=q.dtype, device=device)
    if out.numel() == 0:
        return out
    cfg = _config(device)
    batch = seq_lens.shape[0]
    tile_m, tile_n = cfg["tile_m"], cfg["tile_n"]
    _prefill_kernel[(hq, tokens // tile_m + batch)](
        q,
        k_cache,
        v_cache,
        block_table,
        seq_lens,
        cu_seqlens,
        out,
        float(scale) * LOG2E,
        batch,
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        block_table.stride(0),
        out.stride(0),
        out.stride(1),
        GROUP=hq // k_cache.shape[2],
        HEAD=head,
        HEAD_PAD=max(MIN_DOT, triton.next_power_of_2(head)),
        BLOCK_SIZE=k_cache.shape[1],
        TILE_M=tile_m,
        TILE_N=tile_n,
        FAULT=FAULTS[fault],
        num_warps=cfg["warps"],
        num_stages=cfg["stages"],
    )
    return out


@torch.library.custom_op("touchstone::paged_prefill", mutates_args=())
def _paged_prefill_op(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    cu_seqlens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    return launch_paged_prefill(q, k_cache, v_cache, block_table, seq_lens, cu_seqlens, scale)


@_paged_prefill_op.register_fake
def _(q, k_cache, v_cache, block_table, seq_lens, cu_seqlens, scale):
    check_paged_args(q, k_cache, v_cache, block_table, seq_lens, cu_seqlens, scale)
    return torch.empty_like(q, memory_format=torch.contiguous_format)


def paged_prefill(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    cu_seqlens: torch.Tensor,
    *,
    scale: float,
) -> torch.Tensor:
    """Kernel twin of `reference.attention.paged.paged_prefill_mirror` at tile_n = kv_tile(q.device), [T, Hq, D]."""
    return torch.ops.touchstone.paged_prefill(q, k_cache, v_cache, block_table, seq_lens, cu_seqlens, scale)
