"""The offloader contract: a config, and one `post_init(model)` that attaches it."""

from __future__ import annotations

import dataclasses

import torch
from torch import nn


@dataclasses.dataclass(frozen=True)
class OffloadConfig:
    cpu_offload_gb: float = 0.0  # weight bytes (GiB) to keep in host memory; whole decoder layers, at least one
    backend: str = "prefetch"
    prefetch_step: int = 1  # offloaded layers copied ahead of the one running


def layer_tensors(module: nn.Module) -> dict[str, torch.Tensor]:
    """A decoder layer's parameters and buffers by name: what an offloader moves."""
    return {**dict(module.named_parameters()), **dict(module.named_buffers())}


def layer_bytes(module: nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in layer_tensors(module).values())


def choose_layers(layers: list[nn.Module], gib: float, stride: int) -> list[int]:
    """Decoder layers to offload, ascending: every `stride`-th from the last one backwards until `gib` GiB of
    their weights is covered (at least one layer; all of them at most)."""
    chosen = []
    for i in range(len(layers) - 1, -1, -stride):
        chosen.append(i)
        if sum(layer_bytes(layers[j]) for j in chosen) >= gib * 2**30:
            break
    return sorted(chosen)


def host_copy(t: torch.Tensor, pinned: bool) -> torch.Tensor:
    """A contiguous copy of `t` in host memory (page-locked where `pinned`)."""
    copy = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=pinned)
    copy.copy_(t.detach())
    return copy


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
