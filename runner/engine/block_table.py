"""The block tables of the running requests as one persistent CPU int32 tensor, updated incrementally.

Rebuilding [B, max_blocks] from Python lists every step costs O(all blocks): ~1-3 ms a decode step at 256
requests of ~100 blocks on a 2-core host (torch.tensor / array conversion of 25k ints, measured), against a
whole-step budget of ~6 ms at 40k tok/s. Here each running request owns a row from admission until it
leaves (finish, preemption, abort); only block ids appended since the last step are written (a decode adds
one block every block_size steps), and a step's table is one gather of its rows. Rows are zeroed when freed,
so the part of a row past its request's blocks is the null block 0.

Writes and the gather go through a numpy view of the tensor (same memory): a torch slice assignment from a
new tensor costs ~4 us and a torch gather of 256 rows ~22 us, their numpy equivalents ~0.4 and ~6 us
(measured on the CPU; a 256-row decode step syncs ~16 rows, one in block_size).
"""

from __future__ import annotations

import torch

from runner.engine.sequence import Sequence


class BlockTableRows:
    def __init__(self, max_rows: int, max_blocks_per_row: int) -> None:
        self.table = torch.zeros(max_rows, max_blocks_per_row, dtype=torch.int32)
        self._rows = self.table.numpy()  # the same memory
        self._free_rows = list(range(max_rows - 1, -1, -1))  # pop() hands out row 0 first

    def assign(self, seq: Sequence) -> None:
        if seq.table_row is not None:
            raise ValueError(f"seq: {seq} already owns row {seq.table_row}")
        if not self._free_rows:
            raise ValueError("seq: every block-table row is taken (more running requests than max_num_seqs)")
        seq.table_row = self._free_rows.pop()
        seq.table_synced = 0

    def release(self, seq: Sequence) -> None:
        if seq.table_row is None:
            return
        self._rows[seq.table_row, : seq.table_synced] = 0
        self._free_rows.append(seq.table_row)
        seq.table_row = None
        seq.table_synced = 0

    def sync(self, seq: Sequence) -> None:
        """Write the block ids `seq` gained since the last sync (its table only grows while it owns the row)."""
        ids, done = seq.block_ids, seq.table_synced
        if len(ids) > self.table.shape[1]:
            raise ValueError(f"seq: {len(ids)} blocks exceed the table's {self.table.shape[1]} columns")
        if len(ids) > done:
            self._rows[seq.table_row, done : len(ids)] = ids[done:]
            seq.table_synced = len(ids)

    def gather(self, seqs: list[Sequence], width: int) -> torch.Tensor:
        """[len(seqs), width] copy of the rows of `seqs` (each synced), in that order."""
        return torch.from_numpy(self._rows[:, :width].take([s.table_row for s in seqs], axis=0))
