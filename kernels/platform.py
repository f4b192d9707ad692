"""Hardware detection: the one place that decides which accelerator this process runs on.

`current_platform` says whether we are on NVIDIA CUDA, AMD ROCm, Intel XPU or plain CPU, names the device,
and sorts its architecture into a family (hopper, blackwell, cdna3, ...) so that policies such as CUDA-graph
capture sizes can be written against families instead of model names. Exactly one backend may be active;
two at once is an error rather than a guess.

Detection reads torch only (`torch.version.hip`, `torch.cuda`, `torch.xpu`), through `TorchProbe`, which
tests replace to impersonate any target. `current_platform` is computed on first use and cached;
`reset_platform()` forgets it.
"""

from __future__ import annotations

import dataclasses
import functools
import platform as _host
import re
import sys
from collections.abc import Callable

import torch

BACKENDS = ("cuda", "rocm", "xpu", "cpu")

# CUDA compute capability major -> family. 10.x (B200/GB200), 11.x (Thor) and 12.x (RTX 50, RTX PRO)
# are all Blackwell parts; 8.9 is Ada, the rest of 8.x Ampere.
_CUDA_FAMILIES = {7: "volta", 9: "hopper", 10: "blackwell", 11: "blackwell", 12: "blackwell"}
# gfx target prefix -> family (CDNA for Instinct, RDNA for Radeon).
_ROCM_FAMILIES = (
    ("gfx908", "cdna1"),
    ("gfx90a", "cdna2"),
    ("gfx94", "cdna3"),
    ("gfx95", "cdna4"),
    ("gfx11", "rdna3"),
    ("gfx12", "rdna4"),
)


def cuda_family(capability: tuple[int, int]) -> str:
    major, minor = capability
    if major == 7:
        return "turing" if minor >= 5 else "volta"
    if major == 8:
        return "ada" if minor == 9 else "ampere"
    return _CUDA_FAMILIES.get(major, "unknown")


def rocm_family(gfx_arch: str) -> str:
    for prefix, family in _ROCM_FAMILIES:
        if gfx_arch.startswith(prefix):
            return family
    return "unknown"


@dataclasses.dataclass(frozen=True)
class Platform:
    """What this process runs on. `torch_device` is the device string torch uses for it."""

    backend: str  # "cuda" | "rocm" | "xpu" | "cpu"
    device_name: str
    device_count: int
    capability: tuple[int, int] | None = None  # CUDA compute capability (ROCm reports its own pair)
    arch: str = ""  # "sm_90", "gfx942", "x86_64", ...
    family: str = "cpu"
    runtime_version: str = ""  # CUDA / HIP runtime torch was built with

    @property
    def torch_device(self) -> str:
        return {"cuda": "cuda", "rocm": "cuda", "xpu": "xpu"}.get(self.backend, "cpu")

    @property
    def slug(self) -> str:
        """Short device name for report folders: 'NVIDIA H200' -> 'h200'."""
        name = self.device_name.lower()
        for vendor in ("nvidia ", "amd ", "intel(r) ", "intel "):
            name = name.removeprefix(vendor)
        return re.sub(r"[^a-z0-9]+", "-", name).strip("-") or self.backend

    def is_cuda(self) -> bool:
        return self.backend == "cuda"

    def is_rocm(self) -> bool:
        return self.backend == "rocm"

    def is_cpu(self) -> bool:
        return self.backend == "cpu"

    def is_gpu(self) -> bool:
        return self.backend != "cpu"

    def has_device_capability(self, minimum: tuple[int, int]) -> bool:
        return self.capability is not None and self.capability >= minimum

    def is_family(self, family: str) -> bool:
        return self.family == family


@dataclasses.dataclass
class TorchProbe:
    """The torch facts detection reads. Tests build one with fake values for any target."""

    hip_version: Callable[[], str | None] = lambda: torch.version.hip
    cuda_version: Callable[[], str | None] = lambda: torch.version.cuda
    cuda_available: Callable[[], bool] = torch.cuda.is_available
    cuda_count: Callable[[], int] = torch.cuda.device_count
    cuda_name: Callable[[], str] = lambda: torch.cuda.get_device_name(0)
    cuda_capability: Callable[[], tuple[int, int]] = lambda: tuple(torch.cuda.get_device_capability(0))
    gcn_arch: Callable[[], str] = lambda: torch.cuda.get_device_properties(0).gcnArchName
    xpu_available: Callable[[], bool] = lambda: hasattr(torch, "xpu") and torch.xpu.is_available()
    xpu_count: Callable[[], int] = lambda: torch.xpu.device_count()
    xpu_name: Callable[[], str] = lambda: torch.xpu.get_device_name(0)
    cpu_name: Callable[[], str] = lambda: _cpu_model_name()
    machine: Callable[[], str] = _host.machine


def _cpu_model_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return _host.processor() or _host.machine()


def detect_platform(probe: TorchProbe | None = None) -> Platform:
    """Decide the backend from torch. Raises RuntimeError if more than one GPU backend is active."""
    probe = probe or TorchProbe()
    active: list[Platform] = []
    if probe.cuda_available():
        capability = probe.cuda_capability()
        if probe.hip_version():
            arch = probe.gcn_arch().split(":")[0]
            active.append(
                Platform(
                    "rocm",
                    probe.cuda_name(),
                    probe.cuda_count(),
                    capability,
                    arch,
                    rocm_family(arch),
                    probe.hip_version() or "",
                )
            )
        else:
            arch = f"sm_{capability[0]}{capability[1]}"
            active.append(
                Platform(
                    "cuda",
                    probe.cuda_name(),
                    probe.cuda_count(),
                    capability,
                    arch,
                    cuda_family(capability),
                    probe.cuda_version() or "",
                )
            )
    if probe.xpu_available():
        active.append(Platform("xpu", probe.xpu_name(), probe.xpu_count(), None, "xpu", "xe"))
    if len(active) > 1:
        raise RuntimeError(f"more than one accelerator backend is active: {[p.backend for p in active]}")
    if active:
        return active[0]
    return Platform("cpu", probe.cpu_name(), 1, None, probe.machine(), "cpu")


@functools.cache
def _cached() -> Platform:
    return detect_platform()


def reset_platform() -> None:
    _cached.cache_clear()


def __getattr__(name: str) -> Platform:
    # `current_platform` is resolved lazily so importing this module never initialises a GPU context.
    if name == "current_platform":
        return _cached()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def require_backend(expected: str, platform: Platform | None = None) -> Platform:
    """Fail closed: raise unless the process really runs on `expected`. Used by the hardware nox sessions."""
    if expected not in BACKENDS:
        raise ValueError(f"expected must be one of {BACKENDS}, got {expected!r}")
    found = platform or detect_platform()
    if found.backend != expected:
        raise RuntimeError(
            f"this session needs a {expected} device but torch sees {found.backend} "
            f"({found.device_name}); torch {torch.__version__}, cuda {torch.version.cuda}, "
            f"hip {torch.version.hip}"
        )
    return found


def describe(platform: Platform) -> str:
    return (
        f"backend={platform.backend} device={platform.device_name!r} count={platform.device_count} "
        f"arch={platform.arch} family={platform.family} runtime={platform.runtime_version or '-'} "
        f"torch={torch.__version__} python={sys.version.split()[0]}"
    )


if __name__ == "__main__":
    # `python -m kernels.platform [--require BACKEND]`: print what we run on; with --require, fail closed.
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--require", choices=BACKENDS)
    args = parser.parse_args()
    try:
        found = require_backend(args.require) if args.require else detect_platform()
    except RuntimeError as err:
        sys.exit(f"platform check failed: {err}")
    print(describe(found))
