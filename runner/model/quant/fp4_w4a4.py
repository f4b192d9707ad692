"""W4A4 FP4 checkpoints on Hopper: each layer's input quantized to the checkpoint's FP4 format and dequantized
back, then the W4A16 path multiplies it.

A producer that quantizes the activations too (compressed-tensors' MXFP4 and NVFP4 presets, AMD Quark's MXFP4
with fp4 input tensors, ModelOpt's NVFP4) calibrated and evaluated its model with FP4 activations. Hopper has no
FP4 tensor cores, so the activation takes the producer's fake quantization (the same codes and scales) and the
weight-only GEMM does the rest: the model the producer evaluated, up to fp32 summation order. vLLM emulates
Quark's MXFP4 this way on GPUs without MX instructions; for NVFP4 on Hopper its Marlin path runs weight-only
instead, a model the producer never evaluated.

- MXFP4: one E8M0 scale per token and 32 columns, computed at run time in the producer's scale mode
  (`reference.quant.mx_scale`; compressed-tensors and Quark's default round "even").
- NVFP4: one E4M3 scale per token and 16 columns at run time, under the checkpoint's static input global scale
  in its producer's convention (ModelOpt `input_scale` decodes, compressed-tensors `input_global_scale`
  encodes: `reference.quant.nvfp4_global_scale`). The fused q/k/v and gate/up layers see one input; where their
  parts' input scales differ, the layer takes the widest range (no part's activations saturate).

On CUDA in bf16 the quantize and dequantize kernels run (two launches per layer, the activation's bytes each);
elsewhere the references, with the same bytes."""

from __future__ import annotations

import torch

from reference.quant.mx_scale import SCALE_MODES
from reference.quant.nvfp4_fused_w13 import DEFAULT_W13_POLICY
from reference.quant.nvfp4_global_scale import DecodeScale, EncodeScale, GlobalScale
from runner.model.quant.mxfp4 import Mxfp4W4A16
from runner.model.quant.nvfp4 import Nvfp4W4A16
from runner.model.quant.scheme import check_scales, uses_kernels


def fake_quantize_mxfp4(x: torch.Tensor, scale_mode: str) -> torch.Tensor:
    """x [T, K] (K a multiple of 32) through MXFP4 and back, in x's dtype."""
    if uses_kernels(x):
        from kernels.mxfp4 import dequantize_mxfp4, quantize_mxfp4
    else:
        from reference.quant.mxfp4 import dequantize_mxfp4, quantize_mxfp4
    return dequantize_mxfp4(*quantize_mxfp4(x.contiguous(), scale_mode=scale_mode), dtype=x.dtype)


def fake_quantize_nvfp4(x: torch.Tensor, global_scale: GlobalScale) -> torch.Tensor:
    """x [T, K] (K a multiple of 16) through NVFP4 under `global_scale` and back, in x's dtype."""
    if uses_kernels(x):
        from kernels.nvfp4 import dequantize_nvfp4, quantize_nvfp4
    else:
        from reference.quant.nvfp4 import dequantize_nvfp4, quantize_nvfp4
    return dequantize_nvfp4(*quantize_nvfp4(x.contiguous(), global_scale), global_scale, dtype=x.dtype)


class Mxfp4W4A4(Mxfp4W4A16):
    name = "mxfp4_w4a4"

    def __init__(self, input_scale_mode: str = "even") -> None:
        if input_scale_mode not in SCALE_MODES:
            raise ValueError(f"input_scale_mode: must be one of {SCALE_MODES}, got {input_scale_mode!r}")
        super().__init__(online=False)
        self.input_scale_mode = input_scale_mode

    def apply(self, layer, x: torch.Tensor) -> torch.Tensor:
        return super().apply(layer, fake_quantize_mxfp4(x, self.input_scale_mode))

    def describe(self) -> str:
        return f"{self.name} (activations fake-quantized, scale mode {self.input_scale_mode})"


class Nvfp4W4A4(Nvfp4W4A16):
    name = "nvfp4_w4a4"

    def __init__(self, w13_policy: str = DEFAULT_W13_POLICY, global_scale: str = "decode") -> None:
        super().__init__(online=False, w13_policy=w13_policy, global_scale=global_scale)

    def create_weights(self, layer) -> None:
        super().create_weights(layer)
        scales = layer.new_param((len(layer.shard_sizes),), torch.float32, per_shard=True)
        layer.register_parameter(self.tensor_name("input_scale"), scales)

    def process_weights_after_loading(self, layer) -> None:
        name = self.tensor_name("input_scale")
        scales = getattr(layer, name).data
        delattr(layer, name)
        check_scales(name, scales)
        widest = max((self._input_scale(s) for s in scales), key=lambda s: float(s.to_decode().value))
        super().process_weights_after_loading(layer)
        layer.register_buffer("input_global_scale", widest.value.clone())

    def _input_scale(self, value: torch.Tensor) -> GlobalScale:
        return (EncodeScale if self.global_scale == "encode" else DecodeScale)(value.reshape(()))

    def apply(self, layer, x: torch.Tensor) -> torch.Tensor:
        return super().apply(layer, fake_quantize_nvfp4(x, self._input_scale(layer.input_global_scale)))

    def describe(self) -> str:
        return f"{self.name} (activations fake-quantized under a static {self.global_scale} global scale)"
