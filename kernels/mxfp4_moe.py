"""The MXFP4 W4A16 MoE layer (gpt-oss's experts on Hopper) as one op, the kernel twin of
`reference.moe.quantized.mxfp4_moe_mirror`: `kernels.fused_moe`'s layer with the grouped GEMM in its MXFP4 mode
(`kernels.moe_gemm`), which decodes each weight tile from its E2M1 codes and E8M0 block scales exactly to
bf16 inside the K loop; activations stay bf16. Biases and gpt-oss's interleaved clamped SwiGLU as the bf16
op. No host synchronization (CUDA-graph safe).

Op: `touchstone::mxfp4_moe(x, w13, w13_scales, w2, w2_scales, topk_weights, topk_ids, activation, w13_bias,
w2_bias, expert_map) -> out [T, H]`; call it through `mxfp4_moe` below (the mirror's signature). w13 uint8 codes
[E, 2I, H / 2] with E8M0 scales [E, 2I, H / 32], w2 [E, H, I / 2] with [E, H, I / 32]; x bf16.
"""

from __future__ import annotations

import torch

from kernels.fused_moe import check_layer_tensors, run_layer
from kernels.moe_gemm import Tiles
from reference.moe.experts import check_moe_args
from reference.moe.quantized import check_mx_experts


def check_mxfp4_moe_args(
    x, w13, w13_scales, w2, w2_scales, topk_weights, topk_ids, activation, w13_bias, w2_bias, expert_map
):  # fmt: skip
    """The mirror's checks plus the kernel's, one message naming the argument; returns the expert count."""
    check_mx_experts("w13", w13, w13_scales)
    check_mx_experts("w2", w2, w2_scales)
    if not isinstance(x, torch.Tensor) or x.dtype != torch.bfloat16:
        raise TypeError(f"x: must be bf16 (the weights decode to bf16), got {getattr(x, 'dtype', type(x))}")
    e, n13, half13 = w13.shape
    shaped = {  # the decoded weights' shapes, for the layer's shape checks
        "w13": torch.empty(e, n13, 2 * half13, dtype=x.dtype, device="meta"),
        "w2": torch.empty(w2.shape[0], w2.shape[1], 2 * w2.shape[2], dtype=x.dtype, device="meta"),
    }
    return check_moe_args(
        x, shaped["w13"], shaped["w2"], topk_weights, topk_ids, activation, w13_bias, w2_bias, expert_map, False
    )


def launch(
    x, w13, w13_scales, w2, w2_scales, topk_weights, topk_ids, activation="silu", w13_bias=None, w2_bias=None,
    expert_map=None, fault: str = "none", tiles: tuple[Tiles, Tiles] | None = None,
):  # fmt: skip
    """Validate (shapes and dtypes only), allocate and launch; `fault` plants a named bug (moe_gemm, moe_align)."""
    experts = check_mxfp4_moe_args(
        x, w13, w13_scales, w2, w2_scales, topk_weights, topk_ids, activation, w13_bias, w2_bias, expert_map
    )
    read = dict(x=x, w13=w13, w13_scales=w13_scales, w2=w2, w2_scales=w2_scales, w13_bias=w13_bias, w2_bias=w2_bias)
    check_layer_tensors(read, topk_weights, topk_ids)
    return run_layer(
        x, w13, w2, topk_weights, topk_ids, activation, w13_bias, w2_bias, expert_map, experts, fault, tiles,
        None, w13_scales, w2_scales, True,
    )  # fmt: skip


@torch.library.custom_op("touchstone::mxfp4_moe", mutates_args=())
def _mxfp4_moe_op(
    x: torch.Tensor,
    w13: torch.Tensor,
    w13_scales: torch.Tensor,
    w2: torch.Tensor,
    w2_scales: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    activation: str,
    w13_bias: torch.Tensor | None,
    w2_bias: torch.Tensor | None,
    expert_map: torch.Tensor | None,
) -> torch.Tensor:
    return launch(x, w13, w13_scales, w2, w2_scales, topk_weights, topk_ids, activation, w13_bias, w2_bias, expert_map)


@_mxfp4_moe_op.register_fake
def _(x, w13, w13_scales, w2, w2_scales, topk_weights, topk_ids, activation, w13_bias, w2_bias, expert_map):
    check_mxfp4_moe_args(
        x, w13, w13_scales, w2, w2_scales, topk_weights, topk_ids, activation, w13_bias, w2_bias, expert_map
    )
    return x.new_empty(x.shape)


def mxfp4_moe(
    x, w13, w13_scales, w2, w2_scales, topk_weights, topk_ids, activation="silu", w13_bias=None, w2_bias=None,
    expert_map=None,
):  # fmt: skip
    """Kernel twin of `reference.moe.quantized.mxfp4_moe_mirror` (same arguments; the "mxfp4_moe" row)."""
    return torch.ops.touchstone.mxfp4_moe(
        x, w13, w13_scales, w2, w2_scales, topk_weights, topk_ids, activation, w13_bias, w2_bias, expert_map
    )
