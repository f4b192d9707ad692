"""What `Scheduler.schedule()` returns: the step's rows, each a request's share of the step, and the block table.

A step is a list of `ScheduledSequence` rows (any mix of prompt chunks and decode tokens). A pure decode step
from the scheduler's decode fast path (runner.engine.decode_schedule) comes as columns instead, `DecodeRows`:
one token per row and every row samples, so a row is a handful of ints and the 256 row objects a step
(~42 us on the CPU a step, measured) are built only when something asks for `scheduled` (tests, a
preemption, the in-flight write check). The hot consumers (the model runner's launch, the scheduler's
update, the engine core's deltas) read the columns.
"""

from __future__ import annotations

import dataclasses
import itertools

import torch

from runner.engine.sequence import Sequence

PLACEHOLDER = -1  # input id of a row whose token the step in flight samples (the model runner fills it in)


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
    prev_row: int = -1  # >= 0: token_ids is [PLACEHOLDER], the token row prev_row of the step before samples

    @property
    def positions(self) -> range:
        return range(self.start, self.start + self.num_new_tokens)

    @property
    def seq_len(self) -> int:
        """Tokens in the cache after this step (prefix + new)."""
        return self.start + self.num_new_tokens


@dataclasses.dataclass(slots=True)
class DecodeRows:
    """A pure decode step as columns: row i computes the token of seqs[i] at position starts[i] (input
    token_ids[i], or the token row prev_rows[i] of the step before samples where token_ids[i] is
    PLACEHOLDER), stores its K/V at slot slots[i] and samples."""

    seqs: list[Sequence]
    starts: list[int]
    token_ids: list[int]
    slots: list[int]
    prev_rows: list[int]  # -1: the row's token is known

    def entries(self) -> list[ScheduledSequence]:
        return [
            ScheduledSequence(seq, start, 1, [token], [slot], True, prev)
            for seq, start, token, slot, prev in zip(
                self.seqs, self.starts, self.token_ids, self.slots, self.prev_rows, strict=True
            )
        ]


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


class SchedulerOutput:
    """The step: its rows (`scheduled`, or the columns `decode` of a pure decode step), the requests it
    preempted, its token count, its block table ([B, widest table of the step], rows in row order,
    0-padded) and its id (steps are numbered in scheduling order; prev_row refers to step_id - 1)."""

    __slots__ = ("_scheduled", "block_table", "decode", "is_decode", "num_batched_tokens", "preempted", "step_id")

    def __init__(
        self,
        scheduled: list[ScheduledSequence] | None,
        preempted: list[Sequence],
        num_batched_tokens: int,
        block_table: torch.Tensor,
        step_id: int = 0,
        decode: DecodeRows | None = None,
    ):
        if (scheduled is None) == (decode is None):
            raise ValueError("scheduled, decode: give the rows one way")
        self._scheduled = scheduled
        self.preempted = preempted
        self.num_batched_tokens = num_batched_tokens
        self.block_table = block_table
        self.step_id = step_id
        self.decode = decode
        self.is_decode = decode is not None or (bool(scheduled) and all(s.num_new_tokens == 1 for s in scheduled))

    @property
    def scheduled(self) -> list[ScheduledSequence]:
        if self._scheduled is None:
            self._scheduled = self.decode.entries()
        return self._scheduled

    @property
    def num_rows(self) -> int:
        return len(self.decode.seqs) if self.decode is not None else len(self._scheduled)

    @property
    def is_empty(self) -> bool:
        return self.num_rows == 0

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
