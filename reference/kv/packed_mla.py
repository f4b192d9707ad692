"""Packed FP8 MLA caches: bytes, not elements (one latent of 512 NoPE + 64 RoPE values a token).

`fp8_ds_mla` (DeepSeek V3.2, FlashMLA "V32_FP8Sparse"), 656 B a token,
token-interleaved: token t of a block at page offset t * 656:
    [  0, 512)  512 FP8 e4m3fn NoPE values
    [512, 528)  4 fp32 scales, scale i for NoPE values [128 i, 128 i + 128), powers of two
    [528, 656)  64 bf16 RoPE values, unquantized
  page = block_size * 656. View: "entries", uint8 [num_blocks, block_size, 656].

DeepSeek-V4 (FlashMLA "MODEL1_FP8Sparse"), 584 B a token, NOT token-interleaved: a page
holds every token's data row, then every token's scale row, then padding:
    data row t  at t * 576:                  448 FP8 e4m3fn NoPE values, then 64 bf16 RoPE values (128 B)
    scale row t at block_size * 576 + t * 8: 7 UE8M0 scales (one per 64 NoPE values), then 1 pad byte (0)
  page = block_size * 584 rounded up to a multiple of 576 (the decode kernel's TMA stride; FlashMLA's
  `ceil(block_size * 584 / 576) * 576`). A block here is the stored entries: vLLM's DeepSeek-V4 block of 256
  tokens at compress ratio 4 stores 64 entries, block_size=64: 37,376 B of content in a 37,440 B page.
  Views: "data", uint8 [num_blocks, block_size, 576], and "scales", uint8 [num_blocks, block_size, 8].
The byte codecs of one token are in reference.kv.packed_codec.
"""

from __future__ import annotations

import dataclasses

import torch

from reference.kv.spec import CacheSpec, LayerGeometry, Segment, check_buffer, check_count, strided_view

DS_MLA_TOKEN_BYTES = 656  # 512 FP8 + 4 * 4 scale + 64 * 2 RoPE
DSV4_DATA_ROW_BYTES = 576  # 448 FP8 + 64 * 2 RoPE
DSV4_SCALE_ROW_BYTES = 8  # 7 UE8M0 + 1 pad
DSV4_TOKEN_BYTES = DSV4_DATA_ROW_BYTES + DSV4_SCALE_ROW_BYTES  # 584
DSV4_PAGE_ALIGNMENT = 576


def _check_slot(spec: CacheSpec, slot: int) -> None:
    check_count("slot", slot, minimum=0)
    if slot >= spec.block_size:
        raise ValueError(f"slot: must be below block_size {spec.block_size}, got {slot}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class FP8DsMLASpec(CacheSpec):
    """vLLM's "fp8_ds_mla" cache (DeepSeek V3.2)."""

    @property
    def alignment(self) -> int:
        return 4  # keeps the fp32 scales of every entry 4-byte aligned

    @property
    def token_bytes(self) -> int:
        return DS_MLA_TOKEN_BYTES

    def token_segments(self, slot: int) -> tuple[Segment, ...]:
        """The page bytes token `slot` occupies (one run)."""
        _check_slot(self, slot)
        return (Segment(slot * DS_MLA_TOKEN_BYTES, DS_MLA_TOKEN_BYTES),)

    def views(self, buffer: torch.Tensor, layer: LayerGeometry) -> dict[str, torch.Tensor]:
        check_buffer(buffer, self)
        (region,) = layer.regions
        shape = (layer.num_blocks, self.block_size, DS_MLA_TOKEN_BYTES)
        return {
            "entries": strided_view(
                buffer, torch.uint8, region.offset, shape, (region.block_stride, DS_MLA_TOKEN_BYTES, 1)
            )
        }


@dataclasses.dataclass(frozen=True, kw_only=True)
class DeepseekV4Spec(CacheSpec):
    """The DeepSeek-V4 packed FP8 cache: data rows, then scale rows, page aligned to 576 bytes."""

    @property
    def alignment(self) -> int:
        return DSV4_PAGE_ALIGNMENT

    @property
    def token_bytes(self) -> int:
        return DSV4_TOKEN_BYTES

    @property
    def scale_rows_offset(self) -> int:
        """Page offset of the first scale row: after every data row of the block."""
        return self.block_size * DSV4_DATA_ROW_BYTES

    def token_segments(self, slot: int) -> tuple[Segment, ...]:
        """The page bytes token `slot` occupies: its data row and its scale row (two runs)."""
        _check_slot(self, slot)
        return (
            Segment(slot * DSV4_DATA_ROW_BYTES, DSV4_DATA_ROW_BYTES),
            Segment(self.scale_rows_offset + slot * DSV4_SCALE_ROW_BYTES, DSV4_SCALE_ROW_BYTES),
        )

    def views(self, buffer: torch.Tensor, layer: LayerGeometry) -> dict[str, torch.Tensor]:
        check_buffer(buffer, self)
        (region,) = layer.regions
        n, stride = layer.num_blocks, region.block_stride
        return {
            "data": strided_view(
                buffer,
                torch.uint8,
                region.offset,
                (n, self.block_size, DSV4_DATA_ROW_BYTES),
                (stride, DSV4_DATA_ROW_BYTES, 1),
            ),
            "scales": strided_view(
                buffer,
                torch.uint8,
                region.offset + self.scale_rows_offset,
                (n, self.block_size, DSV4_SCALE_ROW_BYTES),
                (stride, DSV4_SCALE_ROW_BYTES, 1),
            ),
        }
