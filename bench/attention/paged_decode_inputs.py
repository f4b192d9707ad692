"""Paged decode and prefill problems, shared by the benchmarks (bench/attention/paged_decode.py,
bench/attention/paged_prefill.py) and the decode launch sweep.

Issue 4's shapes: 32 query heads, 8 KV heads, head 128, bf16, block size 16. A problem is `batch` sequences of
`context` tokens each in a cache of exactly batch * context / 16 blocks, allocated by reference.kv: NHD,
K/V-outermost (FlashAttention's and vLLM's Hopper order, `kv_outer=True`), so all blocks' K form one
[num_blocks * 16, 8, 128] plane that FlexAttention's paged cache [1, 8, tokens, 128] can view without a copy;
the block tables a random permutation of the cache (as after many requests: no two neighbouring logical
blocks are neighbours in memory), q, K and V standard normal from a seeded generator.
"""

from __future__ import annotations

import dataclasses

import torch

from reference.kv.allocate import allocate_kv_cache
from reference.kv.attention import FullAttentionSpec
from reference.kv.store import store_kv

HQ, HKV, HEAD, BLOCK = 32, 8, 128, 16
# Split-K choice: split until the split kernel's grid (batch x Hkv x splits) holds at least TARGET_PROGRAMS
# programs, two per SM of the H200's 132, in powers of two, while every split keeps at least MIN_SPLIT_BLOCKS
# cache blocks (256 tokens) and there are at most MAX_SPLITS. The H200 sweep
# (`python -m bench.attention.paged_decode_launch_sweep`) agrees at its two points: batch 128 x 4k, 1 split
# (0.966x SDPA; 2 and 4 splits 0.963x, 0.936x); batch 8 x 32k, 8 splits (0.970x memcpy; 16, 32, 64 splits
# 0.964x, 0.956x, 0.933x). Batch 1-4 at short contexts is not swept: the rule is a guess there.
TARGET_PROGRAMS = 264
MIN_SPLIT_BLOCKS = 16
MAX_SPLITS = 64


@dataclasses.dataclass(frozen=True)
class Problem:
    q: torch.Tensor  # [B, HQ, HEAD]
    k_cache: torch.Tensor  # [num_blocks, BLOCK, HKV, HEAD], NHD
    v_cache: torch.Tensor
    block_table: torch.Tensor  # int32 [B, context / BLOCK]
    seq_lens: torch.Tensor  # int32 [B], all `context`
    scale: float
    num_splits: int

    @property
    def args(self) -> tuple:
        """The positional arguments of `paged_decode_mirror` and of the kernel's launcher."""
        return (self.q, self.k_cache, self.v_cache, self.block_table, self.seq_lens, self.scale, self.num_splits)


def num_splits_for(batch: int, context: int) -> int:
    """Splits of each sequence's context (see TARGET_PROGRAMS): 1 at batch 128 x 4k, 8 at batch 8 x 32k."""
    blocks = -(-context // BLOCK)
    splits = 1
    while batch * HKV * splits < TARGET_PROGRAMS and splits < MAX_SPLITS and blocks // (2 * splits) >= MIN_SPLIT_BLOCKS:
        splits *= 2
    return splits


def kv_bytes(batch: int, context: int) -> int:
    """Bytes of K and V the decode must read: every token's K and V row of every KV head."""
    return 2 * batch * context * HKV * HEAD * 2


def make_problem(batch: int, context: int, device: str, num_splits: int | None = None, seed: int = 0) -> Problem:
    if context % BLOCK:
        raise ValueError(f"context: must be a multiple of the block size {BLOCK}, got {context}")
    generator = torch.Generator(device=device).manual_seed(seed)
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=HKV, head_size=HEAD, dtype=torch.bfloat16, kv_outer=True)
    per_seq = context // BLOCK
    cache = allocate_kv_cache(spec, batch * per_seq, device=device)
    k_cache, v_cache = cache.views[0]["k"], cache.views[0]["v"]
    for view in (k_cache, v_cache):
        view.copy_(torch.randn(view.shape, dtype=torch.bfloat16, device=device, generator=generator))
    table = torch.randperm(batch * per_seq, device=device, generator=generator).view(batch, per_seq)
    q = torch.randn(batch, HQ, HEAD, dtype=torch.bfloat16, device=device, generator=generator)
    lens = torch.full((batch,), context, dtype=torch.int32, device=device)
    splits = num_splits_for(batch, context) if num_splits is None else num_splits
    return Problem(q, k_cache, v_cache, table.to(torch.int32), lens, HEAD**-0.5, splits)


def fp8_kv(problem: Problem) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The problem's K/V stored into an FP8 cache of the same geometry through the FP8 store reference
    (reference.kv.store: e4m3fn codes, one fp32 scale per (slot, KV head)): (k_cache, v_cache, k_scale,
    v_scale), the decode's FP8 arguments; slot s is block s // BLOCK, position s % BLOCK, as in the bf16 cache."""
    num_blocks = problem.k_cache.shape[0]
    spec = FullAttentionSpec(
        block_size=BLOCK, num_kv_heads=HKV, head_size=HEAD, dtype=torch.float8_e4m3fn, kv_outer=True
    )
    views = allocate_kv_cache(spec, num_blocks, device=problem.q.device).views[0]
    scales = [torch.empty(num_blocks, BLOCK, HKV, device=problem.q.device) for _ in range(2)]
    rows = [c.reshape(num_blocks * BLOCK, HKV, HEAD) for c in (problem.k_cache, problem.v_cache)]
    slots = torch.arange(num_blocks * BLOCK, device=problem.q.device)
    store_kv(*rows, views["k"], views["v"], slots, k_scale=scales[0], v_scale=scales[1])
    return views["k"], views["v"], *scales


def fp8_kv_bytes(batch: int, context: int) -> int:
    """Bytes an FP8 decode must read: every token's K and V codes and their fp32 scales, per KV head."""
    return 2 * batch * context * HKV * (HEAD + 4)


def contiguous_kv(problem: Problem) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V gathered through the block tables into contiguous [B, HKV, context, HEAD] (SDPA's layout)."""
    table = problem.block_table.long()
    return tuple(c[table].flatten(1, 2).transpose(1, 2).contiguous() for c in (problem.k_cache, problem.v_cache))


@dataclasses.dataclass(frozen=True)
class PrefillProblem:
    q: torch.Tensor  # [B * new, HQ, HEAD], sequence b's tokens at rows cu_seqlens[b] : cu_seqlens[b + 1]
    k_cache: torch.Tensor  # [num_blocks, BLOCK, HKV, HEAD], NHD, the new tokens' K/V already stored
    v_cache: torch.Tensor
    block_table: torch.Tensor  # int32 [B, new / BLOCK]
    seq_lens: torch.Tensor  # int32 [B], all `new` (no cached prefix)
    cu_seqlens: torch.Tensor  # int32 [B + 1]
    scale: float

    @property
    def args(self) -> tuple:
        """The positional arguments of `paged_prefill_mirror` (then tile_n) and of the kernel's launcher."""
        return (self.q, self.k_cache, self.v_cache, self.block_table, self.seq_lens, self.cu_seqlens, self.scale)


def make_prefill_problem(batch: int, new: int, device: str, seed: int = 0) -> PrefillProblem:
    """`batch` sequences of `new` tokens each, no cached prefix: the decode problem's cache and block tables
    (make_problem at context = new) holding the new tokens' K/V, and q for every new token."""
    cache = make_problem(batch, new, device, num_splits=1, seed=seed)
    generator = torch.Generator(device=device).manual_seed(seed + 1)
    q = torch.randn(batch * new, HQ, HEAD, dtype=torch.bfloat16, device=device, generator=generator)
    cu = torch.arange(0, (batch + 1) * new, new, dtype=torch.int32, device=device)
    return PrefillProblem(q, cache.k_cache, cache.v_cache, cache.block_table, cache.seq_lens, cu, cache.scale)
