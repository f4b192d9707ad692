"""The offloader contract: a config, one `post_init(model)` that attaches it, and `detach()`, which gives the model
its weights back (on the device, as tensors of their own) so that they can be reloaded (weight sync from a
trainer) and a new offloader attached; while one is attached the model refuses a reload."""

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
    return sum(t.nbytes for t in layer_tensors(module).values())


def choose_layers(layers: list[nn.Module], gib: float, stride: int) -> list[int]:
    """Decoder layers to offload, ascending: every `stride`-th from the last one backwards until `gib` GiB of
    their weights is covered (at least one layer; all of them at most)."""
    chosen, covered = [], 0
    for i in range(len(layers) - 1, -1, -stride):
        chosen.append(i)
        covered += layer_bytes(layers[i])
        if covered >= gib * 2**30:
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
        self.detached = False
        # the device the model runs on (set by `post_init`); set by `attach`: the offloaded decoder layers
        # (ascending), their tensors' host copies by name (one dict a layer, in that order), the hooks to remove
        self.offloaded: list[int] = []
        self.host: list[dict[str, torch.Tensor]] = []
        self.device: torch.device | None = None
        self.handles: list = []

    def post_init(self, model: nn.Module) -> None:
        """Attach to `model` (its weights final, before CUDA-graph capture). Once: a second call, a model another
        offloader holds, or a detached offloader is an error: re-attaching would offload the slot buffers
        themselves."""
        if self.model is not None or self.detached:
            raise RuntimeError("post_init: this offloader is attached already (or was detached: build a new one)")
        if getattr(model, "offloader", None) is not None:
            raise RuntimeError("post_init: the model has an offloader already; a weight reload must detach it first")
        self.device = next(model.parameters()).device
        self.attach(model)
        self.model = model
        model.offloader = self

    def detach(self) -> None:
        """Give every offloaded tensor storage of its own on the model's device (a copy of its host copy), remove
        the hooks, drop the host copies (and the prefetch slots) and free the model for a reload and a new
        offloader. CUDA graphs captured while attached read the old storage: whoever reloads must recapture them
        (no engine path reloads weights yet)."""
        if self.model is None:
            raise RuntimeError("detach: this offloader is not attached")
        layers = list(self.model.model.layers)
        for i, host in zip(self.offloaded, self.host, strict=True):
            for name, t in layer_tensors(layers[i]).items():
                t.data = host[name].to(self.device, copy=True)
        for handle in self.handles:
            handle.remove()
        self.host, self.handles = [], []
        self.release()
        self.model.offloader = None
        self.model, self.detached = None, True

    def attach(self, model: nn.Module) -> None:
        raise NotImplementedError

    def release(self) -> None:
        """Drop what `attach` allocated beyond the host copies (at `detach`)."""
