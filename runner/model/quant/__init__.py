"""Quantization of the runner's linear layers: one scheme per layer (runner.model.quant.scheme), chosen by a
`QuantConfig`. Schemes: unquantized; and, quantized while an unquantized checkpoint loads (`quantization=`):
"fp8" (per-tensor E4M3, dynamic activation scale), "fp8_block" (128 x 128 weight tiles, 1 x 128 activation
groups) and "mxfp4" (W4A16, OCP MX blocks of 32). The language model head and the embedding stay unquantized,
as in vLLM."""

from __future__ import annotations

from runner.model.quant.config import QuantConfig, online_config
from runner.model.quant.scheme import LinearScheme

__all__ = ["ONLINE_SCHEMES", "LinearScheme", "QuantConfig", "online_config"]

ONLINE_SCHEMES = ("fp8", "fp8_block", "mxfp4")
