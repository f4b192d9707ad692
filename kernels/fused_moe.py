"""The MoE layer's experts as one op: alignment, the first grouped GEMM with the activation fused, the second
with the routing weight fused, and the combine; bf16/fp16, no host synchronization (CUDA-graph safe).

Op: `touchstone::fused_moe(x, w13, w2, topk_weights, topk_ids, activation, w13_bias, w2_bias, expert_map) ->
out [T, H]`; call it through `fused_moe` below, which has `reference.moe.experts.fused_moe_mirror`'s
signature and conventions (w13 [E, 2I, H] gate rows then up rows, or interleaved for "swiglu_oai"; w2 [E, H, I];
expert ids global, `expert_map` to local experts or -1).

Launches: `kernels.moe_align` (1 at decode, 5 beyond its chunk), `kernels.moe_gemm` twice, and the combine
(`kernels.moe_combine`): the k per-assignment rows of a token, each rounded to the activation dtype by the second
GEMM, summed in fp32 and rounded once; an assignment the alignment dropped (an expert id outside [0, E), which only
a caller's bug makes) is skipped by its id, so the per-assignment workspace is never zeroed.
`run_layer` is that sequence on validated arguments; the quantized layers (`kernels.block_fp8_moe`,
`kernels.mxfp4_moe`) run it with the grouped GEMM in their mode.
"""

from __future__ import annotations

import torch

from kernels import moe_align, moe_gemv
from kernels._boundary import check_device
from kernels.moe_combine import combine
from kernels.moe_gemm import FUSE_INPUT_QUANT, Tiles, choose_tiles, fp8_tiles, launch_moe_gemm, mx_tiles
from reference.moe.experts import check_moe_args


def launch(
    x, w13, w2, topk_weights, topk_ids, activation="silu", w13_bias=None, w2_bias=None, expert_map=None,
    fault: str = "none", tiles: tuple[Tiles, Tiles] | None = None,
):  # fmt: skip
    """Validate (shapes and dtypes only), allocate and launch. `fault` plants a named bug of either kernel;
    `tiles` (both GEMMs', one BM) replaces `choose_tiles`' launch sizes (the bench's tuning sweep)."""
    experts = check_moe_args(x, w13, w2, topk_weights, topk_ids, activation, w13_bias, w2_bias, expert_map, False)
    if x.dtype not in (torch.bfloat16, torch.float16) or w13.dtype != x.dtype or w2.dtype != x.dtype:
        raise TypeError(f"x, w13, w2: must share one dtype of bf16/fp16, got {x.dtype}, {w13.dtype}, {w2.dtype}")
    check_layer_tensors(dict(x=x, w13=w13, w2=w2, w13_bias=w13_bias, w2_bias=w2_bias), topk_weights, topk_ids)
    return run_layer(
        x, w13, w2, topk_weights, topk_ids, activation, w13_bias, w2_bias, expert_map, experts, fault, tiles
    )


def check_layer_tensors(read: dict, topk_weights, topk_ids) -> None:
    """Every tensor on the one device of the launch; those the GEMMs read by row (`read`, by name; None entries
    are absent biases) with stride 1 in their last dim."""
    read = {name: t for name, t in read.items() if t is not None}
    check_device(**read, topk_weights=topk_weights, topk_ids=topk_ids)
    for name, t in read.items():
        if t.stride(-1) != 1:
            raise ValueError(f"{name}: last dim must have stride 1, got strides {t.stride()}")


def run_layer(
    x, w13, w2, topk_weights, topk_ids, activation, w13_bias, w2_bias, expert_map, experts: int, fault: str,
    tiles: tuple[Tiles, Tiles] | None, quantize=None, w13_scales=None, w2_scales=None, mx: bool = False,
    fuse_quant: bool | None = None,
):  # fmt: skip
    """The layer on validated arguments. Block FP8 (`quantize` given: x -> (E4M3 codes, group scales)): x and
    the intermediate are quantized per 1 x 128 group before each GEMM, the weights carry their tile scales: by
    `quantize`, or (`fuse_quant`, default `kernels.moe_gemm.FUSE_INPUT_QUANT`) by the grouped GEMMs as they load
    them (the same bytes; the GEMV path always through `quantize`). MXFP4 (`mx`):
    w13 / w2 are codes with E8M0 scales, decoded inside the GEMMs; activations stay bf16. In both quantized
    modes, up to `kernels.moe_gemv.takes` assignments (unless `tiles` asks for the grouped GEMM) the GEMMs are one
    GEMV an assignment (`kernels.moe_gemv`) and no alignment runs."""
    device = x.device
    tokens, top_k = topk_ids.shape
    hidden, inter = x.shape[1], w13.shape[1] // 2
    align_fault = fault if fault in moe_align.FAULTS else "none"
    gemm_fault = fault if fault not in moe_align.FAULTS else "none"
    weights = topk_weights.reshape(-1).to(torch.float32).contiguous()
    fp8 = quantize is not None
    if (mx or fp8) and tiles is None and moe_gemv.takes(tokens * top_k, fp8):  # decode: GEMVs, no alignment
        fused = False

        def gemm(a, a_scales, w, bias, w_scales, out, a_div, act, mul_weight, _tiles):
            routing = (topk_ids, expert_map, weights, a_div, act, mul_weight, gemm_fault)
            if fp8:
                moe_gemv.launch_fp8_moe_gemv(a, a_scales, w, w_scales, out, *routing)
            else:
                moe_gemv.launch_mx_moe_gemv(a, w, w_scales, bias, out, *routing)

        first = second = None
    else:
        first, second = tiles or choose_tiles(device, tokens * top_k, experts, hidden, inter)
        if fp8 and tiles is None:
            first, second = fp8_tiles(first, second)
        if mx and tiles is None:
            first, second = mx_tiles(device, tokens * top_k, experts, first, second)
        if first.bm != second.bm:
            raise ValueError(f"tiles: both GEMMs must share BM (the alignment's block), got {first.bm} and {second.bm}")
        sorted_ids, expert_ids, post = moe_align.launch(topk_ids, experts, first.bm, expert_map, align_fault)
        fused = fp8 and (FUSE_INPUT_QUANT if fuse_quant is None else fuse_quant)

        def gemm(a, a_scales, w, bias, w_scales, out, a_div, act, mul_weight, gemm_tiles):
            launch_moe_gemm(
                a, w, bias, out, sorted_ids, expert_ids, post, weights, a_div, act, mul_weight, gemm_tiles,
                gemm_fault, a_scales, w_scales, mx, fused,
            )  # fmt: skip

    separate = fp8 and not fused
    a, a_scales = quantize(x) if separate else (x, None)
    h = torch.empty(tokens * top_k, inter, dtype=x.dtype, device=device)
    gemm(a, a_scales, w13, w13_bias, w13_scales, h, top_k, activation, False, first)
    a, a_scales = quantize(h) if separate else (h, None)
    per_slot = torch.empty(tokens * top_k, hidden, dtype=x.dtype, device=device)  # the combine skips dropped rows
    gemm(a, a_scales, w2, w2_bias, w2_scales, per_slot, 1, "none", True, second)
    return combine(per_slot, topk_ids, experts)


@torch.library.custom_op("touchstone::fused_moe", mutates_args=())
def _fused_moe_op(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    activation: str,
    w13_bias: torch.Tensor | None,
    w2_bias: torch.Tensor | None,
    expert_map: torch.Tensor | None,
) -> torch.Tensor:
    return launch(x, w13, w2, topk_weights, topk_ids, activation, w13_bias, w2_bias, expert_map)


@_fused_moe_op.register_fake
def _(x, w13, w2, topk_weights, topk_ids, activation, w13_bias, w2_bias, expert_map):
    check_moe_args(x, w13, w2, topk_weights, topk_ids, activation, w13_bias, w2_bias, expert_map, False)
    return x.new_empty(x.shape)


def fused_moe(x, w13, w2, topk_weights, topk_ids, activation="silu", w13_bias=None, w2_bias=None, expert_map=None):
    """Kernel twin of `reference.moe.experts.fused_moe_mirror` (same arguments; within the "fused_moe" row)."""
    return torch.ops.touchstone.fused_moe(x, w13, w2, topk_weights, topk_ids, activation, w13_bias, w2_bias, expert_map)
