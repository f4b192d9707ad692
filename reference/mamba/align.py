"""Where Mamba (recurrent) states are saved and restored when prefix caching or CPU offload is on: the align
size, the cache modes, the block-aligned split of a prefill chunk, the hybrid block size, and the boundary rule
of an offload hit, after vLLM's `Platform._align_hybrid_block_size`, `mamba_cache_mode`,
`Scheduler._mamba_block_aligned_split` and `resolve_mamba_align_size`.

A recurrent layer has one state per request, not one per token: a prefix can only be reused where a state was
saved, and a saved state is "the state after exactly `position` tokens". States are saved at block boundaries
(vLLM: "slot p holds the state after exactly (p + 1) * block_size tokens"), so hits are multiples of the align
size, and the prefill of a prompt is cut so that its chunks end on those boundaries.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence

from reference.kv.hybrid import MambaSpec, unify_attention_mamba
from reference.kv.spec import CacheSpec, check_count

# vLLM's `mamba_cache_mode` values: "none" = prefix caching off (one running state per request), "align" = the
# state at the end of each scheduler step that lands on a block boundary, "all" = the state at every block
# boundary (deprecated by vLLM PR #55041).
CACHE_MODES = ("none", "align", "all")
# Planted bugs of the boundary rule, for the offload suite's negative control only.
FAULTS = ("none", "hit_includes_last_token")


@dataclasses.dataclass(frozen=True, kw_only=True)
class CacheGroup:
    """One KV-cache group as the offload connector sees it: GPU blocks of `tokens_per_block` tokens, offloaded
    `blocks_per_chunk` at a time. `mamba_cache_mode` is None for attention groups."""

    tokens_per_block: int
    blocks_per_chunk: int = 1
    mamba_cache_mode: str | None = None

    def __post_init__(self) -> None:
        check_count("tokens_per_block", self.tokens_per_block)
        check_count("blocks_per_chunk", self.blocks_per_chunk)
        if self.mamba_cache_mode is not None and self.mamba_cache_mode not in CACHE_MODES:
            raise ValueError(f"mamba_cache_mode: must be None or one of {CACHE_MODES}, got {self.mamba_cache_mode!r}")


def resolve_mamba_align_size(groups: Iterable[CacheGroup]) -> int | None:
    """Tokens between two restorable Mamba states: tokens_per_block * blocks_per_chunk of every Mamba group in
    "align" or "all" mode (vLLM since PR #51100; before it, "align" only). Those groups must agree (ValueError
    otherwise); None when there is no such group (attention only, or Mamba with caching off)."""
    sizes = set()
    for i, group in enumerate(groups):
        if not isinstance(group, CacheGroup):
            raise TypeError(f"groups: item {i} must be a CacheGroup, got {type(group).__name__}")
        if group.mamba_cache_mode in ("align", "all"):
            sizes.add(group.tokens_per_block * group.blocks_per_chunk)
    if len(sizes) > 1:
        raise ValueError(f"groups: Mamba groups disagree on the align size: {sorted(sizes)}")
    return sizes.pop() if sizes else None


def round_down(n: int, multiple: int) -> int:
    return n - n % multiple


def max_restorable_tokens(num_tokens: int, align: int, fault: str = "none") -> int:
    """The boundary rule: an offload (or prefix-cache) hit for a request of `num_tokens` tokens may restore
    recurrent state up to at most round_down(num_tokens - 1, align) tokens.

    Why `- 1`: the last prompt token is always computed again, because its logits are what the request needs
    next. A restored recurrent state is "the state after exactly `hit` tokens". When the prompt ends exactly on
    a boundary (num_tokens = k * align), round_down(num_tokens, align) = num_tokens would restore a state that
    already contains the last token, and recomputing that token then applies the recurrence to it twice
    (state = f(f(state_{n-1}, x_{n-1}), x_{n-1}); the conv window shifts by a duplicate): silently different
    output (vLLM fixed it for "align" mode in PR #44599 and for "all" mode in PR #51100, issue #51094).
    Attention does not have this bug (recomputing a token overwrites its KV with the same values), which is why
    capping the hit at num_tokens - 1 in *tokens* looked sufficient. Capping first and rounding down afterwards
    keeps the hit on a saved boundary: num_tokens = 32, align 16: cap 31 -> hit 16, recompute tokens 16..31;
    num_tokens = 33: cap 32 -> hit 32, recompute token 32.

    `fault="hit_includes_last_token"` plants the bug (round_down(num_tokens, align)): negative controls only.
    """
    check_count("num_tokens", num_tokens)
    check_count("align", align)
    if fault not in FAULTS:
        raise ValueError(f"fault: must be one of {FAULTS}, got {fault!r}")
    if fault == "hit_includes_last_token":
        return round_down(num_tokens, align)
    return round_down(num_tokens - 1, align)


def saved_state_positions(mode: str, block_size: int, step_ends: Sequence[int]) -> tuple[int, ...]:
    """Token counts after which a request's state is kept, given the token count reached by each scheduler step
    (`step_ends`, increasing). "none": no state is kept for reuse; "align": the end of a step when it is a
    multiple of block_size; "all": every multiple of block_size up to the last step's end."""
    if mode not in CACHE_MODES:
        raise ValueError(f"mode: must be one of {CACHE_MODES}, got {mode!r}")
    check_count("block_size", block_size)
    ends = list(step_ends)
    if any(b <= a for a, b in zip([0, *ends], ends, strict=False)):
        raise ValueError(f"step_ends: must be positive and increasing, got {ends}")
    if mode == "none" or not ends:
        return ()
    if mode == "align":
        return tuple(e for e in ends if e % block_size == 0)
    return tuple(range(block_size, ends[-1] + 1, block_size))


def mamba_block_aligned_split(
    *,
    num_tokens: int,
    num_prompt_tokens: int,
    num_computed_tokens: int,
    num_new_tokens: int,
    block_size: int,
    use_eagle: bool = False,
) -> int:
    """How many of `num_new_tokens` (the token budget offered to the request this step) align mode schedules,
    so that a state lands on every block boundary it will want to cache (vLLM `_mamba_block_aligned_split`).

    Only while prefilling (num_computed_tokens < max(num_prompt_tokens, num_tokens - 1)); with
    last = num_tokens - num_tokens % block_size (one block earlier, floored at 0, with EAGLE) and
    end = num_computed_tokens + num_new_tokens:
    - end < last: the chunk length is rounded down to a multiple of block_size (0 = the budget cannot reach the
      next boundary; the request waits for a step with more budget);
    - num_computed_tokens < last < end: the chunk is cut to end exactly at last (the last full block's state
      is cached);
    - otherwise (the tail after the last boundary, or a chunk ending exactly on it): unchanged.
    The result depends only on where the chunk starts, so a run resumed from a saved boundary cuts the rest of
    the prompt exactly as a cold run does.
    """
    check_count("num_tokens", num_tokens)
    check_count("num_prompt_tokens", num_prompt_tokens)
    check_count("num_computed_tokens", num_computed_tokens, minimum=0)
    check_count("num_new_tokens", num_new_tokens, minimum=0)
    check_count("block_size", block_size)
    if num_computed_tokens >= max(num_prompt_tokens, num_tokens - 1):
        return num_new_tokens  # decoding: one token a step, nothing to align
    last = num_tokens - num_tokens % block_size
    if use_eagle:
        last = max(last - block_size, 0)
    end = num_computed_tokens + num_new_tokens
    if end < last:
        return round_down(num_new_tokens, block_size)
    if num_computed_tokens < last < end:
        return last - num_computed_tokens
    return num_new_tokens


def prefill_chunks(
    num_tokens: int, num_computed_tokens: int, token_budget: int, block_size: int
) -> list[tuple[int, int]]:
    """The [start, end) chunks a prompt of `num_tokens` tokens is prefilled in from `num_computed_tokens` on, one
    request alone with `token_budget` tokens a step, split by `mamba_block_aligned_split`."""
    check_count("token_budget", token_budget)
    chunks, start = [], num_computed_tokens
    while start < num_tokens:
        offered = min(token_budget, num_tokens - start)
        n = mamba_block_aligned_split(
            num_tokens=num_tokens,
            num_prompt_tokens=num_tokens,
            num_computed_tokens=start,
            num_new_tokens=offered,
            block_size=block_size,
        )
        if n == 0:
            raise ValueError(f"token_budget: {token_budget} tokens cannot reach the next {block_size}-token boundary")
        chunks.append((start, start + n))
        start += n
    return chunks


def hybrid_block_size(
    attention: CacheSpec, mamba: MambaSpec, *, kernel_block_alignment: int, checkpoint_alignment: int = 1
) -> tuple[int, int]:
    """(attention block size, padded Mamba page bytes) of a hybrid model (vLLM `_align_hybrid_block_size`,
    align mode): align = lcm(kernel block alignment, prefill checkpoint alignment), then
    block = align * cdiv(mamba page, align * attention bytes per token), never below the spec's own block size,
    and the Mamba page is padded to the attention page (reference.kv.hybrid.unify_attention_mamba). In the
    older "all" mode the checkpoint alignment is the Mamba chunk size (cdiv(cdiv(a, b), c) = cdiv(a, b * c))."""
    check_count("kernel_block_alignment", kernel_block_alignment)
    check_count("checkpoint_alignment", checkpoint_alignment)
    grown, padded = unify_attention_mamba(attention, mamba, math.lcm(kernel_block_alignment, checkpoint_alignment))
    return grown.block_size, padded.page_bytes
