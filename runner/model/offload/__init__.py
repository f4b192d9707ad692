"""Weight offload: decoder layers whose weights live in host memory and are copied to the device ahead of use
(`LLM(..., cpu_offload_gb=N)`). An offloader comes from a registry by name (`create_offloader`); it is
attached to a model once (`post_init`), after `process_weights_after_loading` (it moves the final tensors)
and before CUDA-graph capture (the graphs then hold its copies). It is an object of its model, never a
module-level singleton."""

from __future__ import annotations

from runner.model.offload.base import OffloadConfig, Offloader
from runner.model.offload.prefetch import PrefetchOffloader

# name -> strategy. vLLM also ships "uva" (the GPU reading pinned host memory directly); it needs a device
# pointer to host memory wrapped as a tensor, which torch does not expose: not built here.
OFFLOADERS: dict[str, type[Offloader]] = {"prefetch": PrefetchOffloader}


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
