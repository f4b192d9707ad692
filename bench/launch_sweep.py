"""What the launch sweeps share: the command line and its GPU gate, the timer, the same-run memcpy roof, and
the per-config line (with the failed-config line and the tolerance verdict of the lossy ops' sweeps).

GPU only (imports triton.testing); the sweep scripts themselves say which kernel and shapes they launch.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

import torch
from triton.testing import do_bench


def parser(doc: str) -> argparse.ArgumentParser:
    """The sweep's command line, described by the first line of its module docstring `doc`."""
    return argparse.ArgumentParser(description=doc.splitlines()[0])


def gpu_args(cli: argparse.ArgumentParser, argv: list[str] | None, sweep: str) -> argparse.Namespace:
    """Parse `argv`; exit, naming the `sweep`, where there is no GPU (the interpreter says nothing of launches)."""
    args = cli.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit(f"{sweep} needs a GPU")
    return args


def time_ms(fn: Callable[[], object]) -> float:
    """Median milliseconds of `fn` after one untimed call (which compiles the kernel for this shape)."""
    fn()
    return do_bench(fn, warmup=50, rep=300, return_mode="median")


def timed_or_none(fn: Callable[[], object], config: str) -> float | None:
    """time_ms(fn), or None after a FAILED line for `config` where the launch raises (out of shared memory etc.)."""
    try:
        return time_ms(fn)
    except Exception as err:  # a config the GPU cannot run: report, go on
        print(f"{config}  FAILED: {type(err).__name__}: {str(err)[:80]}", flush=True)
        return None


def memcpy_gbps(nbytes: int, note: str = "") -> float:
    """GB/s (read + write) of a device-to-device copy of `nbytes`, printed; the roof every config is held to."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    gbps = 2 * src.numel() / time_ms(lambda: dst.copy_(src)) / 1e6
    print(f"memcpy {src.numel() / 2**30:.2f} GiB: {gbps:.0f} GB/s{note}", flush=True)
    return gbps


def line(config: str, ms: float, rate: str, ratios: dict[str, float], verdict: str) -> None:
    """One line per config: time, its `rate` (GB/s, TFLOP/s), each ratio as `0.950x name`, the check's verdict."""
    shown = "".join(f"{value:.3f}x {name}  " for name, value in ratios.items())
    print(f"{config}  {ms * 1e3:8.1f} us  {rate}  {shown}{verdict}", flush=True)


def report(config: str, ms: float, moved: int, memcpy: float, exact: bool, **roofs: float) -> None:
    """line() of a bandwidth op: GB/s of the `moved` bytes, the ratio to each other roof's GB/s (e.g. memset=)
    and to memcpy, and the bit-exact check."""
    gbps = moved / ms / 1e6
    ratios = {name: gbps / roof for name, roof in roofs.items()} | {"memcpy": gbps / memcpy}
    line(config, ms, f"{gbps:5.0f} GB/s", ratios, "exact" if exact else "MISMATCH")
