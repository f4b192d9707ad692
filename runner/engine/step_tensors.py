"""A scheduled step flattened into the model's input tensors with two host-to-device copies.

Same result as `SchedulerOutput.step_inputs` (the scheduler's documented flattening; a test holds them
equal), built for the decode loop's host budget: per step the rows are written into two numpy arrays (every
int64 field, then every int32 field) and each goes to the device in ONE copy from a reused pinned staging
buffer, instead of a tensor per field and per block-table row. At W1's 256 decode rows that is two copies a
step instead of ~265 small tensors and 9 copies.

Staging on CUDA: a non-blocking copy reads the pinned buffer when the stream gets to it, possibly after the
host returned, and a step need not end in a sync (one whose rows all are prompt chunks samples nothing, so it
reads nothing back). So each dtype has two pinned buffers used in turn, each with a CUDA event recorded
after its copy; a buffer is written only after its event (the copy of two packs ago) has completed. The wait
is normally free: the step in between synchronized.
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import torch

from runner.engine.scheduler import SchedulerOutput, StepInputs

STAGING_BUFFERS = 2  # per dtype, used in turn


@dataclasses.dataclass
class _Staging:
    buffer: torch.Tensor | None = None  # pinned host memory
    copied: torch.cuda.Event | None = None  # recorded on the stream after the last copy out of `buffer`


class StepPacker:
    def __init__(self, device: torch.device | str):
        self.device = torch.device(device)
        self.pin = self.device.type == "cuda"
        self._staging: dict[torch.dtype, list[_Staging]] = {}
        self._turn: dict[torch.dtype, int] = {}

    def _to_device(self, array: np.ndarray) -> torch.Tensor:
        host = torch.from_numpy(array)
        if not self.pin:
            return host if self.device.type == "cpu" else host.to(self.device)
        n, dtype = host.numel(), host.dtype
        turn = self._turn.get(dtype, 0)
        self._turn[dtype] = (turn + 1) % STAGING_BUFFERS
        slot = self._staging.setdefault(dtype, [_Staging() for _ in range(STAGING_BUFFERS)])[turn]
        if slot.copied is not None:
            slot.copied.synchronize()  # the copy that last read this buffer has run: it may be overwritten
        if slot.buffer is None or slot.buffer.numel() < n:
            old = slot.buffer.numel() if slot.buffer is not None else 0
            slot.buffer = torch.empty(max(n, 2 * old, 4096), dtype=dtype, pin_memory=True)
        slot.buffer[:n].copy_(host)
        out = slot.buffer[:n].to(self.device, non_blocking=True)
        if slot.copied is None:
            slot.copied = torch.cuda.Event()
        slot.copied.record(torch.cuda.current_stream(self.device))
        return out

    def pack(self, output: SchedulerOutput, block_table_width: int | None = None) -> StepInputs:
        rows = output.scheduled
        b = len(rows)
        counts = [e.num_new_tokens for e in rows]
        t = sum(counts)
        width = output.block_table.shape[1]
        if block_table_width is not None:
            if block_table_width < width:
                raise ValueError(f"block_table_width: {block_table_width} < the step's widest table {width}")
            width = block_table_width
        wide = np.empty(3 * t + b, dtype=np.int64)  # input_ids | positions | slot_mapping | logits_indices
        if t == b:  # one token a row (decode): no flattening needed
            wide[:t] = [e.token_ids[0] for e in rows]
            wide[t:2 * t] = [e.start for e in rows]
            wide[2 * t:3 * t] = [e.slot_mapping[0] for e in rows]
        else:
            wide[:t] = list(itertools.chain.from_iterable(e.token_ids for e in rows))
            wide[t:2 * t] = list(itertools.chain.from_iterable(e.positions for e in rows))
            wide[2 * t:3 * t] = list(itertools.chain.from_iterable(e.slot_mapping for e in rows))
        narrow = np.zeros(b * width + 2 * b + 1, dtype=np.int32)  # block_table | seq_lens | cu_seqlens_q
        narrow[: b * width].reshape(b, width)[:, : output.block_table.shape[1]] = output.block_table.numpy()
        narrow[b * width: b * width + b] = [e.seq_len for e in rows]
        cu = narrow[b * width + b:]
        np.cumsum(counts, out=cu[1:])
        wide[3 * t:] = cu[1:] - 1
        w, n = self._to_device(wide), self._to_device(narrow)
        return StepInputs(
            input_ids=w[:t], positions=w[t:2 * t], slot_mapping=w[2 * t:3 * t],
            block_table=n[: b * width].view(b, width), seq_lens=n[b * width: b * width + b],
            cu_seqlens_q=n[b * width + b:], logits_indices=w[3 * t:], is_decode=output.is_decode,
            sample_mask=torch.tensor([e.samples for e in rows], dtype=torch.bool))
