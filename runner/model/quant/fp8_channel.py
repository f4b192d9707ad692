"""FP8 per-channel weights, as compressed-tensors' FP8_DYNAMIC preset (llm-compressor's data-free FP8) and AMD
Quark's PTPC scheme store them: an E4M3 weight with one scale per output row (`weight_scale` [N, 1], Quark's [N]),
activations quantized to E4M3 per token at run time. A fused layer's parts keep their own scales: the scale
vector is their rows, end to end.

The arithmetic is per-tensor FP8's with a scale per output column (`Fp8PerTensor`, whose fused checkpoint layers
already hold one scale per row): y = (x_q W_q^T) * (s_x[m] * s_w[n]), summed in fp32 and rounded once; on CUDA
row-wise `torch._scaled_mm` at every batch size (the block-FP8 GEMM takes one scale per 128-row tile)."""

from __future__ import annotations

import torch

from runner.model.quant.fp8_tensor import Fp8PerTensor
from runner.model.quant.scheme import check_scales


class Fp8PerChannel(Fp8PerTensor):
    name = "fp8_channel"

    def __init__(self, scale_shape: str = "column") -> None:
        if scale_shape not in ("column", "vector"):
            raise ValueError(f"scale_shape: must be 'column' or 'vector', got {scale_shape!r}")
        super().__init__(online=False)
        # how the checkpoint shapes the scales: [N, 1] (compressed-tensors) or [N] (AMD Quark)
        self.scale_shape = scale_shape

    def create_weights(self, layer) -> None:
        shape = (layer.out_features, layer.in_features)
        layer.register_parameter("weight", layer.new_param(shape, torch.float8_e4m3fn, exact_dtype=True))
        # a bf16 or fp32 scale, either exact in fp32
        scales = (layer.out_features, 1) if self.scale_shape == "column" else (layer.out_features,)
        layer.register_parameter("weight_scale", layer.new_param(scales, torch.float32))

    def process_weights_after_loading(self, layer) -> None:
        codes, scales = layer.weight.data, layer.weight_scale.data
        del layer.weight, layer.weight_scale
        check_scales("weight_scale", scales)
        self._store(layer, codes, scales.flatten(), tiled=False)
