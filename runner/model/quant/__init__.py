"""Quantization of the runner's linear layers: one scheme per layer (runner.model.quant.scheme), chosen by a
`QuantConfig`. Schemes: unquantized; and, quantized while an unquantized checkpoint loads (`quantization=`):
"fp8" (per-tensor E4M3 weights, per-token dynamic activation scales), "fp8_block" (128 x 128 weight tiles, 1 x 128
activation groups) and "mxfp4" (W4A16, OCP MX blocks of 32); or as a quantized checkpoint holds them (fp8 with
dynamic or static input scales, fp8_channel with a scale per output row, fp8_block, mxfp4, nvfp4, and
mxfp4_w4a4 / nvfp4_w4a4 with the activations fake-quantized as their producer quantized them), from AMD
Quark, compressed-tensors, ModelOpt or HF fine-grained FP8 configs (runner.model.quant.checkpoint_config).
The language model head and the embedding stay unquantized unless a config quantizes the head."""

from __future__ import annotations

from runner.model.quant.config import SCHEMES, QuantConfig, make_scheme, online_config
from runner.model.quant.scheme import LinearScheme

__all__ = ["ONLINE_SCHEMES", "LinearScheme", "QuantConfig", "make_scheme", "online_config"]

ONLINE_SCHEMES = SCHEMES
