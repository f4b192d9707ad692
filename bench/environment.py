"""Facts recorded with every row: device, driver, clocks at start, software versions, git state.

Everything here is read-only: clocks and power are queried with nvidia-smi, never set (clocks are recorded,
not changed). Hardware detection itself is `kernels.platform`'s job; this module only asks it. When the tree
is copied without .git (as on the remote GPU machines), set TOUCHSTONE_GIT_SHA and TOUCHSTONE_GIT_DIRTY
(true/false) to the values of the checkout the copy came from.
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib.metadata
import os
import pathlib
import subprocess
import sys

import torch

from kernels.platform import Platform, detect_platform

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
# The clock/power/temperature fields the brief asks for (read-only queries), named as they appear in rows.
CLOCK_FIELDS = {
    "clocks.sm": "sm",
    "clocks.mem": "mem",
    "clocks.max.sm": "max_sm",
    "clocks.max.mem": "max_mem",
    "power.limit": "power_limit",
    "temperature.gpu": "temp_c",
}
# First choice adds the bus id (to find torch's GPU among several) and the driver; if this nvidia-smi
# rejects a field, the clock fields alone are queried.
NVIDIA_SMI_QUERIES = (("pci.bus_id", "driver_version", *CLOCK_FIELDS), tuple(CLOCK_FIELDS))


@dataclasses.dataclass(frozen=True)
class Environment:
    device: str
    backend: str
    arch: str
    driver: str
    clocks_at_start: str
    torch: str
    triton: str
    python: str
    git_sha: str
    dirty: str  # "true" | "false" | "unknown"
    torch_device: str
    slug: str

    def row_fields(self) -> dict[str, str]:
        """The fields every report row carries (ROW_FIELDS)."""
        return {name: getattr(self, name) for name in ROW_FIELDS}


# The environment's columns in every report row: all but the torch device string and the folder slug.
ROW_FIELDS = tuple(
    field.name for field in dataclasses.fields(Environment) if field.name not in ("torch_device", "slug")
)


def _run(args: list[str], timeout: float = 15.0) -> str | None:
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def _bus_id(text: str) -> tuple[int, int, int] | None:
    try:
        domain, bus, rest = text.split(":")
        return int(domain, 16), int(bus, 16), int(rest.split(".")[0], 16)
    except ValueError:
        return None


def parse_nvidia_smi(text: str, fields: tuple[str, ...], bus_id: tuple[int, int, int] | None) -> tuple[str, str]:
    """(driver, clocks) from `nvidia-smi --query-gpu=<fields> --format=csv,noheader` output.

    Picks the line whose PCI bus id (domain, bus, device) matches torch's device; else the first line,
    flagged when there are several, since CUDA_VISIBLE_DEVICES may renumber GPUs.
    """
    gpus = [
        dict(zip(fields, (v.strip() for v in line.split(",")), strict=False))
        for line in text.splitlines()
        if line.strip()
    ]
    if not gpus:
        return "unknown", "unknown"
    matched = [gpu for gpu in gpus if bus_id is not None and _bus_id(gpu.get("pci.bus_id", "")) == bus_id]
    gpu = (matched or gpus)[0]
    note = " (first GPU listed; torch's not matched)" if len(gpus) > 1 and not matched else ""
    clocks = "; ".join(f"{name}={gpu[field]}" for field, name in CLOCK_FIELDS.items() if field in gpu)
    return gpu.get("driver_version", "unknown"), clocks + note


def _torch_bus_id() -> tuple[int, int, int] | None:
    try:
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        return (props.pci_domain_id, props.pci_bus_id, props.pci_device_id)
    except (AttributeError, RuntimeError, AssertionError):
        return None


def driver_and_clocks(platform: Platform) -> tuple[str, str]:
    if platform.is_cuda():
        driver, clocks = "unknown", "nvidia-smi unavailable"
        for fields in NVIDIA_SMI_QUERIES:
            out = _run(["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader"])
            if out is not None:
                driver, clocks = parse_nvidia_smi(out, fields, _torch_bus_id())
                break
        return f"{driver} (torch built for cuda {platform.runtime_version})", clocks
    if platform.is_rocm():
        return f"hip {platform.runtime_version}", "not read on rocm"
    if platform.is_cpu():
        return "n/a", _cpu_clock()
    return "unknown", f"not read on {platform.backend}"


def _cpu_clock() -> str:
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("cpu MHz"):
                return f"cpu0={line.split(':', 1)[1].strip()} MHz"
    except OSError:
        pass
    return "n/a"


def _version(*distributions: str) -> str:
    for name in distributions:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "absent"


def git_state(root: pathlib.Path = REPO_ROOT) -> tuple[str, str]:
    sha = os.environ.get("TOUCHSTONE_GIT_SHA") or (_run(["git", "-C", str(root), "rev-parse", "HEAD"]) or "")
    dirty = os.environ.get("TOUCHSTONE_GIT_DIRTY", "").lower()
    if not dirty:
        status = _run(["git", "-C", str(root), "status", "--porcelain"])
        dirty = "unknown" if status is None else ("true" if status.strip() else "false")
    return sha.strip() or "unknown", dirty


def timestamp() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def collect(platform: Platform | None = None) -> Environment:
    """Read every fact once, at the start of a bench run."""
    platform = platform or detect_platform()
    driver, clocks = driver_and_clocks(platform)
    sha, dirty = git_state()
    return Environment(
        device=platform.device_name,
        backend=platform.backend,
        arch=platform.arch,
        driver=driver,
        clocks_at_start=clocks,
        torch=torch.__version__,
        triton=_version("triton", "pytorch-triton-rocm", "pytorch-triton-xpu", "pytorch-triton"),
        python=sys.version.split()[0],
        git_sha=sha,
        dirty=dirty,
        torch_device=platform.torch_device,
        slug=platform.slug,
    )
