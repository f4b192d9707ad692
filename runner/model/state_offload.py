"""Mamba state offload for the tiny hybrid model: save states at aligned positions during prefill, keep them
in CPU memory keyed by the prefix hash of the aligned tokens, and restore them for a later request that shares
the prefix, under the boundary rule (reference.mamba.align.max_restorable_tokens).

Prefill runs in align mode (vLLM's `mamba_cache_mode="align"`): the prompt is cut by the block-aligned split
(reference.mamba.align.prefill_chunks) and the recurrent states are saved at the end of each chunk that lands on
a multiple of `align`. A stored block holds, for `align` tokens of the prompt:
- the attention KV of those tokens, every attention layer (stored alongside, as vLLM's offload connector stores
  every group's blocks, rather than recomputed), and
- the Mamba conv and SSM states after the block's last token, every Mamba layer, when a chunk ended there.
Keys chain: key(block j) = sha256(key(block j - 1) || token ids of block j), so a key names the whole prefix.

A request of n prompt tokens looks up the longest run of stored blocks whose last block carries Mamba states
and ends at most at max_restorable_tokens(n, align); it restores the KV of those blocks and the states of the
last one, then prefills the rest from there with the same block-aligned split a cold run uses. Because the
split depends only on where a chunk starts (and a saved boundary is where a cold chunk ended), the restored run
performs exactly the fp32 operations of the cold run from the boundary on: outputs are bit-identical.

If a hit reached the last prompt token (the fault "hit_includes_last_token"), the last token is still
computed for its logits: the run resumes at n - 1 with the attention KV cut to n - 1 tokens (recomputing a
token rewrites the same KV) but with recurrent states that already include token n - 1, as vLLM did before
PR #51100. Blocks completed during decode are not stored.
"""

from __future__ import annotations

import dataclasses
import hashlib

import torch

from reference.mamba.align import max_restorable_tokens, prefill_chunks
from runner.model.tiny_hybrid import AttentionKV, HybridStates, MambaState, TinyHybridModel, greedy_decode


def block_keys(tokens: list[int], align: int) -> list[bytes]:
    """Chained keys of the full `align`-token blocks of `tokens`."""
    keys, parent = [], b""
    for j in range(len(tokens) // align):
        block = tokens[j * align : (j + 1) * align]
        parent = hashlib.sha256(parent + b"".join(t.to_bytes(8, "little") for t in block)).digest()
        keys.append(parent)
    return keys


def _to_cpu(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu", copy=True)


@dataclasses.dataclass
class StoredBlock:
    kv: tuple[AttentionKV, ...]  # per attention layer: [1, align, heads, head_dim] each
    mamba: tuple[MambaState, ...] | None = None  # per Mamba layer, the states after this block


class PrefixStateStore:
    """CPU memory holding blocks of one model's states, keyed by the chained prefix key (no eviction)."""

    def __init__(self, align: int) -> None:
        if isinstance(align, bool) or not isinstance(align, int) or align < 1:
            raise ValueError(f"align: must be an integer >= 1, got {align!r}")
        self.align = align
        self.blocks: dict[bytes, StoredBlock] = {}

    def save(self, keys: list[bytes], states: HybridStates, start: int, end: int) -> None:
        """Store the blocks a prefill chunk [start, end) completed (KV from `states`, which hold every token up
        to `end`), and the Mamba states at `end` when `end` is a block boundary."""
        a = self.align
        for j in range(start // a, end // a):  # blocks whose last token lies in [start, end)
            kv = tuple(
                AttentionKV(_to_cpu(s.k[:, j * a : (j + 1) * a]), _to_cpu(s.v[:, j * a : (j + 1) * a]))
                for s in states.layers
                if isinstance(s, AttentionKV)
            )
            self.blocks.setdefault(keys[j], StoredBlock(kv))
        if end % a == 0 and end > start:
            block = self.blocks[keys[end // a - 1]]
            if block.mamba is None:
                block.mamba = tuple(
                    MambaState(_to_cpu(s.conv), _to_cpu(s.ssm)) for s in states.layers if isinstance(s, MambaState)
                )

    def lookup(self, keys: list[bytes], max_tokens: int) -> int:
        """Longest restorable prefix in tokens: a run of stored blocks from the start whose last block carries
        Mamba states, ending at most at `max_tokens`."""
        hit = 0
        for j, key in enumerate(keys[: max_tokens // self.align]):
            block = self.blocks.get(key)
            if block is None:
                break
            if block.mamba is not None:
                hit = (j + 1) * self.align
        return hit

    def load(self, model: TinyHybridModel, keys: list[bytes], hit: int, num_tokens: int) -> HybridStates:
        """States for resuming at `num_tokens` (<= hit) from the blocks of the first `hit` tokens: KV of the first
        `num_tokens` tokens, the Mamba states after `hit` tokens."""
        blocks = [self.blocks[k] for k in keys[: hit // self.align]]
        kv = iter(zip(*(b.kv for b in blocks), strict=True))
        mamba = iter(blocks[-1].mamba)
        layers = []
        for t in model.config.layer_types:
            if t == "attention":
                parts = next(kv)
                layers.append(
                    AttentionKV(
                        torch.cat([p.k for p in parts], dim=1)[:, :num_tokens].clone(),
                        torch.cat([p.v for p in parts], dim=1)[:, :num_tokens].clone(),
                    )
                )
            else:
                state = next(mamba)
                layers.append(MambaState(state.conv.clone(), state.ssm.clone()))
        return HybridStates(num_tokens, tuple(layers))


@dataclasses.dataclass(frozen=True)
class OffloadRun:
    tokens: torch.Tensor  # [max_new_tokens] greedy tokens
    logits: torch.Tensor  # [max_new_tokens, vocab] the logits each token was chosen from
    hit_tokens: int  # prompt tokens whose states were restored (0: cold)
    chunks: tuple[tuple[int, int], ...]  # the prefill chunks run


def generate_with_offload(
    model: TinyHybridModel,
    prompt: list[int],
    store: PrefixStateStore,
    *,
    max_new_tokens: int,
    token_budget: int,
    fault: str = "none",
) -> OffloadRun:
    """Greedy generation for one request through `store`: restore the longest allowed prefix, prefill the rest
    in block-aligned chunks of at most `token_budget` tokens (saving blocks and states into `store`), decode."""
    if not isinstance(prompt, list) or not prompt or not all(isinstance(t, int) for t in prompt):
        raise TypeError("prompt: must be a non-empty list of token ids")
    n, a = len(prompt), store.align
    keys = block_keys(prompt, a)
    hit = store.lookup(keys, max_restorable_tokens(n, a, fault))
    start = min(hit, n - 1)  # the last prompt token is always computed, for its logits
    states = store.load(model, keys, hit, start) if hit else None
    chunks = tuple(prefill_chunks(n, start, token_budget, a))
    for s, e in chunks:
        logits, states = model.prefill(torch.tensor([prompt[s:e]]), states)
        store.save(keys, states, s, e)
    tokens, chosen = greedy_decode(model, logits[:, -1], states, max_new_tokens)
    return OffloadRun(tokens[0], chosen[0], hit, chunks)
