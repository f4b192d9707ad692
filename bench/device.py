"""Device housekeeping the harness needs around measurements: synchronize, and give memory back.

Which device this is comes from `kernels.platform` (the only place that detects hardware); these helpers
take the torch device string it reports ('cuda' for CUDA and ROCm, 'xpu', 'cpu').
"""

from __future__ import annotations

import gc
import sys

import torch


def synchronize(torch_device: str) -> None:
    if torch_device == "cuda":
        torch.cuda.synchronize()
    elif torch_device == "xpu":
        torch.xpu.synchronize()


def release_memory(torch_device: str) -> None:
    """Drop unreachable tensors and return cached blocks: the next (larger) case starts from a clean pool.

    Never raises: after a sticky device error (illegal address, ...) every later call fails, and the run
    should go on recording those failures row by row rather than die here.
    """
    gc.collect()
    try:
        if torch_device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        elif torch_device == "xpu":
            torch.xpu.synchronize()
            torch.xpu.empty_cache()
    except RuntimeError as err:
        print(f"warning: could not release device memory: {err}", file=sys.stderr, flush=True)


def out_of_memory_errors() -> tuple[type[BaseException], ...]:
    """Exception types that mean 'this case does not fit', recorded as a skip rather than an error."""
    return (torch.cuda.OutOfMemoryError, MemoryError)
