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

Steps strictly alternate: `schedule()` -> model runs `output` -> `update(output, sampled)`. Computed-token
counts advance and full blocks enter the prefix cache in `update`, i.e. only after their K/V was written;
requests that share a prompt in the same step therefore compute it separately (see block_pool).

Finishing (in `update`, after appending the sampled token): EOS (`eos_token_ids`, unless ignore_eos), a
stop token id, a stop string (`stop_checker(seq)` returns the matched string: the API layer, which holds
the tokenizer, sets it), then max_tokens or max_model_len -> "length". Finished requests free their blocks.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
from collections import deque
from collections.abc import Callable
from collections.abc import Sequence as Seq

import torch

from runner.engine.block_table import BlockTableRows
from runner.engine.kv_cache_manager import KVCacheManager, cdiv
from runner.engine.sequence import FinishReason, Sequence, SequenceStatus


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


@dataclasses.dataclass(slots=True)  # not frozen: a frozen init costs ~3 us a row, 256 rows a step
class ScheduledSequence:
    """One request's share of a step: tokens [start, start + num_new_tokens) of seq.token_ids. Its block ids are
    its row of `SchedulerOutput.block_table` (no per-row copy: it cost a list of ~100 ids a row every step)."""

    seq: Sequence
    start: int  # num_computed_tokens before the step = position of the first new token
    num_new_tokens: int
    token_ids: list[int]
    slot_mapping: list[int]  # cache slot of each new token: block_id * block_size + offset
    samples: bool  # the last new token is the request's last token: its logits give the next token

    @property
    def positions(self) -> range:
        return range(self.start, self.start + self.num_new_tokens)

    @property
    def seq_len(self) -> int:
        """Tokens in the cache after this step (prefix + new)."""
        return self.start + self.num_new_tokens


@dataclasses.dataclass(frozen=True)
class StepInputs:
    """The tensors of one step, fields named as runner.model.attention.AttentionBatch plus the model's ids
    and positions. Rows of the step are the sequences in `SchedulerOutput.scheduled` order."""

    input_ids: torch.Tensor  # int64 [T]
    positions: torch.Tensor  # int64 [T]
    slot_mapping: torch.Tensor  # int64 [T]
    block_table: torch.Tensor  # int32 [B, width], padded with the null block 0
    seq_lens: torch.Tensor  # int32 [B]
    cu_seqlens_q: torch.Tensor  # int32 [B + 1]
    logits_indices: torch.Tensor  # int64 [B]: row of each sequence's last new token
    is_decode: bool
    sample_mask: torch.Tensor  # bool [B]: which rows sample a token (False: a prompt chunk that is not last)


@dataclasses.dataclass(frozen=True)
class SchedulerOutput:
    scheduled: list[ScheduledSequence]
    preempted: list[Sequence]
    num_batched_tokens: int
    block_table: torch.Tensor  # int32 [B, widest table of the step], rows in `scheduled` order, 0-padded

    @property
    def is_empty(self) -> bool:
        return not self.scheduled

    @property
    def is_decode(self) -> bool:
        return bool(self.scheduled) and all(s.num_new_tokens == 1 for s in self.scheduled)

    def step_inputs(self, device: torch.device | str = "cpu", block_table_width: int | None = None) -> StepInputs:
        """Flatten the step into tensors (built on the CPU, then moved to `device`). The block table is
        `block_table_width` wide (a CUDA graph's fixed width), default the longest table of the step.
        One torch.tensor call per field: per-row tensor building cost ~3 ms a step at 256 requests."""
        rows, table = self.scheduled, self.block_table
        if block_table_width is not None:
            if block_table_width < table.shape[1]:
                raise ValueError(f"block_table_width: {block_table_width} < the step's widest table {table.shape[1]}")
            table = torch.nn.functional.pad(table, (0, block_table_width - table.shape[1]))
        cu = [0]
        for s in rows:
            cu.append(cu[-1] + s.num_new_tokens)
        chain = itertools.chain.from_iterable
        out = StepInputs(
            input_ids=torch.tensor(list(chain(s.token_ids for s in rows)), dtype=torch.int64),
            positions=torch.tensor(list(chain(s.positions for s in rows)), dtype=torch.int64),
            slot_mapping=torch.tensor(list(chain(s.slot_mapping for s in rows)), dtype=torch.int64),
            block_table=table,
            seq_lens=torch.tensor([s.seq_len for s in rows], dtype=torch.int32),
            cu_seqlens_q=torch.tensor(cu, dtype=torch.int32),
            logits_indices=torch.tensor([c - 1 for c in cu[1:]], dtype=torch.int64),
            is_decode=self.is_decode,
            sample_mask=torch.tensor([s.samples for s in rows], dtype=torch.bool),
        )
        if torch.device(device).type == "cpu":
            return out
        return dataclasses.replace(
            out,
            **{
                f.name: getattr(out, f.name).to(device, non_blocking=True)
                for f in dataclasses.fields(out)
                if f.name != "is_decode"
            },
        )


StopChecker = Callable[[Sequence], str | None]


class Scheduler:
    def __init__(self, config: SchedulerConfig, stop_checker: StopChecker | None = None) -> None:
        self.config = config
        self.kv = KVCacheManager(config.num_blocks, config.block_size, config.enable_prefix_caching)
        self.stop_checker = stop_checker
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # kept sorted by arrival: running[-1] is the preemption victim
        self.tables = BlockTableRows(config.max_num_seqs, cdiv(config.max_model_len, config.block_size))
        self._pending: SchedulerOutput | None = None
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
        self.waiting.append(seq)

    def abort(self, request_id: str | int) -> Sequence | None:
        for seq in [*self.running, *self.waiting]:
            if seq.request_id == request_id:
                if seq.status is SequenceStatus.RUNNING:
                    self.running.remove(seq)
                    self.kv.free(seq)
                    self.tables.release(seq)
                else:
                    self.waiting.remove(seq)
                seq.finish(FinishReason.ABORT)
                return seq
        return None

    @property
    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    # --- one step ------------------------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        if self._pending is not None:
            raise RuntimeError("schedule: the previous step's update() has not run")
        cfg = self.config
        plan: dict[Sequence, int] = {}  # request -> new tokens, in row order
        preempted: list[Sequence] = []
        budget = cfg.max_num_batched_tokens

        def allocate(seq: Sequence, n: int) -> bool:
            nonlocal budget
            while not self.kv.allocate_slots(seq, n):
                victim = self.running.pop()
                budget += plan.pop(victim, 0)
                self.kv.free(victim)
                self.tables.release(victim)
                victim.reset_for_recompute()
                self.waiting.appendleft(victim)
                preempted.append(victim)
                self.num_preemptions += 1
                if victim is seq:
                    return False
            return True

        decodes, prefills = [], []
        for seq in self.running:
            (decodes if len(seq.token_ids) - seq.num_computed_tokens == 1 else prefills).append(seq)
        bs = cfg.block_size
        for seq in decodes:  # max_num_seqs <= budget: every decode fits
            # Fast path (most decode steps of a request): its last block still has a free slot, so there is
            # nothing to allocate and nothing to preempt. A preempted request is no longer RUNNING.
            if seq.status is SequenceStatus.RUNNING and (
                seq.num_computed_tokens < len(seq.block_ids) * bs or allocate(seq, 1)
            ):
                plan[seq] = 1
                budget -= 1
        for seq in prefills:
            n = min(seq.num_uncomputed_tokens, budget)
            if n == 0:
                break
            if seq.status is SequenceStatus.RUNNING and allocate(seq, n):
                plan[seq] = n
                budget -= n

        while self.waiting and not preempted and budget > 0 and len(self.running) < cfg.max_num_seqs:
            seq = self.waiting[0]
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

        scheduled = [self._entry(seq, n) for seq, n in plan.items()]
        tables, width = self.tables, 0
        for seq in plan:
            if seq.table_synced != len(seq.block_ids):
                tables.sync(seq)
            width = max(width, seq.table_synced)
        table = self.tables.gather(list(plan), width)
        self._pending = SchedulerOutput(scheduled, preempted, cfg.max_num_batched_tokens - budget, table)
        return self._pending

    def _entry(self, seq: Sequence, n: int) -> ScheduledSequence:
        start, bs, ids = seq.num_computed_tokens, self.config.block_size, seq.block_ids
        if n == 1:  # a decode token: no slices or comprehensions (256 rows a step)
            return ScheduledSequence(
                seq,
                start,
                1,
                [seq.token_ids[start]],
                [ids[start // bs] * bs + start % bs],
                start + 1 == len(seq.token_ids),
            )
        return ScheduledSequence(
            seq=seq,
            start=start,
            num_new_tokens=n,
            token_ids=seq.token_ids[start : start + n],
            slot_mapping=[ids[p // bs] * bs + p % bs for p in range(start, start + n)],
            samples=start + n == seq.num_tokens,
        )

    def update(self, output: SchedulerOutput, sampled_token_ids: Seq[int] | torch.Tensor) -> list[Sequence]:
        """Advance the step's requests; `sampled_token_ids[i]` is row i's token (ignored where the row does
        not sample). Returns the requests that finished."""
        if output is not self._pending:
            raise RuntimeError("update: output is not the step last returned by schedule()")
        self._pending = None
        if isinstance(sampled_token_ids, torch.Tensor):
            sampled_token_ids = sampled_token_ids.tolist()
        if len(sampled_token_ids) != len(output.scheduled):
            raise ValueError(
                f"sampled_token_ids: {len(sampled_token_ids)} tokens for {len(output.scheduled)} scheduled requests"
            )
        finished = []
        for entry, token in zip(output.scheduled, sampled_token_ids, strict=True):
            seq = entry.seq
            if seq.status is not SequenceStatus.RUNNING:  # aborted between schedule and update
                continue
            seq.num_computed_tokens += entry.num_new_tokens
            self.kv.cache_blocks(seq)
            if not entry.samples:
                continue
            seq.append_token(token)
            if self._check_finished(seq):
                self.running.remove(seq)
                self.kv.free(seq)
                self.tables.release(seq)
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
