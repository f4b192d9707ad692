"""Allocation: one byte buffer for `num_layers` layers of one cache spec, and each layer's typed views into it.

The buffer holds num_layers * num_blocks * page_bytes bytes; where each layer's blocks lie (layer-major or
packed side by side in each block row) is the spec's `geometry` (reference.kv.spec). Views alias the buffer:
a write through a layer's view lands in that layer's segments and nowhere else. The buffer starts zeroed
(`fill` may choose another byte, e.g. a canary for tests of code that must not touch it).
"""

from __future__ import annotations

import dataclasses

import torch

from reference.kv.spec import CacheSpec, LayerGeometry, check_count


@dataclasses.dataclass(frozen=True)
class KVCache:
    spec: CacheSpec
    num_blocks: int
    num_layers: int
    packed: bool
    buffer: torch.Tensor  # uint8 [num_layers * num_blocks * page_bytes]
    geometry: tuple[LayerGeometry, ...]  # one per layer
    views: tuple[dict[str, torch.Tensor], ...]  # one per layer: the spec's named tensors


def allocate_kv_cache(
    spec: CacheSpec,
    num_blocks: int,
    num_layers: int = 1,
    *,
    packed: bool = False,
    device: torch.device | str = "cpu",
    fill: int = 0,
) -> KVCache:
    """Build the buffer and the per-layer views of `num_layers` layers of `spec`, `num_blocks` blocks each."""
    if not isinstance(spec, CacheSpec):
        raise TypeError(f"spec: must be a CacheSpec, got {type(spec).__name__}")
    check_count("fill", fill, minimum=0)
    if fill > 255:
        raise ValueError(f"fill: must be a byte value in [0, 255], got {fill}")
    if not isinstance(packed, bool):
        raise ValueError(f"packed: must be a bool, got {packed!r}")
    geometry = spec.geometry(num_blocks, num_layers, packed)
    buffer = torch.full((spec.buffer_bytes(num_blocks, num_layers),), fill, dtype=torch.uint8, device=device)
    views = tuple(spec.views(buffer, layer) for layer in geometry)
    return KVCache(spec, num_blocks, num_layers, packed, buffer, geometry, views)
