"""The scheduler: which requests run this step, with how many new tokens each, and where their K/V goes.

Unified steps (as vLLM v1): a request has num_tokens and num_computed_tokens, and a
step gives it up to the difference. A new prompt, a prompt chunk and a decode token are the same thing.

Policy of one `schedule()` (token budget B = max_num_batched_tokens, at most max_num_seqs running):
1. Running requests with ONE uncomputed token (decodes), oldest first.
2. Running requests mid-prefill (chunked), oldest first, each given min(remaining, budget left).
3. If nothing was preempted this step: waiting requests in FCFS order (preempted ones go back to the front),
   each looked up in the prefix cache, then given min(uncomputed, budget left) tokens; without chunked
   prefill a prompt that does not fit the budget left waits (and stops admission: strict FCFS).
Decodes first because each is one token and latency-bound: a long prompt never delays a running request's
next token (nano-vllm's prefill-first steps stall every decode while any prompt waits), and since
max_num_seqs <= B (checked) every running decode always fits. Prefill chunks still share the step with the
decodes (one mixed batch, as vLLM), so the GPU gets the budget's worth of tokens.

Preemption by recompute: when a request cannot get blocks, the latest-arrived running request (possibly
the request itself; were it already planned this step, its tokens would be un-planned and the budget
refunded, though FCFS admission makes every planned request older than the one asking)
loses its blocks and goes back to the FRONT of the waiting queue with all its tokens (prompt + generated)
as the prompt to recompute. After a preemption no waiting request is admitted in the same step.

Pure decode steps (every running request has one token ahead, none can be admitted: most steps of a long
generation) take the decode fast path (runner.engine.decode_schedule, decode_update): the same step, as
columns (runner.engine.scheduler_output.DecodeRows), with each request's counters read once.

Synchronous scheduling: steps strictly alternate, `schedule()` -> model runs `output` -> `update(output,
sampled)`. Computed-token counts advance and full blocks enter the prefix cache in `update`, i.e. only after
their K/V was written; requests that share a prompt in the same step therefore compute it separately (see
block_pool).

Asynchronous scheduling (`async_scheduling`; vLLM's async scheduling, SGLang's overlap scheduler): step N+1
is scheduled while step N runs, i.e. `schedule()` may be called once more before the oldest step's
`update`; updates come in step order. A request whose step-N token is not known yet (its sample is
"pending") gets a 1-token row whose input is a PLACEHOLDER and whose `prev_row` names its row in step N: the
model runner takes the token from step N's sampled tokens on the device. Tokens in launched steps are
"in flight" (Sequence.num_inflight_tokens; num_scheduled_tokens = computed + in flight is where the next
step starts), so nothing is hashed or registered in the prefix cache before it is known and computed: block
hashes cover the known token ids only, and `update` registers blocks from num_computed_tokens. Consequences,
each exact:
- a request whose pending token will finish it by length (max_tokens, max_model_len) is not scheduled again
  (its next position could lie past the K/V `add` sized it for);
- a request finished (EOS, stop token) by step N's token may already be in step N+1: that row's token is
  discarded at N+1's update;
- blocks a launched step still writes are never freed under it: a finished or aborted request's blocks are
  held until the last step that scheduled it resolved; a preemption victim gives its other blocks at once
  (the request that needs them runs in a later step on the same stream, after step N read them) and the
  ones step N writes once step N resolved;
- a request preempted while its token is in flight keeps that token: `update` appends it (and may finish
  the request) although the request waits for its recompute, which therefore is only admitted once its
  token is known (admission never happens in the step of a preemption, and the next schedule follows N's
  update).

Finishing (in `update`, after appending the sampled token): EOS (`eos_token_ids`, unless ignore_eos), a
stop token id, a stop string (`stop_checker(seq)` returns the matched string: the API layer, which holds
the tokenizer, sets it), then max_tokens or max_model_len -> "length". Finished requests free their blocks.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections import defaultdict, deque
from collections.abc import Callable
from collections.abc import Sequence as Seq

import torch

from runner.engine.block_pool import KVCacheBlock
from runner.engine.block_table import BlockTableRows
from runner.engine.decode_schedule import schedule_decodes
from runner.engine.decode_update import update_decodes
from runner.engine.kv_cache_manager import KVCacheManager, cdiv
from runner.engine.scheduler_output import PLACEHOLDER, ScheduledSequence, SchedulerOutput, StepInputs
from runner.engine.sequence import FinishReason, Sequence, SequenceStatus

__all__ = [
    "FAULTS",
    "PLACEHOLDER",
    "ScheduledSequence",
    "Scheduler",
    "SchedulerConfig",
    "SchedulerOutput",
    "StepInputs",
    "StopChecker",
]

# Planted bugs for negative controls (never in production): "stale_placeholder" feeds a pending row the
# request's last KNOWN token (step N-1's) instead of step N's; "early_free" frees a leaving request's blocks
# although a launched step still writes them; "decode_slot" makes the decode fast path store each row's K/V
# one block too far.
FAULTS = ("stale_placeholder", "early_free", "decode_slot")


def _positive(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}: must be an int >= 1, got {value!r}")


@dataclasses.dataclass(frozen=True)
class SchedulerConfig:
    num_blocks: int  # of the KV cache, null block included (kv_sizing.num_kv_blocks)
    block_size: int = 16  # vLLM's default; the attention kernels decide what they support
    max_num_batched_tokens: int = 16384  # token budget of one step (vLLM's LLM-class default on H100/H200)
    max_num_seqs: int = 512
    max_model_len: int = 4096
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True
    eos_token_ids: tuple[int, ...] = ()
    async_scheduling: bool = False  # schedule step N+1 before step N's update (the engine core's default)
    decode_fast_path: bool = True  # pure decode steps through runner.engine.decode_schedule / decode_update

    def __post_init__(self) -> None:
        for name in ("num_blocks", "block_size", "max_num_batched_tokens", "max_num_seqs", "max_model_len"):
            _positive(name, getattr(self, name))
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(
                f"max_num_batched_tokens: {self.max_num_batched_tokens} must be >= max_num_seqs "
                f"{self.max_num_seqs}, so every running request's decode token fits one step"
            )
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise ValueError(
                f"max_num_batched_tokens: {self.max_num_batched_tokens} must be >= max_model_len "
                f"{self.max_model_len} without chunked prefill (a whole prompt runs in one step)"
            )
        object.__setattr__(self, "eos_token_ids", tuple(int(t) for t in self.eos_token_ids))


StopChecker = Callable[[Sequence], str | None]


class Scheduler:
    def __init__(self, config: SchedulerConfig, stop_checker: StopChecker | None = None, fault: str | None = None):
        if fault is not None and fault not in FAULTS:
            raise ValueError(f"fault: unknown {fault!r}; known {FAULTS}")
        self.config = config
        self.kv = KVCacheManager(config.num_blocks, config.block_size, config.enable_prefix_caching)
        self.stop_checker = stop_checker
        self.fault = fault
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # kept sorted by arrival: running[-1] is the preemption victim
        self.tables = BlockTableRows(config.max_num_seqs, cdiv(config.max_model_len, config.block_size))
        self.unresolved: deque[SchedulerOutput] = deque()  # scheduled steps not updated yet, oldest first
        self._held: defaultdict[int, list[list[KVCacheBlock]]] = defaultdict(list)  # step id -> blocks it writes
        self._next_step = 0
        self.num_preemptions = 0
        self.num_prompt_tokens_queried = 0  # prefix-cache hit rate = hit / queried
        self.num_prompt_tokens_hit = 0

    # --- requests ------------------------------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        cfg = self.config
        if seq.block_size != cfg.block_size:
            raise ValueError(f"seq: built with block_size {seq.block_size}, the cache uses {cfg.block_size}")
        if seq.status is not SequenceStatus.WAITING or seq.num_computed_tokens or seq.block_table:
            raise ValueError(f"seq: {seq} is not a new request")
        if seq.num_tokens >= cfg.max_model_len:
            raise ValueError(
                f"seq: prompt of {seq.num_tokens} tokens leaves no room under max_model_len {cfg.max_model_len}"
            )
        # The most K/V it can hold: every token but the last it may generate. A request that could outgrow
        # the whole cache would preempt itself forever.
        peak = min(seq.num_prompt_tokens + seq.params.max_tokens, cfg.max_model_len) - 1
        if cdiv(peak, cfg.block_size) > self.kv.num_usable_blocks:
            raise ValueError(
                f"seq: may need {cdiv(peak, cfg.block_size)} blocks, the cache has {self.kv.num_usable_blocks}"
            )
        params = seq.params
        seq.finish_ids = frozenset(params.stop_token_ids) | frozenset(() if params.ignore_eos else cfg.eos_token_ids)
        seq.finish_len = min(seq.num_prompt_tokens + params.max_tokens, cfg.max_model_len)
        self.waiting.append(seq)

    def abort(self, request_id: str | int) -> Sequence | None:
        for seq in [*self.running, *self.waiting]:
            if seq.request_id == request_id:
                if seq.status is SequenceStatus.RUNNING:
                    self.running.remove(seq)
                    self._leave(seq)
                else:
                    self.waiting.remove(seq)
                seq.finish(FinishReason.ABORT)
                return seq
        return None

    @property
    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    # --- blocks a launched step writes ------------------------------------------------------------------------
    def _in_flight(self, seq: Sequence) -> bool:
        """A launched step that has not been updated scheduled the request."""
        return bool(self.unresolved) and seq.last_step >= self.unresolved[0].step_id

    def _leave(self, seq: Sequence) -> None:
        """A running request finished or was aborted: its blocks go back, held until the last step that
        scheduled it resolved when that step is still in flight; its table row goes now (steps copied it)."""
        if self._in_flight(seq) and self.fault != "early_free":
            self._held[seq.last_step].append(self.kv.detach(seq))
        else:
            self.kv.free(seq)
        self.tables.release(seq)

    def _preempt(self, seq: Sequence) -> None:
        """Free the victim's blocks except those the step in flight writes (held until it resolved). Only
        those: holding all of them would free nothing for the request that asked (a preemption is for now)."""
        if self._in_flight(seq) and self.fault != "early_free":
            step = self.unresolved[-1]  # at schedule time the only step in flight, and the victim's last
            entry = step.scheduled[seq.last_row]
            bs = self.config.block_size
            first, last = entry.start // bs, (entry.start + entry.num_new_tokens - 1) // bs
            written = seq.block_table[first : last + 1]
            kept = {id(b) for b in written}
            self.kv.pool.free_blocks([b for b in self.kv.detach(seq) if id(b) not in kept])
            self._held[step.step_id].append(written[::-1])
        else:
            self.kv.free(seq)
        self.tables.release(seq)
        seq.reset_for_recompute()

    def check_inflight_writes(self) -> None:
        """Raise AssertionError if a slot some launched step writes lies in a block that neither the step's
        request nor a hold for that step keeps (it could be handed to another request). Tests call it."""
        bs = self.config.block_size
        for step in self.unresolved:
            held = {id(b) for blocks in self._held.get(step.step_id, ()) for b in blocks}
            for entry in step.scheduled:
                owned = held | {id(b) for b in entry.seq.block_table}
                for slot in entry.slot_mapping:
                    block = self.kv.pool.blocks[slot // bs]
                    assert id(block) in owned and block.ref_cnt > 0, (
                        f"step {step.step_id} writes {block} for {entry.seq}, which no longer holds it"
                    )

    # --- one step ------------------------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        cfg = self.config
        if len(self.unresolved) >= (2 if cfg.async_scheduling else 1):
            raise RuntimeError("schedule: the previous step's update() has not run")
        if cfg.decode_fast_path and (output := schedule_decodes(self)) is not None:
            return output
        plan: dict[Sequence, int] = {}  # request -> new tokens, in row order
        preempted: list[Sequence] = []
        budget = cfg.max_num_batched_tokens

        def allocate(seq: Sequence, n: int) -> bool:
            nonlocal budget
            while not self.kv.allocate_slots(seq, n):
                victim = self.running.pop()
                budget += plan.pop(victim, 0)
                self._preempt(victim)
                self.waiting.appendleft(victim)
                preempted.append(victim)
                self.num_preemptions += 1
                if victim is seq:
                    return False
            return True

        decodes, prefills = [], []
        for seq in self.running:
            ahead = seq.num_unscheduled_tokens
            if ahead == 0 or (seq.num_pending_samples and self._finishes_by_length(seq)):
                continue  # its token in flight ends it: nothing to run
            (decodes if ahead == 1 else prefills).append(seq)
        bs = cfg.block_size
        for seq in decodes:  # max_num_seqs <= budget: every decode fits
            # Fast path (most decode steps of a request): its last block still has a free slot, so there is
            # nothing to allocate and nothing to preempt. A preempted request is no longer RUNNING.
            if seq.status is SequenceStatus.RUNNING and (
                seq.num_scheduled_tokens < len(seq.block_ids) * bs or allocate(seq, 1)
            ):
                plan[seq] = 1
                budget -= 1
        for seq in prefills:
            n = min(seq.num_unscheduled_tokens, budget)
            if n == 0:
                break
            if seq.status is SequenceStatus.RUNNING and allocate(seq, n):
                plan[seq] = n
                budget -= n

        while self.waiting and not preempted and budget > 0 and len(self.running) < cfg.max_num_seqs:
            seq = self.waiting[0]
            if seq.num_pending_samples:  # its token is in flight (cannot happen: see the module docstring)
                break
            hits, num_hit = self.kv.get_computed_blocks(seq)
            n = seq.num_tokens - num_hit
            if n > budget and not cfg.enable_chunked_prefill:
                break
            n = min(n, budget)
            if not self.kv.allocate_slots(seq, n, hits):
                break
            self.waiting.popleft()
            seq.num_computed_tokens = num_hit
            seq.status = SequenceStatus.RUNNING
            self.tables.assign(seq)
            bisect.insort(self.running, seq, key=lambda s: s.arrival)
            self.num_prompt_tokens_queried += seq.num_tokens
            self.num_prompt_tokens_hit += num_hit
            plan[seq] = n
            budget -= n

        step_id = self._next_step
        scheduled = []
        for row, (seq, n) in enumerate(plan.items()):
            entry = self._entry(seq, n)
            scheduled.append(entry)
            seq.num_inflight_tokens += n
            seq.num_pending_samples += entry.samples
            seq.last_step, seq.last_row = step_id, row
        tables, width = self.tables, 0
        for seq in plan:
            if seq.table_synced != len(seq.block_ids):
                tables.sync(seq)
            width = max(width, seq.table_synced)
        table = self.tables.gather(list(plan), width)
        output = SchedulerOutput(scheduled, preempted, cfg.max_num_batched_tokens - budget, table, step_id)
        if scheduled:  # an empty step (everything left is in flight) runs nothing and needs no update
            self._next_step += 1
            self.unresolved.append(output)
        return output

    def _finishes_by_length(self, seq: Sequence) -> bool:
        """Its pending token will finish it by max_tokens or max_model_len."""
        pending = seq.num_pending_samples
        return (
            seq.num_output_tokens + pending >= seq.params.max_tokens
            or seq.num_tokens + pending >= self.config.max_model_len
        )

    def _entry(self, seq: Sequence, n: int) -> ScheduledSequence:
        start, bs, ids = seq.num_scheduled_tokens, self.config.block_size, seq.block_ids
        known = seq.num_tokens
        if n == 1:  # a decode token: no slices or comprehensions (256 rows a step)
            prev_row = -1
            if start < known:
                token = seq.token_ids[start]
            elif self.fault == "stale_placeholder":
                token = seq.token_ids[-1]
            else:  # the token the step in flight samples for it
                token, prev_row = PLACEHOLDER, seq.last_row
            return ScheduledSequence(
                seq,
                start,
                1,
                [token],
                [ids[start // bs] * bs + start % bs],
                start + 1 == known + seq.num_pending_samples,
                prev_row,
            )
        if start + n > known:  # a pending token is always alone in its row (all known tokens were scheduled)
            raise RuntimeError(f"schedule: {seq} would compute a pending token inside a {n}-token row")
        return ScheduledSequence(
            seq=seq,
            start=start,
            num_new_tokens=n,
            token_ids=seq.token_ids[start : start + n],
            slot_mapping=[ids[p // bs] * bs + p % bs for p in range(start, start + n)],
            samples=start + n == known + seq.num_pending_samples,
        )

    def update(self, output: SchedulerOutput, sampled_token_ids: Seq[int] | torch.Tensor) -> list[Sequence]:
        """Advance the step's requests; `sampled_token_ids[i]` is row i's token (ignored where the row does
        not sample). Steps are updated in the order they were scheduled. Returns the requests that finished."""
        if not self.unresolved or output is not self.unresolved[0]:
            raise RuntimeError("update: output is not the oldest step schedule() returned and update() has not seen")
        if isinstance(sampled_token_ids, torch.Tensor):
            sampled_token_ids = sampled_token_ids.tolist()
        if len(sampled_token_ids) != output.num_rows:
            raise ValueError(
                f"sampled_token_ids: {len(sampled_token_ids)} tokens for {output.num_rows} scheduled requests"
            )
        self.unresolved.popleft()
        if output.decode is not None:
            finished = update_decodes(self, output.decode, sampled_token_ids)
        else:
            finished = self._update_rows(output, sampled_token_ids)
        for blocks in self._held.pop(output.step_id, ()):
            self.kv.pool.free_blocks(blocks)
        return finished

    def _update_rows(self, output: SchedulerOutput, sampled_token_ids: Seq[int]) -> list[Sequence]:
        finished = []
        for entry, token in zip(output.scheduled, sampled_token_ids, strict=True):
            seq = entry.seq
            if seq.status is SequenceStatus.RUNNING:
                seq.num_inflight_tokens -= entry.num_new_tokens
                seq.num_computed_tokens += entry.num_new_tokens
                self.kv.cache_blocks(seq)
            elif seq.status is SequenceStatus.FINISHED:  # aborted, or finished by an earlier step's token
                continue
            # else WAITING: preempted while this step ran; its K/V is dropped, the token it sampled is kept
            if not entry.samples:
                continue
            seq.num_pending_samples -= 1
            seq.append_token(token)
            running = seq.status is SequenceStatus.RUNNING
            if self._check_finished(seq):
                if running:
                    self.running.remove(seq)
                    self._leave(seq)
                else:
                    self.waiting.remove(seq)
                finished.append(seq)
        return finished

    def _check_finished(self, seq: Sequence) -> bool:
        token, params = seq.token_ids[-1], seq.params
        if not params.ignore_eos and token in self.config.eos_token_ids:
            seq.finish(FinishReason.STOP, token)
        elif token in params.stop_token_ids:
            seq.finish(FinishReason.STOP, token)
        elif params.stop and self.stop_checker is not None and (hit := self.stop_checker(seq)) is not None:
            seq.finish(FinishReason.STOP, hit)
        elif seq.num_output_tokens >= params.max_tokens or seq.num_tokens >= self.config.max_model_len:
            seq.finish(FinishReason.LENGTH)
        return seq.is_finished
