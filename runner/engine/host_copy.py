"""Small host-to-device copies that never block the host.

A pageable copy (`torch.tensor(values, device="cuda")`) is synchronous: the host waits until the stream has
run every kernel queued before it. With asynchronous scheduling a whole step is queued ahead of the next
step's inputs, so each such copy would stall the host for that step and undo the overlap. These copies go
through CUDA's caching pinned-memory allocator (`pin_memory`), which keeps a block until the copy that reads
it has run, and are queued with non_blocking.
"""

from __future__ import annotations

import torch


def to_device(values, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """A small host list (or CPU tensor) on `device`, queued on the current stream without blocking."""
    host = values if isinstance(values, torch.Tensor) else torch.tensor(values, dtype=dtype)
    if torch.device(device).type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)
