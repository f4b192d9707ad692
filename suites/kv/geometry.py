"""Geometry checks shared by the KV-cache suites. They read what the allocator really built (the buffer, the
views' strides, the bytes a write through a view lands on) and compare it with the spec's segments, without
restating the layout arithmetic:

- every segment lies inside the buffer;
- segments of different layers (and of different blocks) never overlap;
- a block's segments add up to the spec's real page bytes;
- each region's block stride is the stride of the layer's views (bytes between block b and b + 1);
- the bytes written through a layer's views are exactly the union of that layer's segments.
"""

from __future__ import annotations

import torch

from reference.kv.allocate import KVCache

_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def written_bytes(cache: KVCache, layer: int) -> torch.Tensor:
    """Bool mask over the buffer: the bytes that filling every view of `layer` with all-ones bytes changes."""
    cache.buffer.zero_()
    for view in cache.views[layer].values():
        view.view(_INT_OF_SIZE[view.element_size()]).fill_(-1)
    mask = (cache.buffer != 0).cpu()
    cache.buffer.zero_()
    return mask


def segment_mask(cache: KVCache, layer: int) -> torch.Tensor:
    mask = torch.zeros(cache.buffer.numel(), dtype=torch.bool)
    geometry = cache.geometry[layer]
    for block in range(geometry.num_blocks):
        for offset, nbytes in geometry.segments(block):
            mask[offset : offset + nbytes] = True
    return mask


def check_geometry(cache: KVCache) -> None:
    size = cache.buffer.numel()
    owner = torch.full((size,), -1, dtype=torch.int64)
    for geometry in cache.geometry:
        for block in range(geometry.num_blocks):
            segments = geometry.segments(block)
            assert sum(n for _, n in segments) == cache.spec.real_page_bytes, (
                f"layer {geometry.layer} block {block}: segments {segments} do not add up to the real page "
                f"{cache.spec.real_page_bytes} bytes"
            )
            for offset, nbytes in segments:
                assert 0 <= offset and offset + nbytes <= size, (
                    f"layer {geometry.layer} block {block}: segment ({offset}, {nbytes}) outside the {size}-byte buffer"
                )
                taken = owner[offset : offset + nbytes]
                clash = taken[taken >= 0]
                assert clash.numel() == 0, (
                    f"layer {geometry.layer} block {block}: segment ({offset}, {nbytes}) overlaps a segment of "
                    f"layer {int(clash[0]) // geometry.num_blocks} block {int(clash[0]) % geometry.num_blocks}"
                )
                owner[offset : offset + nbytes] = geometry.layer * geometry.num_blocks + block
    for geometry in cache.geometry:
        strides = {view.stride(0) * view.element_size() for view in cache.views[geometry.layer].values()}
        assert strides == {r.block_stride for r in geometry.regions}, (
            f"layer {geometry.layer}: view block strides {strides} are not the regions' "
            f"{[r.block_stride for r in geometry.regions]}"
        )
        got, want = written_bytes(cache, geometry.layer), segment_mask(cache, geometry.layer)
        assert torch.equal(got, want), (
            f"layer {geometry.layer}: the views write {int(got.sum())} bytes, the segments hold {int(want.sum())}; "
            f"first differing byte {int((got != want).nonzero()[0])}"
        )
