"""Paged attention: softmax(q k^T * scale) v over each sequence's tokens, read through its block table. This
docstring is the contract of the kernels in kernels/paged_decode.py and kernels/paged_prefill.py.

Layouts (vLLM v1's; the caches are the "k"/"v" views of reference.kv.attention, NHD):
- q [T, Hq, D], bf16 or fp16 (the ideal also takes fp32, the runner's fp32 CPU model): T query tokens of B
  sequences, sequence b's tokens at rows cu_seqlens[b] : cu_seqlens[b + 1] (cu_seqlens int32 [B + 1],
  starting at 0, non-decreasing). Decode is one new token a sequence: T = B, cu_seqlens = arange(B + 1).
- k_cache, v_cache [num_blocks, block_size, Hkv, D], the dtype of q; any strides, last dim contiguous.
  Decode also reads FP8 caches (reference.kv.store's per-token-head FP8): k_cache, v_cache float8_e4m3fn
  codes with k_scale, v_scale float32 [num_blocks, block_size, Hkv] (any strides), one scale per (slot, KV
  head); the scales are required iff the caches are FP8. The stored operand is code * scale.
- block_table int32 [B, max_blocks]: token p of sequence b lies at block block_table[b, p // block_size],
  position p % block_size. Entries past cdiv(seq_lens[b], block_size) are unused and may hold any value
  (-1, a block of another sequence, garbage): nothing reads them. Two sequences may point at the same
  blocks (a shared prefix).
- seq_lens int32 [B]: tokens in the cache for each sequence, the new ones included (they were stored before
  attention runs), 1 <= seq_lens[b] <= max_blocks * block_size, and at least the sequence's query count.
- GQA: Hq = group * Hkv; query head h reads KV head h // group.

Causality: query i of a sequence of length L with n new tokens sits at position L - n + i and attends to
positions 0 .. L - n + i (a cached prefix of L - n tokens, then the new tokens causally). Decode: n = 1, the
query attends to all L tokens.

`paged_attention_ideal` is the definition: fp64 on the stored operands (one exp, one sum, one division per
row), output float64; over an FP8 cache it takes fp64(code) * fp64(scale), exact.

`paged_decode_mirror` has the split-K decode kernel's precision up to its tiling. Scores q . k in fp32 (exact
products, fp32 sums), scaled in fp32; the context of a sequence split into `num_splits` ranges of whole cache
blocks (`split_blocks`); per split the max m_s, p = exp(s - m_s) in fp32, l_s = sum p in fp32, acc_s = (p
rounded to the cache dtype) @ v summed in fp32 (the kernel feeds p to the tensor cores in the cache dtype);
combine in fp32: M = max m_s, out = sum_s e^(m_s - M) acc_s / sum_s e^(m_s - M) l_s; one rounding to q's
dtype. Empty splits (more splits than blocks) contribute nothing. The kernel runs an online softmax over KV
tiles inside each split, so its p is rounded against a running maximum rather than the split's: max_rel
2.3e-3 in bf16 at block size 8 with one split, 0 when each split is one tile; the ("paged_decode", dtype)
tolerance rows cover that and nothing more.
Over an FP8 cache both scales fold into the softmax side and the codes reach the tensor cores as they are,
in fp16 (every e4m3 code is an fp16; sm_90 converts e4m3 to fp16 in one instruction and has no conversion to
bf16), so K and V cost no rounding of their own:
- K: s = fp32(q.code) * k_scale (exact products, fp32 sums, then one fp32 multiply per score, before the
  softmax scale). For the fp16 tensor cores the kernel scales a bf16 q by the power of two that puts its
  group's largest |q| in [2**14, 2**15) and scales the dot back: exact, except elements 2**24 or more below
  that largest one, which fp16's subnormals shorten (no such q occurs in a model; the mirror keeps them).
  Dequantizing K first would cost a rounding that the score's size amplifies: over 400 suite draws it takes
  the bf16 mirror's worst SQNR against the ideal from 48.8 to 19.4 dB.
- V: each p is multiplied by its token's v_scale (one fp32 multiply, RNE) and rounded (RNE) to fp16's 11
  significant bits, whatever q's dtype (`round_to_fp16_precision`); the tensor cores take (that) @ code in
  fp32. The kernel rounds in fp16 within each KV tile's power-of-two range (the tile's largest v_scale put in
  [2**14, 2**15)), which is the same rounding but for products 2**24 or more below that scale (fp16
  subnormals there). One rounding per (p, token) pair, finer than bf16's, where dequantizing V would add a
  second, per element.

`paged_prefill_mirror` has the prefill kernel's precision and KV tiling: per sequence, scores in fp32 times
scale * log2(e) (fp32), the causal mask, then an online softmax over KV tiles of `tile_n` positions aligned at
position 0: per tile m' = max(m, tile max), p = 2^(s - m') in fp32, l = l 2^(m - m') + sum p, acc = acc
2^(m - m') + (p rounded to the cache dtype) @ v in fp32; out = acc / l, one rounding. A tile wholly past a
row's last position leaves that row unchanged (2^0 = 1, p = 0), so padding tiles do not matter; position 0
is in every row's first tile, so m is finite from then on.

Edge-case policy: only the first seq_lens[b] tokens are read; whatever the cache holds elsewhere (NaN in
unused blocks or past the end of a sequence's last block) never reaches the output. A NaN in q or in a
key/value row a query attends to makes that query head's output NaN; a +Inf score makes it NaN (Inf - Inf in
the softmax), as does a row whose scores are all -Inf; a single -Inf score only gets weight 0, as in
torch.softmax. The mirrors round the output to nearest even once; subnormal outputs are kept. FP8 caches: a
NaN code or scale (reference.kv.store writes NaN for a head that held NaN) in an attended slot makes the
output NaN like a NaN value; codes and scales of unattended slots are never read. An FP8 scale or q so large
that the fp32 score or p * v_scale overflows makes the output Inf or NaN in both.
"""

from __future__ import annotations

import math

import torch

DTYPES = (torch.bfloat16, torch.float16)  # the kernels' and the mirrors'
IDEAL_DTYPES = (*DTYPES, torch.float32)  # the fp64 definition reads fp32 operands exactly too


def _tensor(name: str, t: object) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: must be a torch.Tensor, got {type(t).__name__}")
    return t


FP8 = torch.float8_e4m3fn


def check_paged_args(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    cu_seqlens: torch.Tensor | None,
    scale: float,
    fp8_scales: tuple[torch.Tensor | None, torch.Tensor | None] | None = None,
    dtypes: tuple[torch.dtype, ...] = DTYPES,
) -> None:
    """Shapes, dtypes and strides (no tensor values: the kernels never read them on the host); TypeError or
    ValueError naming the argument. Shared with the kernel launcher and its fake. `fp8_scales` is
    (k_scale, v_scale) for an op that reads FP8 caches (decode); None: the caches must have q's dtype.
    `dtypes`: q's accepted dtypes (the ideal passes IDEAL_DTYPES)."""
    for name, t in (
        ("q", q),
        ("k_cache", k_cache),
        ("v_cache", v_cache),
        ("block_table", block_table),
        ("seq_lens", seq_lens),
    ):
        _tensor(name, t)
    if q.dtype not in dtypes:
        raise TypeError(f"q: dtype must be one of {dtypes}, got {q.dtype}")
    if q.dim() != 3:
        raise ValueError(f"q: must be [tokens, Hq, D], got shape {tuple(q.shape)}")
    fp8 = fp8_scales is not None and k_cache.dtype == FP8
    want, also = (FP8, "") if fp8 else (q.dtype, f" or {FP8} (with k_scale, v_scale)" if fp8_scales else "")
    for name, c in (("k_cache", k_cache), ("v_cache", v_cache)):
        if c.dtype != want:
            raise TypeError(f"{name}: dtype must be {want}{also} (q is {q.dtype}), got {c.dtype}")
        if c.dim() != 4:
            raise ValueError(f"{name}: must be NHD [num_blocks, block_size, Hkv, D], got shape {tuple(c.shape)}")
        if c.shape[-1] > 1 and c.stride(-1) != 1:
            raise ValueError(f"{name}: last dim must have stride 1, got strides {c.stride()}")
    if v_cache.shape != k_cache.shape:
        raise ValueError(f"v_cache: shape {tuple(v_cache.shape)} must equal k_cache's {tuple(k_cache.shape)}")
    if k_cache.shape[3] != q.shape[2]:
        raise ValueError(f"k_cache: head size {k_cache.shape[3]} must equal q's {q.shape[2]}")
    hkv = k_cache.shape[2]
    if hkv == 0 or q.shape[1] % hkv:
        raise ValueError(f"q: {q.shape[1]} query heads must be a multiple of the cache's {hkv} KV heads")
    if block_table.dtype != torch.int32 or block_table.dim() != 2:
        raise TypeError(
            f"block_table: must be int32 [B, max_blocks], got {block_table.dtype} shape {tuple(block_table.shape)}"
        )
    if block_table.shape[1] and block_table.stride(1) != 1:
        raise ValueError(f"block_table: rows must be contiguous, got strides {block_table.stride()}")
    if seq_lens.dtype != torch.int32 or seq_lens.dim() != 1 or seq_lens.shape[0] != block_table.shape[0]:
        raise TypeError(
            f"seq_lens: must be int32 [B] with B = {block_table.shape[0]} (block_table's rows), got "
            f"{seq_lens.dtype} shape {tuple(seq_lens.shape)}"
        )
    if cu_seqlens is None:
        if q.shape[0] != seq_lens.shape[0]:
            raise ValueError(f"q: decode takes one token a sequence: {seq_lens.shape[0]} rows, got {q.shape[0]}")
    else:
        _tensor("cu_seqlens", cu_seqlens)
        if cu_seqlens.dtype != torch.int32 or cu_seqlens.shape != (seq_lens.shape[0] + 1,):
            raise TypeError(
                f"cu_seqlens: must be int32 [B + 1] = [{seq_lens.shape[0] + 1}], got "
                f"{cu_seqlens.dtype} shape {tuple(cu_seqlens.shape)}"
            )
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not 0 < scale < math.inf:
        raise ValueError(f"scale: must be a positive finite number, got {scale!r}")
    if fp8_scales is not None:
        _check_fp8_scales(k_cache, fp8, fp8_scales)


def _check_fp8_scales(k_cache: torch.Tensor, fp8: bool, fp8_scales: tuple) -> None:
    """k_scale, v_scale: float32 [num_blocks, block_size, Hkv] (the cache's shape without the head dim, as
    reference.kv.store writes them) iff the caches are FP8, else None."""
    want = tuple(k_cache.shape[:3])
    for name, s in zip(("k_scale", "v_scale"), fp8_scales, strict=True):
        if not fp8:
            if s is not None:
                raise ValueError(f"{name}: only a {FP8} cache takes scales, the cache is {k_cache.dtype}")
            continue
        if s is None:
            raise ValueError(f"{name}: a {FP8} cache needs its float32 {want} per-(slot, KV head) scales")
        _tensor(name, s)
        if s.dtype != torch.float32:
            raise TypeError(f"{name}: dtype must be torch.float32, got {s.dtype}")
        if tuple(s.shape) != want:
            raise ValueError(f"{name}: shape must be the cache's without the head dim {want}, got {tuple(s.shape)}")


def _check_values(q, block_table, seq_lens, cu_seqlens, block_size, num_blocks) -> list[tuple[int, int, int]]:
    """(first query row, query count, length) per sequence, after the host-side value checks."""
    lens = seq_lens.tolist()
    cu = cu_seqlens.tolist() if cu_seqlens is not None else list(range(len(lens) + 1))
    if cu[0] != 0 or cu[-1] != q.shape[0]:
        raise ValueError(f"cu_seqlens: must run from 0 to the {q.shape[0]} query rows, got {cu[0]} .. {cu[-1]}")
    out = []
    for b, length in enumerate(lens):
        n = cu[b + 1] - cu[b]
        if n < 0 or not n <= length <= block_table.shape[1] * block_size or length < 1:
            raise ValueError(
                f"seq_lens: sequence {b} has {length} tokens and {n} queries; need "
                f"max(1, queries) <= length <= {block_table.shape[1] * block_size}"
            )
        used = block_table[b, : -(-length // block_size)]
        if used.numel() and (int(used.min()) < 0 or int(used.max()) >= num_blocks):
            raise ValueError(f"block_table: sequence {b} points outside the cache's {num_blocks} blocks")
        out.append((cu[b], n, length))
    return out


def gather_kv(cache: torch.Tensor, table_row: torch.Tensor, length: int) -> torch.Tensor:
    """The first `length` tokens of one sequence, [length, Hkv, D], read through its block table row."""
    block_size = cache.shape[1]
    pos = torch.arange(length, device=cache.device)
    blocks = table_row.to(cache.device, torch.int64)[pos // block_size]
    return cache[blocks, pos % block_size]


def gather_dequantized(
    cache: torch.Tensor, cache_scale: torch.Tensor | None, table_row: torch.Tensor, length: int, dtype: torch.dtype
) -> torch.Tensor:
    """gather_kv in `dtype`. An FP8 cache (cache_scale given) is dequantized first: fp32(code) * scale (float64:
    exact, the ideal's operand), then rounded once to `dtype`; the codes are gathered as bytes."""
    if cache_scale is None:
        return gather_kv(cache, table_row, length).to(dtype)
    codes = gather_kv(cache.view(torch.uint8), table_row, length).view(cache.dtype)
    wide = torch.float64 if dtype == torch.float64 else torch.float32
    return (codes.to(wide) * gather_kv(cache_scale, table_row, length).to(wide)[..., None]).to(dtype)


def paged_attention_ideal(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    cu_seqlens: torch.Tensor | None = None,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """fp64 causal paged attention, [T, Hq, D] float64 (cu_seqlens None: decode, one query a sequence); FP8
    caches on their exactly dequantized values."""
    check_paged_args(
        q, k_cache, v_cache, block_table, seq_lens, cu_seqlens, scale, (k_scale, v_scale), dtypes=IDEAL_DTYPES
    )
    seqs = _check_values(q, block_table, seq_lens, cu_seqlens, k_cache.shape[1], k_cache.shape[0])
    group = q.shape[1] // k_cache.shape[2]
    out = torch.empty(q.shape, dtype=torch.float64, device=q.device)
    for b, (first, n, length) in enumerate(seqs):
        if n == 0:
            continue
        k = gather_dequantized(k_cache, k_scale, block_table[b], length, torch.float64)
        k = k.repeat_interleave(group, dim=1)  # [L, Hq, D]
        v = gather_dequantized(v_cache, v_scale, block_table[b], length, torch.float64).repeat_interleave(group, dim=1)
        qs = q[first : first + n].double()  # [n, Hq, D]
        scores = torch.einsum("ihd,jhd->hij", qs, k) * scale  # [Hq, n, L]
        pos_q = torch.arange(length - n, length, device=q.device)[:, None]
        scores = scores.masked_fill(torch.arange(length, device=q.device)[None, :] > pos_q, -torch.inf)
        weights = torch.softmax(scores, dim=-1)
        out[first : first + n] = torch.einsum("hij,jhd->ihd", weights, v)
    return out


def split_blocks(length: int, block_size: int, num_splits: int) -> list[tuple[int, int]]:
    """The kernel's split of one sequence: split s covers cache blocks [s * per, min((s + 1) * per, n)) of its
    n = cdiv(length, block_size) blocks, per = cdiv(n, num_splits); trailing splits may be empty."""
    n = -(-length // block_size)
    per = -(-n // num_splits)
    return [(min(s * per, n), min((s + 1) * per, n)) for s in range(num_splits)]


def check_num_splits(num_splits: int) -> None:
    if isinstance(num_splits, bool) or not isinstance(num_splits, int) or num_splits < 1:
        raise ValueError(f"num_splits: must be a positive int, got {num_splits!r}")


def round_to_fp16_precision(x: torch.Tensor) -> torch.Tensor:
    """fp32 `x` rounded to nearest even at 11 significant bits (fp16's precision, fp32's exponent range), as
    fp32; zeros, Inf and NaN pass through."""
    mantissa, exponent = torch.frexp(x)  # x = mantissa * 2**exponent, 0.5 <= |mantissa| < 1
    rounded = torch.ldexp(torch.round(mantissa * 2048.0), exponent - 11)  # torch.round: half to even
    return torch.where(torch.isfinite(x), rounded, x).to(torch.float32)


def paged_decode_mirror(
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
    """Split-K decode with the kernel's precision (module docstring), [B, Hq, D] in q's dtype; FP8 caches take
    their k_scale, v_scale."""
    check_paged_args(q, k_cache, v_cache, block_table, seq_lens, None, scale, (k_scale, v_scale))
    check_num_splits(num_splits)
    block_size, group = k_cache.shape[1], q.shape[1] // k_cache.shape[2]
    seqs = _check_values(q, block_table, seq_lens, None, block_size, k_cache.shape[0])
    out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    for b, (_, _, length) in enumerate(seqs):
        k = gather_kv(k_cache.view(torch.uint8) if k_scale is not None else k_cache, block_table[b], length)
        k = k.view(k_cache.dtype).repeat_interleave(group, dim=1)  # [L, Hq, D]: the codes of an FP8 cache
        v = gather_kv(v_cache.view(torch.uint8) if v_scale is not None else v_cache, block_table[b], length)
        v = v.view(v_cache.dtype).repeat_interleave(group, dim=1)  # [L, Hq, D]: codes of an FP8 cache
        fold = None  # FP8: p's factor per (query head, token), its v_scale
        if v_scale is not None:
            fold = gather_kv(v_scale, block_table[b], length).repeat_interleave(group, dim=1).T
        scores = torch.einsum("hd,jhd->hj", q[b].float(), k.float())
        if k_scale is not None:
            scores = scores * gather_kv(k_scale, block_table[b], length).repeat_interleave(group, dim=1).T
        scores = scores * torch.tensor(scale, dtype=torch.float32)
        parts = []  # (m_s, l_s, acc_s) per non-empty split, fp32
        for start, end in split_blocks(length, block_size, num_splits):
            lo, hi = start * block_size, min(end * block_size, length)
            if lo >= hi:
                continue
            s = scores[:, lo:hi]
            m = s.max(dim=1).values
            p = torch.exp(s - m[:, None])
            weights = p.to(q.dtype).float() if fold is None else round_to_fp16_precision(p * fold[:, lo:hi])
            acc = torch.einsum("hj,jhd->hd", weights, v[lo:hi].float())
            parts.append((m, p.sum(dim=1), acc))
        big_m = torch.stack([m for m, _, _ in parts]).max(dim=0).values
        num = sum(torch.exp(m - big_m)[:, None] * acc for m, _, acc in parts)
        den = sum(torch.exp(m - big_m) * total for m, total, _ in parts)
        out[b] = num / den[:, None]
    return out.to(q.dtype)


def check_tile_n(tile_n: int) -> None:
    if isinstance(tile_n, bool) or not isinstance(tile_n, int) or tile_n < 1:
        raise ValueError(f"tile_n: must be a positive int, got {tile_n!r}")


def paged_prefill_mirror(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    cu_seqlens: torch.Tensor,
    scale: float,
    tile_n: int,
) -> torch.Tensor:
    """Causal prefill with the kernel's precision and KV tiling (module docstring), [T, Hq, D] in q's dtype."""
    if cu_seqlens is None:
        raise TypeError("cu_seqlens: prefill needs the int32 [B + 1] query offsets, got None")
    check_paged_args(q, k_cache, v_cache, block_table, seq_lens, cu_seqlens, scale)
    check_tile_n(tile_n)
    group = q.shape[1] // k_cache.shape[2]
    seqs = _check_values(q, block_table, seq_lens, cu_seqlens, k_cache.shape[1], k_cache.shape[0])
    qk_scale = torch.tensor(scale * math.log2(math.e), dtype=torch.float32)
    out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    for b, (first, n, length) in enumerate(seqs):
        if n == 0:
            continue
        k = gather_kv(k_cache, block_table[b], length).repeat_interleave(group, dim=1)  # [L, Hq, D]
        v = gather_kv(v_cache, block_table[b], length).repeat_interleave(group, dim=1)
        s = torch.einsum("ihd,jhd->hij", q[first : first + n].float(), k.float()) * qk_scale  # [Hq, n, L]
        pos_q = torch.arange(length - n, length, device=q.device)[:, None]
        s = s.masked_fill(torch.arange(length, device=q.device)[None, :] > pos_q, -torch.inf)
        m = torch.full(s.shape[:2], -torch.inf, device=q.device)
        total = torch.zeros(s.shape[:2], device=q.device)
        acc = torch.zeros((*s.shape[:2], q.shape[2]), device=q.device)
        for lo in range(0, length, tile_n):
            tile = s[..., lo : lo + tile_n]
            m_new = torch.maximum(m, tile.max(dim=-1).values)
            alpha = torch.exp2(m - m_new)
            p = torch.exp2(tile - m_new[..., None])
            total = total * alpha + p.sum(dim=-1)
            pv = torch.einsum("hij,jhd->hid", p.to(v.dtype).float(), v[lo : lo + tile_n].float())
            acc = acc * alpha[..., None] + pv
            m = m_new
        out[first : first + n] = (acc / total[..., None]).transpose(0, 1)
    return out.to(q.dtype)
