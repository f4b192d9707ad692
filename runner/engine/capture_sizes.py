"""Decode CUDA-graph capture sizes: the batch sizes a decode graph is recorded for (after vLLM's
`_set_cudagraph_sizes`; nano-vllm also captures decode-only graphs).

sizes = [1, 2, 4] + range(8, 256, 8) + range(256, cap + 1, 16), those <= cap, plus cap itself, where
cap = min(1024 on a Blackwell-family GPU else 512, max_num_seqs, max_num_batched_tokens).
- 1024 vs 512: vLLM raised its default cap to 1024 for data-center Blackwell (PR #49390: large decode
  batches there were bound by launch overhead). vLLM tests capability 10.x only; this runner takes the
  Blackwell FAMILY, which `kernels.platform` defines as 10.x, 11.x and 12.x (consumer RTX 50 included).
- A decode step has one token per request, so a batch never exceeds max_num_seqs (nor the token budget):
  larger graphs would never replay. vLLM's cap uses 2 * max_num_seqs (room for spec decode); this runner
  has no spec decode, so max_num_seqs itself.
- cap is appended when the ladder misses it (e.g. max_num_seqs = 100: ...96, 100), so every possible decode
  batch has a graph; vLLM appends max_num_batched_tokens for the same reason.
At run time a batch of n is padded up to `padded_batch_size(n, sizes)`; larger than the last size runs
eagerly. The platform is read at call time through `kernels.platform.current_platform` (tests replace it).
"""

from __future__ import annotations

import kernels.platform as platform_mod

BLACKWELL_MAX = 1024
DEFAULT_MAX = 512


def max_capture_size(
    max_num_seqs: int, max_num_batched_tokens: int, platform: platform_mod.Platform | None = None
) -> int:
    for name, value in (("max_num_seqs", max_num_seqs), ("max_num_batched_tokens", max_num_batched_tokens)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}: must be an int >= 1, got {value!r}")
    platform = platform if platform is not None else platform_mod.current_platform
    default = BLACKWELL_MAX if platform.is_family("blackwell") else DEFAULT_MAX
    return min(default, max_num_seqs, max_num_batched_tokens)


def capture_sizes(
    max_num_seqs: int, max_num_batched_tokens: int, platform: platform_mod.Platform | None = None
) -> list[int]:
    """Sorted decode batch sizes to capture (ascending; capture largest-first to share one memory pool)."""
    cap = max_capture_size(max_num_seqs, max_num_batched_tokens, platform)
    ladder = [1, 2, 4, *range(8, 256, 8), *range(256, cap + 1, 16)]
    sizes = [s for s in ladder if s <= cap]
    if sizes[-1] != cap:
        sizes.append(cap)
    return sizes


def padded_batch_size(n: int, sizes: list[int]) -> int | None:
    """The smallest captured size >= n, or None (run eagerly) when n exceeds them all."""
    if n < 1:
        raise ValueError(f"n: must be >= 1, got {n}")
    for size in sizes:
        if size >= n:
            return size
    return None
