"""How many KV-cache blocks fit: from a memory fraction, what is already used, and a block's bytes.

    budget    = floor(total_bytes * memory_fraction) - used_bytes
    num_blocks = budget // bytes_per_block           (the null block 0 included: usable = num_blocks - 1)
    bytes_per_block = page_bytes of one layer's block * num_layers  (K and V together: the spec's page)

- total_bytes: the device's memory (torch.cuda.mem_get_info()[1]).
- used_bytes: everything that must stay resident besides the KV cache, measured after the weights are
  loaded and one warm-up step of the largest batch has run: what other processes and the CUDA context hold
  (total - free - torch's reserved) plus torch's PEAK allocated bytes (the weights still allocated + the
  warm-up's activation peak on top of them). Memory torch reserved but no longer uses is not counted: the
  KV allocation reuses it. nano-vllm's `total * util - used - peak + current` (serving-runner.md §1.5)
  counts that reserve as used as well (its `used` = total - free), so it is the more conservative of the
  two by at most the allocator's cache. `measured_usage` computes the figure from torch's counters.
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


def num_kv_blocks(total_bytes: int, used_bytes: int, memory_fraction: float, block_bytes: int,
                  max_blocks: int | None = None) -> int:
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
            f"{block_bytes} bytes, need at least 2 (null block + 1); raise the fraction or shrink the model")
    return blocks


def measured_usage(device: torch.device | str) -> tuple[int, int]:
    """(total_bytes, used_bytes) of a CUDA device, after loading and a warm-up step (see module doc)."""
    device = torch.device(device)
    free, total = torch.cuda.mem_get_info(device)
    stats = torch.cuda.memory_stats(device)
    others = total - free - stats.get("reserved_bytes.all.current", 0)  # other processes, the CUDA context
    return total, others + stats.get("allocated_bytes.all.peak", 0)
