"""Paged attention for the runner's models: store this step's K/V into the paged cache, then attend.

One forward step covers B sequences; sequence b brings the new tokens at rows cu_seqlens_q[b] :
cu_seqlens_q[b + 1] of the step and, after the store, has seq_lens[b] tokens in the cache (a cached prefix,
then the new ones; block_table[b] says where they lie). Prefill of several sequences with or without a cached
prefix and decode are the same call; `is_decode` (every sequence has exactly one new token) picks the decode
kernel on the GPU.

Which implementation runs:
- CUDA, bf16/fp16 model: the Triton kernels (kernels.kv_store, kernels.paged_prefill, kernels.paged_decode).
  Eager calls go to the kernels' launchers, not through their `torch.ops.touchstone` ops: the runner never
  traces (its CUDA graphs capture the launches), and the dispatcher's path into a Python custom op cost
  ~28 us a call on the H200 (RMSNorm: 60 us through the op, 32 us to the launcher), ~150 calls a prefill
  forward of SmolLM2; an 8192-token prefill step's model phase went from 42.7 to 33.2 ms without it. The
  decode kernel is called through its op: decode runs as CUDA-graph replays.
- anything else (the CPU, an fp32 model): reference.kv.store.store_kv and the fp64 definition
  reference.attention.paged.paged_attention_ideal, rounded once to the model's dtype. The CPU path is the
  slow exact one on purpose: it is what the HF-parity test runs.
Caches are the "k"/"v" views of reference.kv.allocate (FullAttentionSpec, NHD): [num_blocks, block_size,
Hkv, D], the model's dtype.
"""

from __future__ import annotations

import dataclasses

import torch

from reference.attention.paged import paged_attention_ideal
from reference.kv.store import store_kv as reference_store_kv

KERNEL_DTYPES = (torch.bfloat16, torch.float16)
# Split-K factor of the decode kernel. Untuned (no GPU measurement from this helper): 1 split is right for
# many sequences with short contexts (the W1 batch); bench/attention's paged-decode sweep is where to tune it.
DECODE_SPLITS = 1


@dataclasses.dataclass
class AttentionBatch:
    """One forward step's attention metadata, built by the model runner (the contract in runner_common)."""

    slot_mapping: torch.Tensor  # int64 [T]: cache slot of each new token (block * block_size + offset); -1 = pad
    block_table: torch.Tensor  # int32 [B, max_blocks]
    seq_lens: torch.Tensor  # int32 [B]: tokens in cache after this step (prefix + new)
    cu_seqlens_q: torch.Tensor  # int32 [B + 1]: new tokens of sequence b are rows cu[b]:cu[b+1] of the step
    is_decode: bool  # every sequence has exactly one new token
    logits_indices: torch.Tensor  # int64 [B]: row of each sequence's last new token (the one to sample from)


def make_batch(
    block_tables: list[list[int]],
    seq_lens: list[int],
    query_lens: list[int],
    block_size: int,
    device: torch.device | str = "cpu",
) -> AttentionBatch:
    """An AttentionBatch from per-sequence lists (tests and simple drivers): sequence b has seq_lens[b] tokens
    after the step, the last query_lens[b] of them new, stored in the blocks block_tables[b] in order."""
    if not len(block_tables) == len(seq_lens) == len(query_lens):
        raise ValueError(
            f"block_tables, seq_lens, query_lens: need one entry per sequence, got "
            f"{len(block_tables)}, {len(seq_lens)}, {len(query_lens)}"
        )
    slots, cu = [], [0]
    for b, (table, length, n) in enumerate(zip(block_tables, seq_lens, query_lens, strict=True)):
        if not 1 <= n <= length <= len(table) * block_size:
            raise ValueError(
                f"seq_lens: sequence {b} needs 1 <= {n} new <= {length} tokens <= "
                f"{len(table) * block_size} (its blocks' capacity)"
            )
        slots += [table[p // block_size] * block_size + p % block_size for p in range(length - n, length)]
        cu.append(cu[-1] + n)
    width = max(len(t) for t in block_tables)
    table = torch.tensor([t + [0] * (width - len(t)) for t in block_tables], dtype=torch.int32, device=device)
    cu_t = torch.tensor(cu, dtype=torch.int32, device=device)
    return AttentionBatch(
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        block_table=table,
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        cu_seqlens_q=cu_t,
        is_decode=all(n == 1 for n in query_lens),
        logits_indices=(cu_t[1:] - 1).to(torch.int64),
    )


def uses_kernels(q: torch.Tensor) -> bool:
    return q.device.type == "cuda" and q.dtype in KERNEL_DTYPES


def paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    batch: AttentionBatch,
    scale: float,
) -> torch.Tensor:
    """Store k, v [T, Hkv, D] at batch.slot_mapping, then causal paged attention of q [T, Hq, D] over each
    sequence's cache; returns [T, Hq, D] in q's dtype."""
    if uses_kernels(q):
        from kernels.kv_store import launch_store_kv
        from kernels.paged_decode import paged_decode
        from kernels.paged_prefill import launch_paged_prefill

        launch_store_kv(k, v, k_cache, v_cache, batch.slot_mapping, "NHD", None, None)
        if batch.is_decode:
            return paged_decode(
                q, k_cache, v_cache, batch.block_table, batch.seq_lens, scale=scale, num_splits=DECODE_SPLITS
            )
        return launch_paged_prefill(q, k_cache, v_cache, batch.block_table, batch.seq_lens, batch.cu_seqlens_q, scale)
    reference_store_kv(k, v, k_cache, v_cache, batch.slot_mapping)
    cu = None if batch.is_decode else batch.cu_seqlens_q
    return paged_attention_ideal(q, k_cache, v_cache, batch.block_table, batch.seq_lens, scale, cu).to(q.dtype)
