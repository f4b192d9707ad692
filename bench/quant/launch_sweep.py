"""What the quantizers' launch sweeps share: the timer, the same-run memcpy roof, and the per-config line.

GPU only (imports triton.testing); the sweep scripts themselves say which kernel and shapes they launch.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from triton.testing import do_bench


def time_ms(fn: Callable[[], object]) -> float:
    """Median milliseconds of `fn` after one untimed call (which compiles the kernel for this shape)."""
    fn()
    return do_bench(fn, warmup=50, rep=300, return_mode="median")


def memcpy_gbps(nbytes: int, note: str = "") -> float:
    """GB/s (read + write) of a device-to-device copy of `nbytes`, printed; the roof every config is held to."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    gbps = 2 * src.numel() / time_ms(lambda: dst.copy_(src)) / 1e6
    print(f"memcpy {src.numel() / 2**30:.2f} GiB: {gbps:.0f} GB/s{note}", flush=True)
    return gbps


def report(config: str, ms: float, moved: int, memcpy: float, exact: bool) -> None:
    """One line per config: time, GB/s of the `moved` bytes, the ratio to memcpy, and the bit-exact check."""
    gbps = moved / ms / 1e6
    print(f"{config}  {ms * 1e3:7.1f} us  {gbps:5.0f} GB/s  {gbps / memcpy:.3f}x memcpy  "
          f"{'exact' if exact else 'MISMATCH'}", flush=True)
