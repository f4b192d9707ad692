"""The block-FP8 MoE layer as a loop over experts of cuBLAS blockwise-scaled GEMMs, the peer of
`kernels.block_fp8_moe` in bench/moe/block_fp8_moe.py: what a MoE layer on DeepSeek-V3 weights looks like
without a grouped kernel. x is quantized per 128-wide group by the reference quantizer (torch ops); for each
expert with tokens (a host read of the routing, so it is timed without a CUDA graph): gather its rows,
`torch._scaled_mm` with 1 x 128 / 128 x 128 scales (bf16 out), SiLU-and-mul in bf16, requantize, the second
blockwise GEMM, the routing weight, and an fp32 index_add into the output. Operand layouts as
bench/gemm/block_fp8_peers.py: activation scales column-major and M padded to a multiple of 4 rows."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from reference.quant.fp8 import quantize_fp8


def _blockwise_mm(a, a_scales, b, b_scales) -> torch.Tensor:
    m = a.shape[0]
    pad = -m % 4
    if pad:
        a = torch.cat([a.view(torch.uint8), a.new_zeros(pad, a.shape[1], dtype=torch.uint8)]).view(a.dtype)
        a_scales = torch.cat([a_scales, a_scales.new_ones(pad, a_scales.shape[1])])
    scale_a = a_scales.t().contiguous().t()
    return torch._scaled_mm(a, b.t(), scale_a, b_scales.t(), out_dtype=torch.bfloat16, use_fast_accum=False)[:m]


def cublas_loop_moe(x, w13, w13_scales, w2, w2_scales, topk_weights, topk_ids) -> torch.Tensor:
    inter = w13.shape[1] // 2
    xq, xs = quantize_fp8(x, granularity="group", group_size=128)
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for e in topk_ids.unique().tolist():
        rows, slots = torch.where(topk_ids == e)
        h = _blockwise_mm(xq[rows], xs[rows], w13[e], w13_scales[e])
        hq, hs = quantize_fp8(F.silu(h[:, :inter]) * h[:, inter:], granularity="group", group_size=128)
        y = _blockwise_mm(hq, hs, w2[e], w2_scales[e])
        out.index_add_(0, rows, y.float() * topk_weights[rows, slots, None].float())
    return out.to(x.dtype)
