"""Block pool and KV-cache manager: free-queue mechanics, LRU eviction, touch on hit, the n - 1 cap, and a
hypothesis state machine over requests that arrive, grow and leave, checking after every step that no block
is both free and used, the null block is never handed out, a cache hit always holds the tokens it was
found for (a shadow cache records what each slot holds), and that every reference returns at the end."""

from __future__ import annotations

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, rule

from runner.engine.block_pool import BlockPool, FreeBlockQueue, KVCacheBlock
from runner.engine.hashing import block_hashes
from runner.engine.kv_cache_manager import KVCacheManager
from runner.engine.sampling_params import SamplingParams
from runner.engine.sequence import Sequence

BS = 4


def ids(blocks):
    return [b.block_id for b in blocks]


def test_free_queue_is_a_linked_list_with_o1_middle_removal():
    blocks = [KVCacheBlock(i) for i in range(5)]
    q = FreeBlockQueue(blocks)
    q.remove(blocks[2])
    q.prepend(blocks[2])
    q.remove(blocks[4])
    assert ids(q) == [2, 0, 1, 3] and len(q) == 4
    assert q.popleft() is blocks[2] and blocks[2].prev_free is None and blocks[2].next_free is None
    with pytest.raises(ValueError, match="not in the free queue"):
        q.remove(blocks[2])
    with pytest.raises(ValueError, match="already in the free queue"):
        q.append(blocks[0])
    for _ in range(3):
        q.popleft()
    with pytest.raises(ValueError, match="no free blocks"):
        q.popleft()


def test_null_block_is_reserved():
    pool = BlockPool(4)
    assert pool.null_block.block_id == 0 and pool.null_block.is_null and pool.num_free_blocks == 3
    got = pool.get_new_blocks(3)
    assert 0 not in ids(got) and pool.num_free_blocks == 0
    with pytest.raises(ValueError, match="0 free"):
        pool.get_new_blocks(1)
    with pytest.raises(ValueError, match="not held"):
        pool.free_blocks([pool.null_block])
    with pytest.raises(ValueError, match="num_blocks"):
        BlockPool(1)


def test_free_order_hashed_to_back_unhashed_to_front_and_lru_eviction():
    pool = BlockPool(7)
    a = pool.get_new_blocks(3)  # 1 2 3
    b = pool.get_new_blocks(2)  # 4 5
    hashes = block_hashes(list(range(3 * BS)), BS)
    pool.cache_full_blocks(a, hashes, 0, 2)  # blocks 1, 2 hashed; 3 is a partial block
    pool.free_blocks(reversed(a))  # tail first: 3 (unhashed) to the front, then 2, 1 to the back
    assert ids(pool.free_queue) == [3, 6, 2, 1]
    other = block_hashes([9] * (2 * BS), BS)
    pool.cache_full_blocks(b, other, 0, 2)
    pool.free_blocks(reversed(b))
    assert ids(pool.free_queue) == [3, 6, 2, 1, 5, 4]
    # Eviction takes the front: the unhashed block, the never-used one, then the least recently freed chain
    # from its tail (2 before 1): the surviving cached blocks stay a usable prefix of their chain.
    taken = pool.get_new_blocks(3)
    assert ids(taken) == [3, 6, 2]
    assert pool.get_cached_block(hashes[1]) is None and pool.get_cached_block(hashes[0]) is a[0]
    assert taken[2].block_hash is None
    pool.check_invariants()


def test_touch_takes_a_free_cached_block_out_of_the_queue():
    pool = BlockPool(4)
    blocks = pool.get_new_blocks(1)
    h = block_hashes([1] * BS, BS)
    pool.cache_full_blocks(blocks, h, 0, 1)
    pool.touch(blocks)  # a second user while the first still holds it
    assert blocks[0].ref_cnt == 2
    pool.free_blocks(blocks)
    pool.free_blocks(blocks)
    assert blocks[0].ref_cnt == 0 and ids(pool.free_queue)[-1] == blocks[0].block_id
    pool.touch(blocks)  # a hit on a free cached block revives it
    assert blocks[0].ref_cnt == 1 and blocks[0].block_id not in ids(pool.free_queue)
    pool.check_invariants()
    with pytest.raises(ValueError, match="null block"):
        pool.touch([pool.null_block])


def seq_of(tokens, max_tokens=64):
    return Sequence(list(tokens), SamplingParams(max_tokens=max_tokens), block_size=BS)


def compute(kv, seq, n, hits=()):
    assert kv.allocate_slots(seq, n, list(hits))
    seq.num_computed_tokens += len(hits) * BS + n
    kv.cache_blocks(seq)


@pytest.mark.parametrize(("num_tokens", "expected_hit_blocks"), [(8, 1), (9, 2), (12, 2), (13, 3), (3, 0)])
def test_full_hit_capped_at_n_minus_1_on_a_block_boundary(num_tokens, expected_hit_blocks):
    kv = KVCacheManager(num_blocks=16, block_size=BS)
    first = seq_of(range(num_tokens))
    compute(kv, first, num_tokens)
    assert first.num_cached_blocks == num_tokens // BS
    again = seq_of(range(num_tokens))  # the very same prompt: everything is cached
    hits, num_hit = kv.get_computed_blocks(again)
    assert len(hits) == expected_hit_blocks and num_hit == expected_hit_blocks * BS < num_tokens
    assert hits == first.block_table[:expected_hit_blocks]
    compute(kv, again, num_tokens - num_hit, hits)
    assert [b.ref_cnt for b in again.block_table[:expected_hit_blocks]] == [2] * expected_hit_blocks


def test_hit_stops_at_the_first_differing_block_and_caching_off_never_hits():
    kv = KVCacheManager(num_blocks=16, block_size=BS)
    compute(kv, seq_of(range(16)), 16)
    hits, _ = kv.get_computed_blocks(seq_of([*range(8), 99, *range(9, 17)]))
    assert len(hits) == 2  # block 2 differs, so block 3 (same tokens, other prefix) is no hit either
    off = KVCacheManager(num_blocks=16, block_size=BS, enable_prefix_caching=False)
    compute(off, seq_of(range(16)), 16)
    assert off.get_computed_blocks(seq_of(range(16))) == ([], 0) and not off.pool.cached


def test_allocate_is_all_or_nothing_counting_touched_free_blocks():
    kv = KVCacheManager(num_blocks=5, block_size=BS)  # 4 usable
    done = seq_of(range(9))
    compute(kv, done, 9)  # 3 blocks, 2 cached
    kv.free(done)
    newcomer = seq_of(range(12))
    hits, _ = kv.get_computed_blocks(newcomer)
    assert len(hits) == 2
    filler = seq_of([7] * 8)
    assert kv.allocate_slots(filler, 8)  # takes the unhashed block 3 and the spare: 2 free left (the hits)
    assert kv.pool.num_free_blocks == 2
    assert not kv.allocate_slots(newcomer, 4, hits)  # needs the 2 hits out of the queue + 1 new
    assert newcomer.block_table == [] and kv.pool.num_free_blocks == 2 and all(b.ref_cnt == 0 for b in hits)
    kv.free(filler)
    assert kv.allocate_slots(newcomer, 4, hits)
    kv.pool.check_invariants()


def test_slot_mapping():
    kv = KVCacheManager(num_blocks=8, block_size=BS)
    s = seq_of(range(6))
    assert kv.allocate_slots(s, 6)
    assert [kv.slot(s, p) for p in range(6)] == [b * BS + o for b in s.block_ids[:2] for o in range(BS)][:6]


ALPHABET = st.integers(0, 2)  # few distinct tokens: prompts share prefixes, so the cache gets hits


class BlockPoolMachine(RuleBasedStateMachine):
    """Requests arrive (with prefix-cache lookups), grow by decode/chunk steps and leave, on a tiny cache."""

    requests = Bundle("requests")

    def __init__(self):
        super().__init__()
        self.kv = KVCacheManager(num_blocks=7, block_size=BS)
        self.live: list[Sequence] = []
        self.content: dict[int, int] = {}  # shadow cache: slot -> token written there
        self.cached_prefix: dict[bytes, tuple[int, ...]] = {}  # hash -> the prefix it was cached for

    def _write(self, seq, start, end):
        for p in range(start, end):
            self.content[self.kv.slot(seq, p)] = seq.token_ids[p]

    def _compute(self, seq, n, hits=()):
        start = seq.num_computed_tokens + len(hits) * BS
        seq.num_computed_tokens = start
        self._write(seq, start, start + n)
        seq.num_computed_tokens += n
        before = seq.num_cached_blocks
        self.kv.cache_blocks(seq)
        for j in range(before, seq.num_cached_blocks):
            block = seq.block_table[j]
            if block.block_hash is not None and seq.block_hashes[j] == block.block_hash:
                self.cached_prefix[block.block_hash] = tuple(seq.token_ids[: (j + 1) * BS])

    @rule(target=requests, prompt=st.lists(ALPHABET, min_size=1, max_size=14), chunk=st.integers(1, 14))
    def arrive(self, prompt, chunk):
        return self._arrive(prompt, chunk)

    @rule(target=requests, like=requests, cut=st.integers(0, 3), chunk=st.integers(1, 14))
    def repeat(self, like, cut, chunk):
        """A prompt equal to (a prefix of) an earlier request's tokens: full and partial hits."""
        return self._arrive(like.token_ids[: max(1, like.num_tokens - cut)], chunk)

    def _arrive(self, prompt, chunk):
        seq = seq_of(prompt)
        hits, num_hit = self.kv.get_computed_blocks(seq)
        assert num_hit % BS == 0 and num_hit <= seq.num_tokens - 1
        for j, block in enumerate(hits):  # a hit holds exactly this request's tokens
            assert not block.is_null and block.block_hash == seq.block_hashes[j]
            want = seq.token_ids[j * BS : (j + 1) * BS]
            assert [self.content[block.block_id * BS + o] for o in range(BS)] == want
        n = min(chunk, seq.num_tokens - num_hit)
        refs_before = [b.ref_cnt for b in hits]
        if not self.kv.allocate_slots(seq, n, hits):
            assert [b.ref_cnt for b in hits] == refs_before and seq.block_table == []
            return seq  # refused: holds nothing, stays out of `live`
        assert [b.ref_cnt for b in hits] == [r + 1 for r in refs_before]
        self._compute(seq, n, hits)
        self.live.append(seq)
        return seq

    @rule(seq=requests, tokens=st.lists(ALPHABET, max_size=5), chunk=st.integers(1, 8))
    def step(self, seq, tokens, chunk):
        if seq not in self.live:
            return
        for t in tokens:
            seq.append_token(t)
        if seq.num_uncomputed_tokens == 0:
            return
        n = min(chunk, seq.num_uncomputed_tokens)
        if self.kv.allocate_slots(seq, n):
            self._compute(seq, n)

    @rule(seq=consumes(requests))
    def leave(self, seq):
        if seq in self.live:
            self.live.remove(seq)
            self.kv.free(seq)
            assert seq.block_table == []

    @invariant()
    def pool_consistent(self):
        pool = self.kv.pool
        pool.check_invariants()
        held = [b for s in self.live for b in s.block_table]
        assert pool.null_block not in held
        for s in self.live:
            assert len(set(s.block_ids)) == len(s.block_ids)
            assert len(s.block_table) * BS >= s.num_computed_tokens
        # ref counts are exactly the number of live requests holding each block
        for block in pool.blocks[1:]:
            assert block.ref_cnt == sum(1 for b in held if b is block)
        assert pool.num_free_blocks + len({b.block_id for b in held}) == pool.num_blocks - 1

    @invariant()
    def hashes_chain_and_match_content(self):
        for block_hash, block in self.kv.pool.cached.items():
            prefix = self.cached_prefix[block_hash]
            assert block_hashes(prefix, BS)[-1] == block_hash  # the hash fingerprints the whole prefix
            assert [self.content[block.block_id * BS + o] for o in range(BS)] == list(prefix[-BS:])

    def teardown(self):
        for seq in self.live:
            self.kv.free(seq)
        pool = self.kv.pool
        pool.check_invariants()
        assert all(b.ref_cnt == 0 for b in pool.blocks) and pool.num_free_blocks == pool.num_blocks - 1


TestBlockPoolMachine = BlockPoolMachine.TestCase
