"""KV block zeroing: the segment table a zeroer walks, built from the allocated caches, and the pure-torch
reference that clears the bytes it names (vLLM's `KVBlockZeroer`, added by PR #35219; PR #50276 made its block
stride and the bytes it clears two numbers).

Why: in a hybrid pool a block that held fp32 Mamba state can be handed to an attention layer of a smaller
dtype, whose kernels read whole pages (past the written tokens): leftover bit patterns read as NaN/Inf.
Only attention groups are zeroed; a recurrent-state (Mamba) group overwrites its state whole.

The table has one row per strided run of an attention layer's blocks (a region of `LayerGeometry`: one per
layer, two for FlashAttention's K/V-outermost order):
    buffer       index into the table's buffers (the segments of many caches are cleared in one launch)
    offset       byte offset of block 0's segment in that buffer
    block_stride bytes from block b's segment to block b + 1's
    nbytes       bytes to clear per block: the segment's content, never the stride (packed DeepSeek-V4
                 rows are 4 layers wide: clearing a stride's worth would wipe the neighbouring layers)
    num_blocks   blocks in the run; block b clears [offset + b * block_stride, ... + nbytes)
Stride and cleared bytes are separate fields by construction; nothing derives one from the other.

Edge-case policy of `zero_kv_blocks`: bytes only (no dtype, so no NaN/-0 questions: every cleared byte
becomes 0x00, every other byte keeps its value); duplicate block ids clear the same bytes twice (idempotent);
no block ids is a no-op; a block id outside [0, num_blocks) of any row is a ValueError here (the kernel,
which cannot read the ids without a device sync, writes nothing for it instead); rows that overlap (two
groups overlaid on one allocation) just clear their union.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import torch

from reference.kv.allocate import KVCache
from reference.kv.hybrid import MambaSpec

TABLE_COLUMNS = ("buffer", "offset", "block_stride", "nbytes", "num_blocks")
BLOCK_ID_DTYPES = (torch.int32, torch.int64)


class ZeroRow(NamedTuple):
    buffer: int
    offset: int
    block_stride: int
    nbytes: int
    num_blocks: int


@dataclasses.dataclass(frozen=True)
class ZeroerTable:
    """The rows to clear and the buffers they index; `owners[i]` = (group name, layer) of `rows[i]`."""

    buffers: tuple[torch.Tensor, ...]
    rows: tuple[ZeroRow, ...]
    owners: tuple[tuple[str, int], ...]

    def tensor(self) -> torch.Tensor:
        """The table as the ops take it: int64 [rows, 5] on the CPU, columns `TABLE_COLUMNS`."""
        return torch.tensor(self.rows, dtype=torch.int64).reshape(len(self.rows), len(TABLE_COLUMNS))


def zeroer_table(groups: Mapping[str, KVCache | MambaSpec]) -> ZeroerTable:
    """The rows of every layer of every attention group (a `KVCache` from `allocate_kv_cache`), read off the
    allocation's own geometry; Mamba groups (a `MambaSpec`) contribute none. Caches sharing a buffer share
    its index."""
    if not isinstance(groups, Mapping):
        raise TypeError(f"groups: must map group names to KVCache or MambaSpec, got {type(groups).__name__}")
    buffers: list[torch.Tensor] = []
    rows, owners = [], []
    for name, group in groups.items():
        if isinstance(group, MambaSpec):
            continue  # recurrent state is overwritten whole by its owner: never zeroed
        if not isinstance(group, KVCache):
            raise TypeError(f"groups: {name!r} must be a KVCache or a MambaSpec, got {type(group).__name__}")
        index = next((i for i, b in enumerate(buffers) if b is group.buffer), None)
        if index is None:
            index = len(buffers)
            buffers.append(group.buffer)
        for layer in group.geometry:
            for region in layer.regions:
                rows.append(ZeroRow(index, region.offset, region.block_stride, region.nbytes, layer.num_blocks))
                owners.append((name, layer.layer))
    return ZeroerTable(tuple(buffers), tuple(rows), tuple(owners))


def check_table(buffers: Sequence[torch.Tensor], table: torch.Tensor) -> None:
    """Shapes and dtypes only (no values: this also runs on fake tensors)."""
    if not isinstance(buffers, Sequence) or not buffers:
        raise ValueError("buffers: need a non-empty list of uint8 tensors")
    for i, buffer in enumerate(buffers):
        if not isinstance(buffer, torch.Tensor) or buffer.dtype != torch.uint8:
            raise TypeError(f"buffers[{i}]: must be a torch.uint8 tensor, got {getattr(buffer, 'dtype', buffer)}")
        if buffer.dim() != 1 or not buffer.is_contiguous():
            raise ValueError(f"buffers[{i}]: must be 1-D and contiguous, got shape {tuple(buffer.shape)}")
    if not isinstance(table, torch.Tensor) or table.dtype != torch.int64:
        raise TypeError(f"table: must be an int64 tensor, got {getattr(table, 'dtype', type(table).__name__)}")
    if table.dim() != 2 or table.shape[1] != len(TABLE_COLUMNS):
        raise ValueError(f"table: must be [rows, {len(TABLE_COLUMNS)}] {TABLE_COLUMNS}, got {tuple(table.shape)}")
    if table.device.type != "cpu":
        raise ValueError(f"table: must be on the cpu (host metadata, built once), got {table.device}")


def check_zero_kv_blocks_args(buffers: Sequence[torch.Tensor], table: torch.Tensor, block_ids: torch.Tensor) -> None:
    check_table(buffers, table)
    if not isinstance(block_ids, torch.Tensor) or block_ids.dtype not in BLOCK_ID_DTYPES:
        raise TypeError(
            f"block_ids: must be an int32 or int64 tensor, got {getattr(block_ids, 'dtype', type(block_ids).__name__)}"
        )
    if block_ids.dim() != 1:
        raise ValueError(f"block_ids: must be 1-D, got shape {tuple(block_ids.shape)}")


def table_rows(buffers: Sequence[torch.Tensor], table: torch.Tensor) -> list[ZeroRow]:
    """The table's rows, each checked to index a buffer and to keep every block inside it."""
    check_table(buffers, table)
    rows = [ZeroRow(*row) for row in table.tolist()]
    for i, row in enumerate(rows):
        if not 0 <= row.buffer < len(buffers):
            raise ValueError(f"table: row {i} names buffer {row.buffer}, have {len(buffers)}")
        if row.offset < 0 or row.block_stride < 1 or row.nbytes < 1 or row.num_blocks < 1:
            raise ValueError(f"table: row {i} {row} needs offset >= 0 and block_stride, nbytes, num_blocks >= 1")
        end = row.offset + (row.num_blocks - 1) * row.block_stride + row.nbytes
        size = buffers[row.buffer].numel()
        if end > size:
            raise ValueError(
                f"table: row {i} {row}: block {row.num_blocks - 1} ends at byte {end}, past the "
                f"{size}-byte buffers[{row.buffer}]"
            )
    return rows


def zero_kv_blocks(buffers: Sequence[torch.Tensor], table: torch.Tensor, block_ids: torch.Tensor) -> None:
    """Clear, in place, bytes [offset + b * block_stride, ... + nbytes) of every row's buffer, for every b
    in `block_ids`. One indexed write per row: the row seen as a [num_blocks, nbytes] strided view."""
    check_zero_kv_blocks_args(buffers, table, block_ids)
    rows = table_rows(buffers, table)
    ids = block_ids.to(device="cpu", dtype=torch.int64)
    if ids.numel() == 0:
        return
    low, high = int(ids.min()), int(ids.max())
    for i, row in enumerate(rows):
        if low < 0 or high >= row.num_blocks:
            raise ValueError(f"block_ids: {low if low < 0 else high} is outside row {i}'s [0, {row.num_blocks})")
        buffer = buffers[row.buffer]
        blocks = buffer.as_strided(
            (row.num_blocks, row.nbytes), (row.block_stride, 1), buffer.storage_offset() + row.offset
        )
        blocks[ids.to(buffer.device)] = 0
