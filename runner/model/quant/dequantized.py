"""A quantized linear layer's weight, decoded: what its stored codes and scales mean, [out, in] in the layer's
input order (padding columns dropped). For reports (weight SQNR) and for oracles that compare a layer with a
producer's fake-quantized weight."""

from __future__ import annotations

import torch


def dequantized_weight(layer, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The layer's weight decoded to `dtype`: FP8 codes times their row's scale (one rounding in `dtype`; exact in
    float64), block-FP8 codes times their tile's scale (rounded once to fp32), MXFP4 and NVFP4 through the
    references' dequantizers (fp32)."""
    from reference.quant.fp8 import dequantize_fp8_blocks
    from reference.quant.mxfp4 import dequantize_mxfp4
    from reference.quant.nvfp4 import dequantize_nvfp4
    from reference.quant.nvfp4_global_scale import DecodeScale
    from runner.model.quant.mxfp4 import interchange_weight

    scheme = layer.scheme.name
    if scheme in ("fp8", "fp8_channel"):  # per-tensor or per-row: one scale per output row either way
        deq = layer.weight_fp8.to(dtype) * layer.weight_scale_cols.to(dtype).reshape(-1, 1)
    elif scheme == "fp8_block":
        deq = dequantize_fp8_blocks(layer.weight_fp8, layer.weight_scale_inv)
    elif scheme in ("mxfp4", "mxfp4_w4a4"):
        deq = dequantize_mxfp4(*interchange_weight(layer), dtype=torch.float32)
    elif scheme in ("nvfp4", "nvfp4_w4a4"):
        decode = DecodeScale(layer.weight_scale_2)
        deq = dequantize_nvfp4(layer.weight_codes, layer.weight_scales, decode, dtype=torch.float32)
    else:
        raise ValueError(f"layer: the {scheme} scheme stores no quantized weight")
    return deq.to(dtype)[:, : layer.in_features]
