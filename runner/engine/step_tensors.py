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


def _aligned(n: int, per: int) -> int:
    """n rounded up to a multiple of `per` elements (16 bytes)."""
    return -(-n // per) * per


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
        decode = output.decode  # a pure decode step as columns (runner.engine.decode_schedule): no row objects
        rows = output.scheduled if decode is None else None
        b = output.num_rows
        counts = [e.num_new_tokens for e in rows] if decode is None else None
        t = b if decode is not None else sum(counts)
        width = output.block_table.shape[1]
        if block_table_width is not None:
            if block_table_width < width:
                raise ValueError(f"block_table_width: {block_table_width} < the step's widest table {width}")
            width = block_table_width
        # Every field starts 16-byte aligned inside its staging buffer: Triton specializes pointer arguments on
        # 16-byte alignment, so a field at an odd offset (e.g. seq_lens after a 256 x 97 table) would compile
        # the attention kernels once more per alignment pattern, ~0.6 s each, inside a timed run (measured on
        # the H200: W1's first prefill step took 654 ms instead of ~31).
        ta = _aligned(t, 2)  # int64: 2 per 16 bytes
        wide = np.empty(3 * ta + b, dtype=np.int64)  # input_ids | positions | slot_mapping | logits_indices
        ids, pos, slots = wide[:t], wide[ta : ta + t], wide[2 * ta : 2 * ta + t]
        if decode is not None:
            ids[:] = decode.token_ids
            pos[:] = decode.starts
            slots[:] = decode.slots
        elif t == b:  # one token a row (decode): no flattening needed
            ids[:] = [e.token_ids[0] for e in rows]
            pos[:] = [e.start for e in rows]
            slots[:] = [e.slot_mapping[0] for e in rows]
        else:
            ids[:] = list(itertools.chain.from_iterable(e.token_ids for e in rows))
            pos[:] = list(itertools.chain.from_iterable(e.positions for e in rows))
            slots[:] = list(itertools.chain.from_iterable(e.slot_mapping for e in rows))
        tw, ba = _aligned(b * width, 4), _aligned(b, 4)  # int32: 4 per 16 bytes
        narrow = np.zeros(tw + ba + b + 1, dtype=np.int32)  # block_table | seq_lens | cu_seqlens_q
        narrow[: b * width].reshape(b, width)[:, : output.block_table.shape[1]] = output.block_table.numpy()
        cu = narrow[tw + ba :]
        if decode is not None:  # seq_len = position + 1, one token a row
            np.add(pos, 1, out=narrow[tw : tw + b], casting="unsafe")
            cu[:] = np.arange(b + 1)
        else:
            narrow[tw : tw + b] = [e.seq_len for e in rows]
            np.cumsum(counts, out=cu[1:])
        wide[3 * ta :] = cu[1:] - 1
        w, n = self._to_device(wide), self._to_device(narrow)
        return StepInputs(
            input_ids=w[:t],
            positions=w[ta : ta + t],
            slot_mapping=w[2 * ta : 2 * ta + t],
            block_table=n[: b * width].view(b, width),
            seq_lens=n[tw : tw + b],
            cu_seqlens_q=n[tw + ba :],
            logits_indices=w[3 * ta :],
            is_decode=output.is_decode,
            sample_mask=(
                torch.ones(b, dtype=torch.bool)  # every decode row samples
                if decode is not None
                else torch.tensor([e.samples for e in rows], dtype=torch.bool)
            ),
        )
