"""Block FP8 W8A8 (DeepSeek-V3's layout): E4M3 weight with one fp32 scale per 128 x 128 tile, activations
quantized per token per 128 columns at run time; the product is the block-FP8 GEMM
(`kernels.block_fp8_gemm` on CUDA, its precision mirror `reference.gemm.block_fp8` elsewhere).

The GEMM takes K in whole blocks, so K is zero-padded to a multiple of 128 once at load (the weight) and per
call (the activation): zero columns add nothing to a sum and never raise a group's amax."""

from __future__ import annotations

import torch

from reference.gemm.block_fp8 import BLOCK
from runner.model.quant.activation import Fp8Groups
from runner.model.quant.online import OnlineScheme, zero_pad_columns
from runner.model.quant.scheme import check_scales, uses_kernels

SLAB_ROWS = 16 * BLOCK
# Where the input comes from an RMSNorm or a SiLU-and-mul on the kernels, that kernel quantizes it
# (Fp8Groups: runner.model.quant.activation); elsewhere (o_proj's attention output) its own kernel does, before
# the GEMM. H200, Llama-3.1-8B's shape, batch 1 (`python -m bench.llm.quant_decode`): 279 output tok/s with a
# quantization launch before every GEMM, 300 with the producers quantizing (1.36x -> 1.47x bf16). Quantizing
# inside the GEMM instead (66e67e6) was dropped: 265 tok/s, and gate_up alone ran at 0.62x memcpy either way.


class Fp8Block(OnlineScheme):
    name = "fp8_block"
    takes_fp8_groups = True  # RMSNorm and SiLU-and-mul can hand over their output already quantized

    def __init__(self, online: bool = True) -> None:
        self.online = online

    def create_weights(self, layer) -> None:
        if self.online:
            return super().create_weights(layer)
        # A checkpoint's fused layer: each shard's scale rows are its own 128-row tiles, so a shard must start
        # on a tile and fill its tiles (the last one may end early).
        last = list(layer.shard_sizes)[-1]
        for shard, size in layer.shard_sizes.items():
            if layer.shard_offsets[shard] % BLOCK or (size % BLOCK and shard != last):
                raise ValueError(
                    f"quantization: fp8_block needs the shards of a fused layer on 128-row tiles; shard {shard!r} "
                    f"has {size} rows at row {layer.shard_offsets[shard]}"
                )
        n, k = layer.out_features, layer.in_features
        layer.register_parameter("weight", layer.new_param((n, k), torch.float8_e4m3fn, exact_dtype=True))
        scales = layer.new_param((-(-n // BLOCK), -(-k // BLOCK)), torch.float32, row_block=BLOCK, exact_dtype=True)
        layer.register_parameter(self.tensor_name("weight_scale_inv"), scales)

    def process_weights_after_loading(self, layer) -> None:
        if self.online:
            return super().process_weights_after_loading(layer)
        scale_name = self.tensor_name("weight_scale_inv")
        w, s = layer.weight.data, getattr(layer, scale_name).data
        del layer.weight
        delattr(layer, scale_name)
        check_scales(scale_name, s)
        # K in whole blocks: zero codes (the scales already cover the last tile)
        layer.register_buffer("weight_fp8", zero_pad_columns(w, BLOCK).contiguous())
        layer.register_buffer("weight_scale_inv", s)

    def quantize(self, layer, w: torch.Tensor) -> None:
        from reference.quant.fp8 import quantize_fp8_blocks

        w = zero_pad_columns(w, BLOCK)
        q = torch.empty(w.shape, dtype=torch.float8_e4m3fn, device=w.device)
        s = torch.empty(-(-w.shape[0] // BLOCK), w.shape[1] // BLOCK, dtype=torch.float32, device=w.device)
        # Tiles are independent, so whole rows of tiles are quantized a slab at a time: the reference's fp32
        # temporaries then cost a slab (about 4 x 2048 x K bytes), not the layer (whole layers at once, the 8B
        # shape's load peaked 0.94 GiB above the per-tensor FP8 scheme's on the H200).
        for row in range(0, w.shape[0], SLAB_ROWS):
            q[row : row + SLAB_ROWS], s[row // BLOCK : (row + SLAB_ROWS) // BLOCK] = quantize_fp8_blocks(
                w[row : row + SLAB_ROWS], block=BLOCK
            )
        layer.register_buffer("weight_fp8", q)
        layer.register_buffer("weight_scale_inv", s)  # the name HF's fine-grained FP8 checkpoints use

    def apply(self, layer, x: torch.Tensor | Fp8Groups) -> torch.Tensor:
        if isinstance(x, Fp8Groups):  # quantized by the kernel that produced it (whole groups, no padding)
            from kernels.block_fp8_gemm import block_fp8_gemm

            return block_fp8_gemm(x.codes, x.scales, layer.weight_fp8, layer.weight_scale_inv, x.dtype)
        a = zero_pad_columns(x, BLOCK)
        if uses_kernels(x):
            from kernels.block_fp8_gemm import block_fp8_gemm
            from kernels.fp8_quant import quantize_fp8

            aq, a_s = quantize_fp8(a, granularity="group", group_size=BLOCK)
            return block_fp8_gemm(aq, a_s, layer.weight_fp8, layer.weight_scale_inv, x.dtype)
        from reference.gemm.block_fp8 import block_fp8_gemm_mirror
        from reference.quant.fp8 import quantize_fp8

        aq, a_s = quantize_fp8(a, granularity="group", group_size=BLOCK)
        return block_fp8_gemm_mirror(aq, a_s, layer.weight_fp8, layer.weight_scale_inv, x.dtype)
