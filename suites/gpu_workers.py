"""One group of xdist workers per GPU: each worker process sees one GPU, through the backend's visibility
variable, so the same `nox -s cuda` uses 1 or 8 GPUs.

The hardware nox sessions set TOUCHSTONE_GPUS to the number of GPUs visible to them and start WORKERS_PER_GPU
workers per GPU; worker gwN takes visible GPU N mod TOUCHSTONE_GPUS (an entry of the variable when the
session's own visibility was already narrowed, e.g. CUDA_VISIBLE_DEVICES=4,5). The variable must be set before
the worker's first CUDA call: suites/conftest.py does it first thing in pytest_configure.
"""

from __future__ import annotations

from collections.abc import Mapping

VISIBILITY = {"cuda": "CUDA_VISIBLE_DEVICES", "rocm": "HIP_VISIBLE_DEVICES", "xpu": "ZE_AFFINITY_MASK"}


def worker_device(worker: str, gpus: int, visible: str | None) -> str:
    """The GPU (an entry of `visible`, or an index) that xdist worker `worker` ('gw5') runs on."""
    if gpus < 1:
        raise ValueError(f"TOUCHSTONE_GPUS must be >= 1, got {gpus}")
    entries = [entry.strip() for entry in visible.split(",")] if visible else [str(i) for i in range(gpus)]
    if len(entries) < gpus:
        raise ValueError(f"TOUCHSTONE_GPUS={gpus} but only {len(entries)} visible devices: {visible!r}")
    return entries[int(worker.removeprefix("gw")) % gpus]


def assignment(backend: str, env: Mapping[str, str]) -> tuple[str, str] | None:
    """(variable, value) to set in this process, or None when it is not an xdist worker of a GPU session."""
    worker, gpus, variable = env.get("PYTEST_XDIST_WORKER"), env.get("TOUCHSTONE_GPUS"), VISIBILITY.get(backend)
    if not (worker and gpus and variable):
        return None
    return variable, worker_device(worker, int(gpus), env.get(variable))
