"""MLA latent KV cache: one latent of kv_lora_rank + rope_dim values a token, shared by all heads.

Bytes of one layer's block (vLLM `MLAAttentionSpec` without "fp8_ds_mla": `block_size *
num_kv_heads * head_size * dtype_size` with num_kv_heads = 1 and no factor 2, since K and V both come from
the latent): token t at page offset t * (kv_lora_rank + rope_dim) * dtype_size; inside it the compressed
latent c_kv (kv_lora_rank values), then the RoPE key k_pe (rope_dim values). DeepSeek: 512 + 64 = 576.
View: "latent", [num_blocks, block_size, kv_lora_rank + rope_dim] (vLLM's MLA shape).
"""

from __future__ import annotations

import dataclasses

import torch

from reference.kv.spec import CacheSpec, LayerGeometry, check_buffer, check_count, strided_view

MLA_DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn, torch.uint8)


@dataclasses.dataclass(frozen=True, kw_only=True)
class MLASpec(CacheSpec):
    kv_lora_rank: int = 512
    rope_dim: int = 64
    dtype: torch.dtype = torch.bfloat16

    def _check_fields(self) -> None:
        check_count("kv_lora_rank", self.kv_lora_rank)
        check_count("rope_dim", self.rope_dim, minimum=0)
        if self.dtype not in MLA_DTYPES:
            raise TypeError(f"dtype: must be one of {MLA_DTYPES}, got {self.dtype}")

    @property
    def head_size(self) -> int:
        return self.kv_lora_rank + self.rope_dim

    @property
    def alignment(self) -> int:
        return self.dtype.itemsize

    @property
    def token_bytes(self) -> int:
        return self.head_size * self.dtype.itemsize

    def views(self, buffer: torch.Tensor, layer: LayerGeometry) -> dict[str, torch.Tensor]:
        check_buffer(buffer, self)
        (region,) = layer.regions
        el = self.dtype.itemsize
        shape = (layer.num_blocks, self.block_size, self.head_size)
        return {
            "latent": strided_view(
                buffer, self.dtype, region.offset, shape, (region.block_stride, self.head_size * el, el)
            )
        }
