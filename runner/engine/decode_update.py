"""The scheduler's update of a pure decode step (runner.engine.decode_schedule's columns): per row what
`Scheduler.update` does for a one-token row that samples, with each request's counters read once.

The general update costs ~1 us a row (property chains, `cache_blocks` and `extend_block_hashes` calls that
return at once 15 times in 16, a finish check through the params). Here:
- `cache_blocks` is called only when the computed tokens reach past the registered blocks (its own early
  return otherwise), the block hashes are extended only when the appended token fills a block (they always
  cover the full blocks of the known tokens, so that is the only time there is one more to hash);
- the finish check (`Scheduler._check_finished`, which decides the reason) runs only when the token is one of
  the request's finish ids (EOS unless ignore_eos, stop token ids), the request reached its length limit, or
  it has stop strings (the stop checker must see every token); otherwise that check finds nothing.
Rows of requests finished meanwhile (aborted, or ended by an earlier step's token) are skipped; a request
preempted while the step ran keeps its token, as in the general update. Tokens are Python ints.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from runner.engine.hashing import extend_block_hashes
from runner.engine.sequence import Sequence, SequenceStatus

if TYPE_CHECKING:
    from runner.engine.scheduler import Scheduler
    from runner.engine.scheduler_output import DecodeRows

RUNNING, FINISHED = SequenceStatus.RUNNING, SequenceStatus.FINISHED


def update_decodes(sched: Scheduler, rows: DecodeRows, tokens: list[int]) -> list[Sequence]:
    """Apply one sampled token per row; returns the requests that finished."""
    bs, kv = sched.config.block_size, sched.kv
    finished = []
    for seq, token in zip(rows.seqs, tokens, strict=True):
        status = seq.status
        if status is RUNNING:
            seq.num_inflight_tokens -= 1
            computed = seq.num_computed_tokens + 1
            seq.num_computed_tokens = computed
            if computed // bs > seq.num_cached_blocks:
                kv.cache_blocks(seq)
        elif status is FINISHED:  # aborted, or finished by an earlier step's token
            continue
        # else WAITING: preempted while this step ran; its K/V is dropped, the token it sampled is kept
        seq.num_pending_samples -= 1
        ids = seq.token_ids
        ids.append(token)
        if len(ids) % bs == 0:
            extend_block_hashes(seq.block_hashes, ids, bs)
        if (token in seq.finish_ids or len(ids) >= seq.finish_len or seq.params.stop) and sched._check_finished(seq):
            if status is RUNNING:
                sched.running.remove(seq)
                sched._leave(seq)
            else:
                sched.waiting.remove(seq)
            finished.append(seq)
    return finished
