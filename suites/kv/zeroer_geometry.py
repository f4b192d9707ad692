"""The zeroer's geometry regression check: spec -> allocator -> zeroer table, asserted on what the table
means, read against what the allocator really built (its buffer and its views' strides and bytes), never by
redoing the layout arithmetic:

- only attention groups have rows, and every layer of each has its rows, in its group's buffer;
- each row's block stride is a real block stride of its layer's views;
- the bytes a layer's rows clear per block add up to the spec's real page (the content, not the padded page,
  not the stride);
- every segment lies inside its layer's bytes (those its views reach), and together they cover them;
- segments of different layers (and blocks) never overlap.

Layer-major caches (every older format: one layer's blocks in one run, stride = page) and packed ones (the
newer DeepSeek-V4 block rows holding every layer's page side by side, stride = layers x page > the span) take
separate branches, so that a failure names the defect of its format (vLLM #50276: the page size used as the
stride, or the whole packed row cleared as one layer's page).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from reference.kv.allocate import KVCache
from reference.kv.hybrid import MambaSpec
from reference.kv.zeroer import ZeroerTable, ZeroRow
from suites.kv.geometry import written_bytes


def view_strides(cache: KVCache, layer: int) -> set[int]:
    """Bytes between block b and b + 1 in the layer's views, as the allocator built them."""
    return {view.stride(0) * view.element_size() for view in cache.views[layer].values()}


def _check_packed(name: str, cache: KVCache, layer: int, rows: list[ZeroRow]) -> None:
    spec, real = cache.spec, view_strides(cache, layer)
    for row in rows:
        assert row.block_stride in real, (
            f"packed {name!r} layer {layer}: block stride {row.block_stride} is not the packed row's {sorted(real)} "
            f"bytes"
            + (
                f": the page size ({spec.page_bytes}) used as the stride puts block b + 1 on the next "
                f"layer's block b (vLLM #50276)"
                if row.block_stride == spec.page_bytes
                else ""
            )
        )
        assert row.nbytes < row.block_stride or cache.num_layers == 1, (
            f"packed {name!r} layer {layer}: clears {row.nbytes} bytes a block, the whole {row.block_stride}-byte "
            f"row of {cache.num_layers} layers: it wipes the neighbouring layers' pages (stride used as span)"
        )
    cleared = sum(row.nbytes for row in rows)
    assert cleared == spec.real_page_bytes, (
        f"packed {name!r} layer {layer}: clears {cleared} bytes a block, the spec's page holds "
        f"{spec.real_page_bytes} (page with its alignment padding: {spec.page_bytes})"
    )


def _check_layer_major(name: str, cache: KVCache, layer: int, rows: list[ZeroRow]) -> None:
    spec, real = cache.spec, view_strides(cache, layer)
    strides = {row.block_stride for row in rows}
    assert strides == real, (
        f"layer-major {name!r} layer {layer}: row block strides {sorted(strides)} are not its views' {sorted(real)}"
    )
    cleared = sum(row.nbytes for row in rows)
    assert cleared == spec.real_page_bytes, (
        f"layer-major {name!r} layer {layer}: clears {cleared} bytes a block in {len(rows)} segment(s), the spec's "
        f"page holds {spec.real_page_bytes}" + (" (K/V-outermost: one segment per part)" if len(rows) > 1 else "")
    )


def row_mask(size: int, row: ZeroRow) -> torch.Tensor:
    """The bytes the row clears over all its blocks (the table's definition of a row)."""
    mask = torch.zeros(size, dtype=torch.bool)
    for block in range(row.num_blocks):
        start = row.offset + block * row.block_stride
        mask[start : start + row.nbytes] = True
    return mask


def check_zeroer_table(groups: Mapping[str, KVCache | MambaSpec], table: ZeroerTable) -> None:
    attention = {name: g for name, g in groups.items() if isinstance(g, KVCache)}
    owners = set(table.owners)
    stray = {name for name, _ in owners} - set(attention)
    assert not stray, f"rows for non-attention groups {sorted(stray)}: only attention groups are zeroed"
    wanted = {(name, layer) for name, cache in attention.items() for layer in range(cache.num_layers)}
    assert owners == wanted, f"layers without rows: {sorted(wanted - owners)}"
    owner_maps: dict[int, torch.Tensor] = {}
    labels = sorted(wanted)
    for name, cache in attention.items():
        size = cache.buffer.numel()
        for layer in range(cache.num_layers):
            rows = [row for row, owner in zip(table.rows, table.owners, strict=True) if owner == (name, layer)]
            for row in rows:
                assert table.buffers[row.buffer] is cache.buffer, (
                    f"{name!r} layer {layer}: row {row} indexes buffer {row.buffer}, not its group's buffer"
                )
                assert row.num_blocks == cache.num_blocks, (
                    f"{name!r} layer {layer}: row {row} covers {row.num_blocks} blocks, the cache has "
                    f"{cache.num_blocks}"
                )
            if cache.packed:
                _check_packed(name, cache, layer, rows)
            else:
                _check_layer_major(name, cache, layer, rows)
            region = written_bytes(cache, layer)
            cleared = torch.zeros(size, dtype=torch.bool)
            for row in rows:
                mask = row_mask(size, row)
                assert int(mask.sum()) == row.num_blocks * row.nbytes, (
                    f"{name!r} layer {layer}: row {row}: its blocks' segments overlap one another"
                )
                outside = mask & ~region
                assert not outside.any(), (
                    f"{name!r} layer {layer}: row {row} clears byte {int(outside.nonzero()[0])}, outside the bytes "
                    f"of its layer's views"
                )
                cleared |= mask
            assert torch.equal(cleared, region), (
                f"{name!r} layer {layer}: {int((region & ~cleared).sum())} bytes of its views are never cleared"
            )
            owner = owner_maps.setdefault(id(cache.buffer), torch.full((size,), -1, dtype=torch.int64))
            taken = owner[cleared]
            clash = taken[taken >= 0]
            assert clash.numel() == 0, f"{name!r} layer {layer}: its segments overlap those of {labels[int(clash[0])]}"
            owner[cleared] = labels.index((name, layer))
