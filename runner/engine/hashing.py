"""Chained block hashes for prefix caching (as vLLM's `hash_block_tokens` and nano-vllm's block hashes).

hash(block j) = sha256(parent || tokens of block j), parent = hash(block j - 1), and for block 0 the fixed
`NONE_HASH`. So a block's hash fingerprints the whole prefix up to and including it: two requests share a
block only if every earlier token is equal too. Only FULL blocks are hashed (a partial block's contents are
still changing).

Encoding (fixed, so hashes are reproducible across processes and machines, unlike Python's `hash` or a
per-process random seed): parent's 32 digest bytes, then each token id as a little-endian signed int64.
sha256 rather than a faster 64-bit hash: a collision would silently serve another prompt's KV, and at
2^-128 collision odds no token-equality guard is needed (vLLM's default is sha256 for the same reason).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

BlockHash = bytes

# The parent of the first block: a fixed constant, not random per process (vLLM's "vllm-none-hash" idea).
NONE_HASH: BlockHash = hashlib.sha256(b"touchstone-none-hash").digest()


def hash_block_tokens(parent: BlockHash | None, token_ids: Sequence[int]) -> BlockHash:
    """sha256(parent or NONE_HASH || int64-LE tokens)."""
    parent = NONE_HASH if parent is None else parent
    if not isinstance(parent, bytes) or len(parent) != len(NONE_HASH):
        raise ValueError(f"parent: must be a {len(NONE_HASH)}-byte block hash, got {parent!r}")
    try:
        payload = struct.pack(f"<{len(token_ids)}q", *token_ids)
    except struct.error as err:
        raise ValueError(f"token_ids: must be ints in int64 range, got {list(token_ids)[:8]}...") from err
    return hashlib.sha256(parent + payload).digest()


def extend_block_hashes(hashes: list[BlockHash], token_ids: Sequence[int], block_size: int) -> list[BlockHash]:
    """Append to `hashes` (the chain of `token_ids`' first len(hashes) full blocks) the hashes of every
    block that is now full; returns `hashes`. Incremental: each block is hashed once per request."""
    if block_size < 1:
        raise ValueError(f"block_size: must be >= 1, got {block_size}")
    for j in range(len(hashes), len(token_ids) // block_size):
        parent = hashes[j - 1] if j else None
        hashes.append(hash_block_tokens(parent, token_ids[j * block_size : (j + 1) * block_size]))
    return hashes


def block_hashes(token_ids: Sequence[int], block_size: int) -> list[BlockHash]:
    """The chained hashes of every full block of `token_ids`."""
    return extend_block_hashes([], token_ids, block_size)
