"""FP8 per-tensor weights: E4M3 weight with one fp32 scale. Activations are quantized to E4M3 at run time:
- dynamic (quantization="fp8" at load, or a checkpoint without input scales): one scale per token. Not per
  tensor: a per-tensor dynamic scale is the amax of the whole batch, so one request's output would depend on
  which others share its step, and on the padding rows a CUDA graph replays with (the tokens of a graph decode
  then differ from eager decode's).
- static (a checkpoint's calibrated `input_scale`: compressed-tensors' FP8 preset, ModelOpt FP8, AMD Quark
  FP8 with static input tensors): one fixed scale, so a token's codes never depend on its neighbours either.
y = (x_q W_q^T) * (s_x[m] * s_w), summed in fp32, rounded once to the activation dtype: on CUDA
`torch._scaled_mm` with row-wise scales (cuBLAS; a static scale is repeated per row), elsewhere the same
arithmetic in fp32 (exact products of E4M3 values). Decode-sized batches (up to `DECODE_ROWS` rows, K a multiple
of 128) take the block-FP8 GEMM instead (`kernels.block_fp8_gemm`), the per-tensor scales as every 1 x 128 and
128 x 128 tile's: the same products, each 128-wide block's fp32 sum scaled before it is added. The two paths sum in
different orders, so a token's logits can differ in the last bits between a step of up to 8 rows and a larger one
(as between cuBLAS's own kernels for different M); within a step a token never depends on its neighbours.

A checkpoint stores each part of a fused layer (q/k/v, gate/up) with its own weight scale and input scale. The
fused layer keeps each part's weight scale on the part's rows (s_w above is then per output column: the row-wise
GEMM takes it as it is, the block-FP8 GEMM as its 128-row tiles' where every part starts on a tile (or all share
one scale), else the decode rows take the row-wise GEMM too), so its codes are the checkpoint's and its weights the
producer's, bit for bit. (vLLM re-encodes the parts onto the largest scale instead, moving each re-encoded code by
up to half an E4M3 step: measured 2.5e-2 of a fused layer's largest output on the ModelOpt export of
suites/runner/test_quant_modelopt_export.py.) The one input is quantized with the largest calibrated input scale
(no part saturates; producers calibrate the parts of one input alike)."""

from __future__ import annotations

import torch

from reference.gemm.block_fp8 import BLOCK  # the block-FP8 GEMM's tile
from runner.model.quant.online import OnlineScheme
from runner.model.quant.scheme import check_scales, uses_kernels

# H200, Llama-3.1-8B's four projections (1 x N x K, CUDA-graph replays, cold L2;
# reports/cuda-h200/launch_sweeps/block_fp8_launch_sweep.csv): the block-FP8 GEMM 102.6 us at 1 row and 103.2 at 8
# against 141.5 and 139.5 for row-wise `_scaled_mm` (bf16 153.5 / 155.8). At 16-128 rows of a 7168 x 2048 layer
# `_scaled_mm` was the faster (15.0 against 17.1 us at 16), and it is at prefill (1.5x bf16 against 1.17x). The
# runner's decode (`python -m bench.llm.quant_decode`, reports/cuda-h200/quant_decode_fp8.md): 1.34x bf16 at batch
# 1 and 1.32x at 8, against 0.95x and 0.99x with `_scaled_mm` at every size.
DECODE_ROWS = 8


class Fp8PerTensor(OnlineScheme):
    name = "fp8"

    def __init__(self, online: bool = True, static_input: bool = False) -> None:
        if online and static_input:
            raise ValueError("quantization: static input scales come from a checkpoint; online fp8 is dynamic")
        self.online, self.static_input = online, static_input

    def describe(self) -> str:
        return f"{self.name} ({'static' if self.static_input else 'dynamic per-token'} activations)"

    def create_weights(self, layer) -> None:
        if self.online:
            return super().create_weights(layer)
        parts = len(layer.shard_sizes)  # one scalar per checkpoint part
        shape = (layer.out_features, layer.in_features)
        layer.register_parameter("weight", layer.new_param(shape, torch.float8_e4m3fn, exact_dtype=True))
        layer.register_parameter("weight_scale", layer.new_param((parts,), torch.float32, per_shard=True))
        if self.static_input:
            layer.register_parameter("input_scale", layer.new_param((parts,), torch.float32, per_shard=True))

    def process_weights_after_loading(self, layer) -> None:
        if self.online:
            return super().process_weights_after_loading(layer)
        codes, scales = layer.weight.data, layer.weight_scale.data
        inputs = layer.input_scale.data if self.static_input else None
        del layer.weight, layer.weight_scale
        if inputs is not None:
            del layer.input_scale
            check_scales("input_scale", inputs)
        check_scales("weight_scale", scales)
        rows = torch.tensor(list(layer.shard_sizes.values()), device=scales.device)
        # one scale per 128-row tile: every part starts on a tile, or the parts share one scale
        tiled = all(offset % BLOCK == 0 for offset in layer.shard_offsets.values()) or bool((scales == scales[0]).all())
        self._store(layer, codes, scales.repeat_interleave(rows), None if inputs is None else inputs.max(), tiled)

    def quantize(self, layer, w: torch.Tensor) -> None:
        q, s = quantize_e4m3(w.contiguous())
        self._store(layer, q, s.reshape(1).expand(q.shape[0]), tiled=True)

    def _store(
        self,
        layer,
        q: torch.Tensor,
        row_scales: torch.Tensor,
        input_scale: torch.Tensor | None = None,
        tiled: bool = True,
    ) -> None:
        """The codes [N, K] and each output row's weight scale [N]; `tiled`: each 128-row tile has one scale (the
        block-FP8 GEMM then takes the decode rows)."""
        layer.register_buffer("weight_fp8", q.contiguous())
        # [1, N]: row-wise _scaled_mm's scale of each output column (contiguous; cuBLAS refuses a broadcast view)
        layer.register_buffer("weight_scale_cols", row_scales.to(torch.float32).reshape(1, -1).contiguous())
        if tiled:  # the block-FP8 GEMM's [N / 128, K / 128] view: each tile's first row's scale
            cols = max(1, q.shape[1] // BLOCK)
            firsts = layer.weight_scale_cols[0, ::BLOCK]
            layer.register_buffer("weight_scale_tiles", firsts.reshape(-1, 1).repeat(1, cols).contiguous())
        if input_scale is not None:
            layer.register_buffer("input_scale", input_scale.reshape(1).to(torch.float32))

    def apply(self, layer, x: torch.Tensor) -> torch.Tensor:
        if self.static_input:
            xq, s = quantize_e4m3(x, "tensor", layer.input_scale)
            xs = s.reshape(1, 1).expand(x.shape[0], 1).contiguous()
        else:
            xq, xs = quantize_e4m3(x, "token")
        if uses_kernels(x):
            tiles = getattr(layer, "weight_scale_tiles", None)
            if tiles is not None and x.shape[0] <= DECODE_ROWS and x.shape[1] % BLOCK == 0:
                from kernels.block_fp8_gemm import block_fp8_gemm

                groups = xs.expand(-1, x.shape[1] // BLOCK).contiguous()  # the token's scale, every group's
                return block_fp8_gemm(xq, groups, layer.weight_fp8, tiles, x.dtype)
            return torch._scaled_mm(
                xq, layer.weight_fp8.t(), scale_a=xs, scale_b=layer.weight_scale_cols, out_dtype=x.dtype
            )
        acc = xq.to(torch.float32) @ layer.weight_fp8.to(torch.float32).T
        return (acc * (xs * layer.weight_scale_cols)).to(x.dtype)


def quantize_e4m3(t: torch.Tensor, granularity: str = "tensor", static_scale: torch.Tensor | None = None):
    """E4M3 codes and fp32 scales of t (`reference.quant.fp8.quantize_fp8`'s contract): the Triton quantizer on
    CUDA, the reference elsewhere."""
    if t.is_cuda:
        from kernels.fp8_quant import quantize_fp8
    else:
        from reference.quant.fp8 import quantize_fp8
    return quantize_fp8(t, granularity=granularity, static_scale=static_scale)
