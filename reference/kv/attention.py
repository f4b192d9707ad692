"""Full-attention KV cache: K and V of `num_kv_heads` heads, with separate K and V head sizes.

Bytes of one layer's block (vLLM `FullAttentionSpec.real_page_size_bytes =
block_size * num_kv_heads * (head_size + head_size_v) * dtype_size`):

    block-first (kv_outer=False; FlashInfer/Triton order): page = [ K | V ]
        K: block_size * num_kv_heads * head_size   elements at page offset 0
        V: block_size * num_kv_heads * head_size_v elements right after K
    K/V-outermost (kv_outer=True; FlashAttention's (2, num_blocks, ...) order): all blocks' K, then all
        blocks' V; a block is two segments, K's and V's, each strided by its own size.

Inside K (and V) the element order is "NHD" = [block_size, num_kv_heads, head] or "HND" =
[num_kv_heads, block_size, head] (HND only swaps the token and head dims).
Views: "k" and "v", [num_blocks, block_size, H, D] for NHD, [num_blocks, H, block_size, D] for HND.
"""

from __future__ import annotations

import dataclasses

import torch

from reference.kv.spec import CacheSpec, LayerGeometry, check_buffer, check_count, strided_view

KV_DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn, torch.float8_e5m2, torch.uint8)
LAYOUTS = ("NHD", "HND")


@dataclasses.dataclass(frozen=True, kw_only=True)
class FullAttentionSpec(CacheSpec):
    num_kv_heads: int
    head_size: int
    head_size_v: int | None = None  # None: same as head_size
    dtype: torch.dtype = torch.bfloat16
    layout: str = "NHD"
    kv_outer: bool = False

    def _check_fields(self) -> None:
        check_count("num_kv_heads", self.num_kv_heads)
        check_count("head_size", self.head_size)
        if self.head_size_v is not None:
            check_count("head_size_v", self.head_size_v)
        if self.dtype not in KV_DTYPES:
            raise TypeError(f"dtype: must be one of {KV_DTYPES}, got {self.dtype}")
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout: must be one of {LAYOUTS}, got {self.layout!r}")
        if not isinstance(self.kv_outer, bool):
            raise ValueError(f"kv_outer: must be a bool, got {self.kv_outer!r}")

    @property
    def v_head_size(self) -> int:
        return self.head_size if self.head_size_v is None else self.head_size_v

    @property
    def alignment(self) -> int:
        return self.dtype.itemsize

    @property
    def k_block_bytes(self) -> int:
        return self.block_size * self.num_kv_heads * self.head_size * self.dtype.itemsize

    @property
    def v_block_bytes(self) -> int:
        return self.block_size * self.num_kv_heads * self.v_head_size * self.dtype.itemsize

    @property
    def token_bytes(self) -> int:
        return self.num_kv_heads * (self.head_size + self.v_head_size) * self.dtype.itemsize

    def part_spans(self) -> tuple[int, ...]:
        if self.kv_outer:
            return (self.k_block_bytes, self.v_block_bytes)
        return (self.real_page_bytes,)

    def _view(self, buffer: torch.Tensor, offset: int, block_stride: int, num_blocks: int, head: int):
        el, heads, tokens = self.dtype.itemsize, self.num_kv_heads, self.block_size
        if self.layout == "NHD":
            shape, strides = (num_blocks, tokens, heads, head), (block_stride, heads * head * el, head * el, el)
        else:
            shape, strides = (num_blocks, heads, tokens, head), (block_stride, tokens * head * el, head * el, el)
        return strided_view(buffer, self.dtype, offset, shape, strides)

    def views(self, buffer: torch.Tensor, layer: LayerGeometry) -> dict[str, torch.Tensor]:
        check_buffer(buffer, self)
        n = layer.num_blocks
        if self.kv_outer:
            k_region, v_region = layer.regions
            v_offset, v_stride = v_region.offset, v_region.block_stride
        else:
            (k_region,) = layer.regions
            v_offset, v_stride = k_region.offset + self.k_block_bytes, k_region.block_stride
        return {
            "k": self._view(buffer, k_region.offset, k_region.block_stride, n, self.head_size),
            "v": self._view(buffer, v_offset, v_stride, n, self.v_head_size),
        }
