"""The block-FP8 W8A8 MoE layer (DeepSeek-V3's experts) as one op, the kernel twin of
`reference.moe.quantized.block_fp8_moe_mirror`: the activations quantized per token and 128-wide group by
the reference quantizer's arithmetic (bit for bit), then `kernels.fused_moe`'s layer with the grouped GEMM in
its block-FP8 mode (`kernels.moe_gemm`); the intermediate is quantized the same way before the second GEMM.
A pass of `kernels.fp8_quant` before each GEMM writes the E4M3 copy. The grouped GEMMs can instead quantize each
input tile as they load it (`fuse_quant`), the same codes and scales, so the same output bytes; that ran 3-7 %
slower at decode and up to 2.7x slower at prefill on an H100 (`kernels.moe_gemm.FUSE_INPUT_QUANT`), so it is not
the default. The decode GEMV path (`kernels.moe_gemv`) always quantizes first: its tensor-core lanes each hold
32 bytes of a 128-wide group, so a group's amax would span four lanes. No host synchronization (CUDA-graph
safe).

Op: `touchstone::block_fp8_moe(x, w13, w13_scales, w2, w2_scales, topk_weights, topk_ids, activation,
expert_map) -> out [T, H]`; call it through `block_fp8_moe` below (the mirror's signature). w13 E4M3 [E, 2I, H]
with fp32 scales [E, ceil(2I / 128), H / 128], w2 E4M3 [E, H, I] with [E, ceil(H / 128), I / 128]; x bf16/fp16.
"""

from __future__ import annotations

import torch

from kernels._boundary import check_device
from kernels.fp8_quant import launch_quantize_fp8
from kernels.fused_moe import run_layer
from kernels.moe_gemm import SCALE_BLOCK, Tiles
from reference.moe.experts import check_moe_args
from reference.moe.quantized import check_expert_blocks
from reference.quant.fp8 import DEFAULT_EPS


def _quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return launch_quantize_fp8(x, "group", SCALE_BLOCK, "e4m3fn", DEFAULT_EPS, False, None)


def check_block_fp8_moe_args(x, w13, w13_scales, w2, w2_scales, topk_weights, topk_ids, activation, expert_map):
    """The mirror's checks plus the kernel's: one message naming the argument. Returns the expert count."""
    check_expert_blocks("w13", w13, w13_scales)
    check_expert_blocks("w2", w2, w2_scales)
    experts = check_moe_args(x, w13, w2, topk_weights, topk_ids, activation, expert_map=expert_map, values=False)
    if x.dtype not in (torch.bfloat16, torch.float16):
        raise TypeError(f"x: must be bf16 or fp16 (quantized inside the op), got {x.dtype}")
    return experts


def launch(
    x, w13, w13_scales, w2, w2_scales, topk_weights, topk_ids, activation="silu", expert_map=None,
    fault: str = "none", tiles: tuple[Tiles, Tiles] | None = None, fuse_quant: bool | None = None,
):  # fmt: skip
    """Validate (shapes and dtypes only), allocate and launch; `fault` plants a named bug (moe_gemm, moe_align);
    `tiles` forces the grouped GEMM's launch sizes and `fuse_quant` whether it quantizes its inputs itself (where
    the grouped GEMM runs; default `kernels.moe_gemm.FUSE_INPUT_QUANT`)."""
    experts = check_block_fp8_moe_args(
        x, w13, w13_scales, w2, w2_scales, topk_weights, topk_ids, activation, expert_map
    )
    tensors = dict(x=x, w13=w13, w13_scales=w13_scales, w2=w2, w2_scales=w2_scales, topk_weights=topk_weights)
    check_device(**tensors, topk_ids=topk_ids)
    for name, t in tensors.items():
        if t is not topk_weights and not t.is_contiguous():
            raise ValueError(f"{name}: must be contiguous, got strides {t.stride()}")
    return run_layer(
        x, w13, w2, topk_weights, topk_ids, activation, None, None, expert_map, experts, fault, tiles,
        _quantize, w13_scales, w2_scales, fuse_quant=fuse_quant,
    )  # fmt: skip


@torch.library.custom_op("touchstone::block_fp8_moe", mutates_args=())
def _block_fp8_moe_op(
    x: torch.Tensor,
    w13: torch.Tensor,
    w13_scales: torch.Tensor,
    w2: torch.Tensor,
    w2_scales: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    activation: str,
    expert_map: torch.Tensor | None,
) -> torch.Tensor:
    return launch(x, w13, w13_scales, w2, w2_scales, topk_weights, topk_ids, activation, expert_map)


@_block_fp8_moe_op.register_fake
def _(x, w13, w13_scales, w2, w2_scales, topk_weights, topk_ids, activation, expert_map):
    check_block_fp8_moe_args(x, w13, w13_scales, w2, w2_scales, topk_weights, topk_ids, activation, expert_map)
    return x.new_empty(x.shape)


def block_fp8_moe(x, w13, w13_scales, w2, w2_scales, topk_weights, topk_ids, activation="silu", expert_map=None):
    """Kernel twin of `reference.moe.quantized.block_fp8_moe_mirror` (same arguments; the "block_fp8_moe" row)."""
    return torch.ops.touchstone.block_fp8_moe(
        x, w13, w13_scales, w2, w2_scales, topk_weights, topk_ids, activation, expert_map
    )
