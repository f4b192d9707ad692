"""The offloader contract: a config, and one `post_init(model)` that attaches it."""

from __future__ import annotations

import dataclasses

from torch import nn


@dataclasses.dataclass(frozen=True)
class OffloadConfig:
    cpu_offload_gb: float = 0.0  # weight bytes (GiB) to keep in host memory; whole decoder layers, at least one
    backend: str = "prefetch"
    prefetch_step: int = 1  # offloaded layers copied ahead of the one running


class Offloader:
    def __init__(self, config: OffloadConfig) -> None:
        if config.prefetch_step < 1:
            raise ValueError(f"prefetch_step: must be >= 1, got {config.prefetch_step}")
        self.config = config
        self.model: nn.Module | None = None

    def post_init(self, model: nn.Module) -> None:
        """Attach to `model` (its weights final, before CUDA-graph capture). Once: a second call, or a model
        another offloader holds, is an error: re-attaching would offload the slot buffers themselves."""
        if self.model is not None:
            raise RuntimeError("post_init: this offloader is attached already")
        if getattr(model, "offloader", None) is not None:
            raise RuntimeError("post_init: the model has an offloader already; a weight reload must detach it first")
        self.attach(model)
        self.model = model
        model.offloader = self

    def attach(self, model: nn.Module) -> None:
        raise NotImplementedError
