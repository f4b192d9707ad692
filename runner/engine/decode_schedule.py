"""The scheduler's decode fast path: the step in which every running request decodes one token.

Most steps of a long generation are this step (W1: ~510 of its ~520 steps, 256 rows each), and the general
`Scheduler.schedule` spends ~1.5 us a row on it (on the H200 host ~0.95 ms a step: property chains, a plan
dict, one ScheduledSequence and two lists a row, a torch gather of the block table). Here one pass over the
running requests reads each one's counters once and writes the step as columns (runner.engine.
scheduler_output.DecodeRows); a block is allocated only for a row whose position crosses into a new block
(one row in block_size a step).

It applies when no waiting request can be admitted (none waits, or max_num_seqs run) and every running request
has at most one token to compute. It gives the step the general path would give, row for row:
- the rows are the running requests with one token ahead, in running order (the general path's decodes;
  there are no prefills to follow them and nothing is admitted), less those the general path skips (nothing
  ahead, or a pending token that ends the request by length);
- a row whose last block is full gets one block (`append_block`, what `allocate_slots` does for it), in the
  same order as the general path. If the pool cannot give it (a preemption is due) or a request has a prompt
  chunk ahead, the fast path gives up and the general path schedules the step from scratch: what the fast
  path did by then (blocks allocated to earlier rows, their table rows synced) is what the general path does
  first anyway, and nothing else was changed (counters are advanced only once the step is known to be a pure
  decode).
`SchedulerConfig.decode_fast_path = False` turns it off (the equivalence tests compare both).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from runner.engine.scheduler_output import PLACEHOLDER, DecodeRows, SchedulerOutput

if TYPE_CHECKING:
    from runner.engine.scheduler import Scheduler


def schedule_decodes(sched: Scheduler) -> SchedulerOutput | None:
    """The step when it is a pure decode step (the scheduler's state then advanced as `schedule` would);
    None, with no state changed but what the general path does first too, when it is not."""
    cfg = sched.config
    if sched.waiting and len(sched.running) < cfg.max_num_seqs:
        return None  # a waiting request may be admitted
    bs, kv, tables, fault = cfg.block_size, sched.kv, sched.tables, sched.fault
    seqs, starts, tokens, slots, prev_rows = [], [], [], [], []
    width = 0
    for seq in sched.running:
        start = seq.num_computed_tokens + seq.num_inflight_tokens
        pending = seq.num_pending_samples
        ids = seq.token_ids
        known = len(ids)
        ahead = known + pending - start
        # As the general path: nothing to run, or its token in flight ends it by length (finish_len).
        if ahead == 0 or (pending and known + pending >= seq.finish_len):
            continue
        if ahead != 1:
            return None  # a prompt (chunk) to compute
        block_ids = seq.block_ids
        if start >= len(block_ids) * bs and not kv.append_block(seq):
            return None  # the pool is out of blocks: a preemption is due
        if seq.table_synced != len(block_ids):
            tables.sync(seq)
        if len(block_ids) > width:
            width = len(block_ids)
        if start < known:
            token, prev = ids[start], -1
        elif fault == "stale_placeholder":
            token, prev = ids[-1], -1
        else:  # the token the step in flight samples for it
            token, prev = PLACEHOLDER, seq.last_row
        seqs.append(seq)
        starts.append(start)
        tokens.append(token)
        slots.append(block_ids[start // bs] * bs + start % bs)
        prev_rows.append(prev)
    if not seqs:
        return None  # everything left is in flight: the general path returns the empty step
    if fault == "decode_slot":  # planted: each row's K/V goes to the same offset one block further on
        slots = [slot + bs for slot in slots]
    step_id = sched._next_step
    for row, seq in enumerate(seqs):
        seq.num_inflight_tokens += 1
        seq.num_pending_samples += 1
        seq.last_step = step_id
        seq.last_row = row
    decode = DecodeRows(seqs, starts, tokens, slots, prev_rows)
    output = SchedulerOutput(None, [], len(seqs), tables.gather(seqs, width), step_id, decode)
    sched._next_step += 1
    sched.unresolved.append(output)
    return output
