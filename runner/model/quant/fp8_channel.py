"""FP8 per-channel weights, as compressed-tensors' FP8_DYNAMIC preset stores them (llm-compressor's data-free FP8):
an E4M3 weight with one scale per output row (`weight_scale` [N, 1]), activations quantized to E4M3 per token at
run time. A fused layer's parts keep their own scales: the scale vector is their rows, end to end, so fusing q/k/v
or gate/up re-encodes nothing (per-tensor FP8 re-encodes the parts onto the largest scale).

y = (x_q W_q^T) * (s_x[m] * s_w[n]), summed in fp32, rounded once to the activation dtype: on CUDA
`torch._scaled_mm` with row-wise scales (cuBLAS; s_w is its per-column scale), elsewhere the same arithmetic in
fp32 (exact products of E4M3 values)."""

from __future__ import annotations

import torch

from runner.model.quant.fp8_tensor import quantize_e4m3
from runner.model.quant.scheme import LinearScheme, check_scales, uses_kernels


class Fp8PerChannel(LinearScheme):
    name = "fp8_channel"

    def describe(self) -> str:
        return f"{self.name} (dynamic per-token activations)"

    def create_weights(self, layer) -> None:
        shape = (layer.out_features, layer.in_features)
        layer.register_parameter("weight", layer.new_param(shape, torch.float8_e4m3fn, exact_dtype=True))
        # a bf16 or fp32 scale, either exact in fp32
        layer.register_parameter("weight_scale", layer.new_param((layer.out_features, 1), torch.float32))

    def process_weights_after_loading(self, layer) -> None:
        codes, scales = layer.weight.data, layer.weight_scale.data
        del layer.weight, layer.weight_scale
        check_scales("weight_scale", scales)
        layer.register_buffer("weight_fp8", codes.contiguous())
        # [1, N]: row-wise _scaled_mm's scale of each output column
        layer.register_buffer("weight_scale", scales.reshape(1, -1).contiguous())

    def apply(self, layer, x: torch.Tensor) -> torch.Tensor:
        xq, xs = quantize_e4m3(x, "token")
        if uses_kernels(x):
            return torch._scaled_mm(xq, layer.weight_fp8.t(), scale_a=xs, scale_b=layer.weight_scale, out_dtype=x.dtype)
        acc = xq.to(torch.float32) @ layer.weight_fp8.to(torch.float32).T
        return (acc * (xs * layer.weight_scale)).to(x.dtype)
