"""Weight offload: decoder layers whose weights live in host memory (`LLM(..., cpu_offload_gb=N,
offload_backend=...)`), copied to the device ahead of use ("prefetch") or read there by the device ("uva"). An
offloader comes from a registry by name (`create_offloader`); it is
attached to a model once (`post_init`), after `process_weights_after_loading` (it moves the final tensors)
and before CUDA-graph capture (the graphs then hold its copies). It is an object of its model, never a
module-level singleton."""

from __future__ import annotations

from runner.model.offload.base import OffloadConfig, Offloader
from runner.model.offload.prefetch import PrefetchOffloader
from runner.model.offload.uva import UvaOffloader

OFFLOADERS: dict[str, type[Offloader]] = {"prefetch": PrefetchOffloader, "uva": UvaOffloader}


def create_offloader(config: OffloadConfig) -> Offloader | None:
    """The offloader of `config`, or None when it offloads nothing (cpu_offload_gb 0)."""
    if config.backend not in OFFLOADERS:
        raise ValueError(f"offload_backend: must be one of {sorted(OFFLOADERS)}, got {config.backend!r}")
    if config.cpu_offload_gb < 0:
        raise ValueError(f"cpu_offload_gb: must be >= 0, got {config.cpu_offload_gb}")
    if config.cpu_offload_gb == 0:
        return None
    return OFFLOADERS[config.backend](config)


__all__ = ["OFFLOADERS", "OffloadConfig", "Offloader", "create_offloader"]
