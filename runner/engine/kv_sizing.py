"""How many KV-cache blocks fit: from a memory fraction, what is already used, and a block's bytes.

    budget    = floor(total_bytes * memory_fraction) - used_bytes
    num_blocks = budget // bytes_per_block           (the null block 0 included: usable = num_blocks - 1)
    bytes_per_block = page_bytes of one layer's block * num_layers  (K and V together: the spec's page)

- total_bytes: the device's memory (torch.cuda.mem_get_info()[1]).
- used_bytes: everything that must stay resident besides the KV cache, measured after the weights are
  loaded and one warm-up step of the largest batch has run: what other processes and the CUDA context hold
  (total - free - torch's reserved) plus torch's PEAK allocated bytes (the weights still allocated + the
  warm-up's activation peak on top of them). Memory torch reserved but no longer uses is not counted: the
  KV allocation reuses it. nano-vllm's `total * util - used - peak + current` (its model runner's KV sizing)
  counts that reserve as used as well (its `used` = total - free), so it is the more conservative of the
  two by at most the allocator's cache. `measured_usage` computes the figure from torch's counters.
- graph_reserve: with decode CUDA graphs, their memory pool, allocated AFTER the KV cache (a graph bakes in
  the cache's addresses, so capture cannot come first) and held for the engine's life. It holds about one
  decode forward's activations at the largest capture size (<= the token budget; the sizes share one pool).
  The reserve is the warm-up's whole activation peak (peak allocated - allocated before the warm-up), i.e.
  a forward of the FULL token budget plus the logits and sampler temporaries of max_num_seqs rows: an upper
  bound on the pool (per-token activations are the same, a decode has fewer tokens; the decode kernel's
  split buffers, B x Hq x D fp32, are smaller than one MLP intermediate row). Simple and safe over exact: for
  SmolLM2-135M at a 16k budget it is a few hundred MB out of ~125 GB of KV (< 0.5 %); measuring the pool
  itself would need a capture over a throw-away cache first.
- memory_fraction: of the whole device this process may fill (vLLM's gpu_memory_utilization, default 0.92;
  nano-vllm 0.9). It caps the process, not the KV cache alone.
Fewer than 2 blocks (the null block and one usable) is an error that names the numbers, not a silent 0.
"""

from __future__ import annotations

import torch

from reference.kv.spec import CacheSpec


def bytes_per_block(spec: CacheSpec, num_layers: int) -> int:
    """Bytes one block id costs across all `num_layers` layers (each layer's page of `spec`)."""
    return spec.buffer_bytes(1, num_layers)


def num_kv_blocks(
    total_bytes: int, used_bytes: int, memory_fraction: float, block_bytes: int, max_blocks: int | None = None
) -> int:
    if not 0 < memory_fraction <= 1:
        raise ValueError(f"memory_fraction: must be in (0, 1], got {memory_fraction}")
    for name, value in (("total_bytes", total_bytes), ("used_bytes", used_bytes), ("block_bytes", block_bytes)):
        if isinstance(value, bool) or not isinstance(value, int) or value < (1 if name == "block_bytes" else 0):
            raise ValueError(f"{name}: must be a non-negative int (block_bytes >= 1), got {value!r}")
    budget = int(total_bytes * memory_fraction) - used_bytes
    blocks = max(budget, 0) // block_bytes
    if max_blocks is not None:
        blocks = min(blocks, max_blocks)
    if blocks < 2:
        raise ValueError(
            f"memory_fraction: {memory_fraction} of {total_bytes / 2**30:.2f} GiB leaves "
            f"{budget / 2**30:.3f} GiB after {used_bytes / 2**30:.2f} GiB in use: {blocks} blocks of "
            f"{block_bytes} bytes, need at least 2 (null block + 1); raise the fraction or shrink the model"
        )
    return blocks


def measured_usage(device: torch.device | str, graph_reserve_from: int | None = None) -> tuple[int, int]:
    """(total_bytes, used_bytes) of a CUDA device, after loading and a warm-up step (see module doc).
    `graph_reserve_from`: bytes allocated before the warm-up (decode graphs on): the warm-up's activation
    peak above it is counted once more, as the graph pool's reserve."""
    device = torch.device(device)
    free, total = torch.cuda.mem_get_info(device)
    stats = torch.cuda.memory_stats(device)
    others = total - free - stats.get("reserved_bytes.all.current", 0)  # other processes, the CUDA context
    peak = stats.get("allocated_bytes.all.peak", 0)
    reserve = 0 if graph_reserve_from is None else max(peak - graph_reserve_from, 0)
    return total, others + peak + reserve
