"""What every KV-cache spec shares: the bytes one layer's block occupies, and where the blocks of `num_layers`
layers lie in one byte buffer (vLLM's `KVCacheSpec`: `page_size_bytes`, `page_size_padded`). A block's stride
and the bytes it spans are two numbers, never one (vLLM PR #50276 fixed a zeroer that conflated them).

Terms, all in bytes:
- token_bytes: content one token (one stored entry) takes in one layer.
- real_page_bytes = block_size * token_bytes: content of one layer's block.
- page_bytes: what one layer's block is given: real_page_bytes rounded up to the spec's `alignment`, or
  `page_bytes_padded` where set (hybrid unification pads attention or Mamba pages to a common size).
- parts: a block may be cut into parts strided separately (FlashAttention's K/V-outermost order keeps all
  blocks' K, then all blocks' V). Each part has a reserve (bytes per block in its run) and a span (content).

Placement of `num_layers` layers and `num_blocks` blocks in one buffer of num_layers * num_blocks * page_bytes:
- layer-major (packed=False): layer l's blocks form one run starting at l * num_blocks * page_bytes; part p
  starts num_blocks * (reserves of parts before p) further on; block stride = the part's reserve.
- packed (block-major, vLLM's BLHNC, used by DeepSeek-V4): block b holds every layer's page side by side;
  layer l's block b starts at l * page_bytes + b * num_layers * page_bytes. The block stride
  (num_layers * page_bytes) is larger than the bytes a block occupies (its span).

A block's segments are the (offset, nbytes) runs of content it occupies in the buffer: padding is not in them.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import torch


class Segment(NamedTuple):
    """Bytes [offset, offset + nbytes) of the buffer."""

    offset: int
    nbytes: int


@dataclasses.dataclass(frozen=True)
class Region:
    """One strided run of blocks: block b occupies [offset + b * block_stride, ... + nbytes)."""

    offset: int
    block_stride: int
    nbytes: int


@dataclasses.dataclass(frozen=True)
class LayerGeometry:
    """Where one layer's blocks lie in the buffer: one region per part of a block."""

    layer: int
    num_blocks: int
    regions: tuple[Region, ...]

    def segments(self, block: int) -> tuple[Segment, ...]:
        if not 0 <= block < self.num_blocks:
            raise ValueError(f"block: must be in [0, {self.num_blocks}), got {block}")
        return tuple(Segment(r.offset + block * r.block_stride, r.nbytes) for r in self.regions)


def check_count(name: str, value: object, minimum: int = 1) -> None:
    """`value` is an int (not a bool) of at least `minimum`, else ValueError naming it."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}: must be an integer >= {minimum}, got {value!r}")


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


@dataclasses.dataclass(frozen=True, kw_only=True)
class CacheSpec:
    """Base of every attention cache spec. Subclasses define `token_bytes` and `views`, and may set
    `alignment` (pages are rounded up to it; it is also the element size views need) and `part_spans`."""

    block_size: int
    page_bytes_padded: int | None = None

    def __post_init__(self) -> None:
        check_count("block_size", self.block_size)
        self._check_fields()
        if self.page_bytes_padded is not None:
            check_count("page_bytes_padded", self.page_bytes_padded)
            if self.page_bytes_padded < self.real_page_bytes or self.page_bytes_padded % self.alignment:
                raise ValueError(
                    f"page_bytes_padded: must be a multiple of {self.alignment} of at least the real "
                    f"page {self.real_page_bytes} bytes, got {self.page_bytes_padded}"
                )
            if len(self.part_spans()) > 1:
                raise ValueError("page_bytes_padded: only a spec whose block is one part can be padded")

    def _check_fields(self) -> None:
        """Subclass field checks (ValueError/TypeError naming the field)."""

    @property
    def token_bytes(self) -> int:
        raise NotImplementedError

    @property
    def alignment(self) -> int:
        """Pages are whole multiples of this many bytes (at least the element size of the views)."""
        return 1

    @property
    def real_page_bytes(self) -> int:
        return self.block_size * self.token_bytes

    @property
    def page_bytes(self) -> int:
        if self.page_bytes_padded is not None:
            return self.page_bytes_padded
        return round_up(self.real_page_bytes, self.alignment)

    def part_spans(self) -> tuple[int, ...]:
        """Content bytes of each part of a block (one part unless the layout strides K and V apart)."""
        return (self.real_page_bytes,)

    def part_reserves(self) -> tuple[int, ...]:
        """Bytes each part of a block reserves in its run: the page itself when the block is one part."""
        spans = self.part_spans()
        return (self.page_bytes,) if len(spans) == 1 else spans

    def block_stride(self, num_layers: int, packed: bool) -> int:
        """Bytes from block b to block b + 1 of one layer (one-part blocks)."""
        return self.page_bytes * (num_layers if packed else 1)

    def buffer_bytes(self, num_blocks: int, num_layers: int = 1) -> int:
        return num_blocks * num_layers * self.page_bytes

    def geometry(self, num_blocks: int, num_layers: int = 1, packed: bool = False) -> tuple[LayerGeometry, ...]:
        """Per-layer placement in a buffer of `buffer_bytes(num_blocks, num_layers)` bytes."""
        check_count("num_blocks", num_blocks)
        check_count("num_layers", num_layers)
        spans, reserves = self.part_spans(), self.part_reserves()
        if packed and len(spans) > 1:
            raise ValueError("packed: a block cut into separately strided parts cannot be packed with other layers")
        layers = []
        for layer in range(num_layers):
            if packed:
                regions = (Region(layer * self.page_bytes, self.block_stride(num_layers, True), spans[0]),)
            elif len(spans) == 1:
                regions = (
                    Region(layer * num_blocks * self.page_bytes, self.block_stride(num_layers, False), spans[0]),
                )
            else:  # part p of every block, one run after another: all blocks' K, then all blocks' V
                base = layer * num_blocks * self.page_bytes
                regions = tuple(
                    Region(base + num_blocks * sum(reserves[:p]), reserves[p], spans[p]) for p in range(len(spans))
                )
            layers.append(LayerGeometry(layer, num_blocks, regions))
        return tuple(layers)

    def views(self, buffer: torch.Tensor, layer: LayerGeometry) -> dict[str, torch.Tensor]:
        """The typed tensors of one layer over `buffer` (no copy)."""
        raise NotImplementedError

    def with_block_size(self, block_size: int) -> CacheSpec:
        """The same spec with `block_size` tokens a block; a padded page scales with the block size."""
        check_count("block_size", block_size)
        padded = self.page_bytes_padded
        if padded is not None:
            if padded * block_size % self.block_size:
                raise ValueError(f"block_size: {block_size} does not scale the padded page {padded} to whole bytes")
            padded = padded * block_size // self.block_size
        return dataclasses.replace(self, block_size=block_size, page_bytes_padded=padded)

    def with_page_bytes(self, page_bytes: int) -> CacheSpec:
        """The same spec with its page padded to `page_bytes`."""
        return dataclasses.replace(self, page_bytes_padded=page_bytes)


def strided_view(
    buffer: torch.Tensor, dtype: torch.dtype, offset: int, shape: tuple[int, ...], byte_strides: tuple[int, ...]
) -> torch.Tensor:
    """A `dtype` view of a 1-D uint8 `buffer`, at byte `offset` with strides in bytes; offset and strides must
    be whole elements (a misaligned view would silently read the wrong bytes)."""
    size = dtype.itemsize
    if offset % size or any(s % size for s in byte_strides):
        raise ValueError(
            f"buffer: a {dtype} view needs offset and strides in multiples of {size} bytes, got "
            f"offset {offset}, strides {byte_strides}"
        )
    end = offset + sum((n - 1) * s for n, s in zip(shape, byte_strides, strict=True)) + size
    if end > buffer.numel():
        raise ValueError(f"buffer: {buffer.numel()} bytes, but the view reaches byte {end}")
    typed = buffer.view(dtype)
    return typed.as_strided(shape, tuple(s // size for s in byte_strides), typed.storage_offset() + offset // size)


def check_buffer(buffer: torch.Tensor, spec: CacheSpec) -> None:
    """`buffer` is a contiguous 1-D uint8 tensor whose length is whole elements of the spec's alignment."""
    if not isinstance(buffer, torch.Tensor) or buffer.dtype != torch.uint8:
        raise TypeError(f"buffer: must be a torch.uint8 tensor, got {getattr(buffer, 'dtype', type(buffer).__name__)}")
    if buffer.dim() != 1 or not buffer.is_contiguous():
        raise ValueError(f"buffer: must be 1-D and contiguous, got shape {tuple(buffer.shape)}")
    if buffer.numel() % spec.alignment:
        raise ValueError(f"buffer: {buffer.numel()} bytes is not a multiple of {spec.alignment}")
