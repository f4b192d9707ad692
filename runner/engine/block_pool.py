"""The block pool: every KV-cache block, the free queue, and the hash -> block map of the prefix cache.

Design (after vLLM v1's `BlockPool` / `FreeKVCacheBlockQueue`; facts only, own code):
- `KVCacheBlock` objects carry their own free-queue links, so the queue is an intrusive doubly linked list
  with sentinel head and tail: append, prepend, popleft and remove-from-the-middle are all O(1) and allocate
  nothing (a deque's `.remove` is O(n): nano-vllm's cost on every cache hit).
- Block 0 is the null block: taken out of the queue at start, never handed out, never freed. The model
  runner pads block tables with it, so a padded row points at a real (harmless) block.
- Queue order is eviction order. `free_blocks` gets a request's blocks tail first; a block reaching ref 0
  goes to the BACK if hashed (it may be hit again, and is evicted least-recently-freed first: LRU) and to
  the FRONT if not (nothing to keep: reuse it first). Freeing tail first puts a chain's tail ahead of its
  head, so eviction eats prefixes from the end and the surviving hashes stay a usable prefix.
- `get_new_blocks` pops from the front; a popped block that still carries a hash is evicted from the map.
- A hit on a block with ref 0 (`touch`) pulls it out of the queue; ref counts count the requests using it.
- A hash maps to one block. If two requests computed the same full block independently (both scheduled
  before either was cached), the second stays unhashed and is reused first when freed.

Invariants (checked by `check_invariants`, used by the tests): every non-null block is either in the free
queue with ref 0 or out of it with ref > 0; the map and the blocks' hashes agree; the null block is in
neither.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from runner.engine.hashing import BlockHash


class KVCacheBlock:
    __slots__ = ("block_hash", "block_id", "is_null", "next_free", "prev_free", "ref_cnt")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: BlockHash | None = None
        self.prev_free: KVCacheBlock | None = None
        self.next_free: KVCacheBlock | None = None
        self.is_null = False

    def __repr__(self) -> str:
        tag = self.block_hash.hex()[:8] if self.block_hash else "-"
        return f"KVCacheBlock({self.block_id}, ref={self.ref_cnt}, hash={tag})"


class FreeBlockQueue:
    """Intrusive doubly linked list of blocks; front = next to hand out / evict."""

    def __init__(self, blocks: Iterable[KVCacheBlock]) -> None:
        self._head = KVCacheBlock(-1)
        self._tail = KVCacheBlock(-1)
        self._head.next_free, self._tail.prev_free = self._tail, self._head
        self.num_free = 0
        for block in blocks:
            self.append(block)

    def _link(self, block: KVCacheBlock, prev: KVCacheBlock, nxt: KVCacheBlock) -> None:
        if block.prev_free is not None or block.next_free is not None:
            raise ValueError(f"block: {block} is already in the free queue")
        block.prev_free, block.next_free = prev, nxt
        prev.next_free = block
        nxt.prev_free = block
        self.num_free += 1

    def append(self, block: KVCacheBlock) -> None:
        self._link(block, self._tail.prev_free, self._tail)

    def prepend(self, block: KVCacheBlock) -> None:
        self._link(block, self._head, self._head.next_free)

    def remove(self, block: KVCacheBlock) -> None:
        if block.prev_free is None or block.next_free is None:
            raise ValueError(f"block: {block} is not in the free queue")
        block.prev_free.next_free = block.next_free
        block.next_free.prev_free = block.prev_free
        block.prev_free = block.next_free = None
        self.num_free -= 1

    def popleft(self) -> KVCacheBlock:
        block = self._head.next_free
        if block is self._tail:
            raise ValueError("no free blocks")
        self.remove(block)
        return block

    def __iter__(self) -> Iterator[KVCacheBlock]:
        block = self._head.next_free
        while block is not self._tail:
            yield block
            block = block.next_free

    def __len__(self) -> int:
        return self.num_free


class BlockPool:
    def __init__(self, num_blocks: int, enable_caching: bool = True) -> None:
        if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks < 2:
            raise ValueError(f"num_blocks: must be an int >= 2 (block 0 is the null block), got {num_blocks!r}")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        self.free_queue = FreeBlockQueue(self.blocks)
        self.null_block = self.free_queue.popleft()
        self.null_block.is_null = True
        self.cached: dict[BlockHash, KVCacheBlock] = {}

    @property
    def num_free_blocks(self) -> int:
        return self.free_queue.num_free

    @property
    def usage(self) -> float:
        """Fraction of the usable blocks (all but the null block) held by requests."""
        return 1.0 - self.num_free_blocks / (self.num_blocks - 1)

    def get_cached_block(self, block_hash: BlockHash) -> KVCacheBlock | None:
        return self.cached.get(block_hash)

    def get_new_blocks(self, n: int) -> list[KVCacheBlock]:
        """`n` blocks from the front of the free queue (evicting their cached hashes), each with ref 1."""
        if n > self.num_free_blocks:
            raise ValueError(f"n: {n} blocks requested, {self.num_free_blocks} free")
        out = []
        for _ in range(n):
            block = self.free_queue.popleft()
            self._evict(block)
            block.ref_cnt = 1
            out.append(block)
        return out

    def _evict(self, block: KVCacheBlock) -> None:
        if block.block_hash is not None:
            if self.cached.get(block.block_hash) is block:
                del self.cached[block.block_hash]
            block.block_hash = None

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """A request hit these cached blocks: take the free ones out of the queue; one more reference each."""
        for block in blocks:
            if block.is_null:
                raise ValueError("blocks: the null block cannot be shared")
            if block.ref_cnt == 0:
                self.free_queue.remove(block)
            block.ref_cnt += 1

    def free_blocks(self, ordered: Iterable[KVCacheBlock]) -> None:
        """Drop one reference of each block, in the given order (callers pass a request's blocks tail first).
        At ref 0: hashed blocks to the back of the queue (LRU), unhashed to the front (reused first)."""
        for block in ordered:
            if block.is_null or block.ref_cnt <= 0:
                raise ValueError(f"blocks: {block} is not held")
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                if block.block_hash is None:
                    self.free_queue.prepend(block)
                else:
                    self.free_queue.append(block)

    def cache_full_blocks(self, blocks: list[KVCacheBlock], hashes: list[BlockHash], start: int, end: int) -> None:
        """Register blocks[start:end] (now full, their K/V written) under hashes[start:end]."""
        if not self.enable_caching:
            return
        if end > len(hashes) or end > len(blocks):
            raise ValueError(f"end: {end} blocks to cache, but {len(blocks)} blocks and {len(hashes)} hashes")
        for block, block_hash in zip(blocks[start:end], hashes[start:end], strict=True):
            if block.block_hash is not None:
                if block.block_hash != block_hash:
                    raise ValueError(f"blocks: {block} already cached under another hash")
                continue
            if block_hash not in self.cached:  # else an equal block is cached already: keep this one private
                block.block_hash = block_hash
                self.cached[block_hash] = block

    def check_invariants(self) -> None:
        """Raise AssertionError if the pool's bookkeeping is inconsistent (tests call this after every step)."""
        queued = list(self.free_queue)
        queued_ids = [b.block_id for b in queued]
        assert len(queued_ids) == len(set(queued_ids)) == self.free_queue.num_free, "free queue corrupt"
        assert self.null_block not in queued and self.null_block.block_hash is None, "null block leaked"
        queued_set = set(queued_ids)
        for block in self.blocks[1:]:
            if block.block_id in queued_set:
                assert block.ref_cnt == 0, f"{block} is free and used"
            else:
                assert block.ref_cnt > 0, f"{block} is neither free nor used (leaked)"
            if block.block_hash is not None:
                assert self.cached.get(block.block_hash) is block, f"{block} hash not in the map"
        for block_hash, block in self.cached.items():
            assert block.block_hash == block_hash and not block.is_null, "hash map disagrees with blocks"
