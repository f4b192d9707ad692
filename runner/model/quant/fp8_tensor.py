"""FP8 per-tensor weights: E4M3 weight with one fp32 scale; activations quantized per token at run time (dynamic).

Per token, not per tensor: a per-tensor activation scale is the amax of the whole batch, so one request's
output would depend on which others share its step, and on the padding rows a CUDA graph replays with (the
tokens of a graph decode then differ from eager decode's).
y = (x_q W_q^T) * (s_x[m] * s_w), summed in fp32, rounded once to the activation dtype: on CUDA
`torch._scaled_mm` with row-wise scales (cuBLAS), elsewhere the same arithmetic in fp32 (exact products of
E4M3 values)."""

from __future__ import annotations

import torch

from runner.model.quant.online import OnlineScheme
from runner.model.quant.scheme import uses_kernels


class Fp8PerTensor(OnlineScheme):
    name = "fp8"

    def quantize(self, layer, w: torch.Tensor) -> None:
        q, s = _quantize(w.contiguous())
        layer.register_buffer("weight_fp8", q)
        layer.register_buffer("weight_scale", s.reshape(()))
        # Row-wise _scaled_mm takes one scale per output column: the weight's one scale, repeated (contiguous;
        # cuBLAS refuses a broadcast view).
        layer.register_buffer("weight_scale_cols", s.reshape(1, 1).repeat(1, q.shape[0]))

    def apply(self, layer, x: torch.Tensor) -> torch.Tensor:
        xq, xs = _quantize(x, "token")
        if uses_kernels(x):
            return torch._scaled_mm(
                xq, layer.weight_fp8.t(), scale_a=xs, scale_b=layer.weight_scale_cols, out_dtype=x.dtype
            )
        acc = xq.to(torch.float32) @ layer.weight_fp8.to(torch.float32).T
        return (acc * (xs * layer.weight_scale)).to(x.dtype)


def _quantize(t: torch.Tensor, granularity: str = "tensor") -> tuple[torch.Tensor, torch.Tensor]:
    if t.is_cuda:
        from kernels.fp8_quant import quantize_fp8
    else:
        from reference.quant.fp8 import quantize_fp8
    return quantize_fp8(t, granularity=granularity)
