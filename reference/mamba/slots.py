"""Per-request state slots of the Mamba decode ops: request i reads and writes slot state_indices[i] of the
state tensor (vLLM's `state_indices_tensor` / `cache_indices`); an entry equal to `pad_slot_id`
(vLLM's PAD_SLOT_ID = -1, a CUDA-graph padding row, or the null block mapped to -1) is skipped: its slot is
neither read nor written and its output row is 0. Other entries must be in [0, num_slots) and distinct (two
requests updating one slot would race in a kernel; which update lands is unspecified), checked here on the
host; kernels do not read slot values on the host (CUDA graphs), so they only skip out-of-range entries.
"""

from __future__ import annotations

import torch

INDEX_DTYPES = (torch.int32, torch.int64)


def check_tensor(name: str, t: object) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: must be a torch.Tensor, got {type(t).__name__}")
    return t


def check_state_indices(state_indices: torch.Tensor | None, batch: int, device: torch.device) -> None:
    """Shape, dtype and device of the slot table (no values: kernel launchers share this)."""
    if state_indices is None:
        return
    check_tensor("state_indices", state_indices)
    if state_indices.dtype not in INDEX_DTYPES:
        raise TypeError(f"state_indices: dtype must be one of {INDEX_DTYPES}, got {state_indices.dtype}")
    if state_indices.dim() != 1 or state_indices.shape[0] != batch:
        raise ValueError(
            f"state_indices: must be 1-D with one slot per request ({batch}), got shape {tuple(state_indices.shape)}"
        )
    if state_indices.device != device:
        raise ValueError(f"state_indices: on {state_indices.device}, the state is on {device}")


def slot_rows(
    state_indices: torch.Tensor | None, batch: int, num_slots: int, pad_slot_id: int, device: torch.device
) -> list[tuple[int, int]]:
    """(request, slot) pairs to update, pad entries dropped; ValueError naming state_indices on bad values."""
    if state_indices is None:
        if batch > num_slots:
            raise ValueError(
                f"state_indices: None means slot i for request i, but the batch {batch} exceeds the {num_slots} slots"
            )
        return [(i, i) for i in range(batch)]
    pairs = [(i, int(s)) for i, s in enumerate(state_indices.tolist()) if int(s) != pad_slot_id]
    slots = [s for _, s in pairs]
    bad = [s for s in slots if not 0 <= s < num_slots]
    if bad:
        raise ValueError(
            f"state_indices: slot {bad[0]} is outside [0, {num_slots}) and is not pad_slot_id ({pad_slot_id})"
        )
    if len(set(slots)) != len(slots):
        raise ValueError("state_indices: a slot appears twice; which request's update would land is unspecified")
    return pairs
