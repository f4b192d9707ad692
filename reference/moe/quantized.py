"""Paired references of the quantized MoE paths, built on the dense GEMM references, one expert at a time, on
x's device.

Block-FP8 W8A8 (DeepSeek-V3): expert weights as `reference.quant.fp8.quantize_fp8_blocks` makes them, `w13`
E4M3 [E, 2I, H] with scales [E, ceil(2I / 128), H / 128], `w2` E4M3 [E, H, I] with [E, ceil(H / 128), I / 128]
(H and I multiples of 128); activations quantized per token and 128-wide group:
- mirror: x quantized once; the first GEMM is `block_fp8_gemm_mirror` into fp32; the activation in fp32,
  rounded to x's dtype; that intermediate quantized per token-group 128 (by the kernel's second GEMM as it
  loads it, or by a pass before it); the second GEMM likewise into fp32; then the combine's roundings
  (`experts.combine_mirror`).
- ideal: float64 of the dequantized operands: x's codes times their scales, the weights' codes times theirs,
  no intermediate quantization (what the quantized weights mean applied to the quantized input):
  `experts.fused_moe_ideal` of those operands.
MXFP4 W4A16 (gpt-oss on Hopper): expert weights as `reference.quant.mxfp4.quantize_mxfp4` makes them, codes
uint8 [E, 2I, H / 2] / [E, H, I / 2], E8M0 scales [E, 2I, H / 32] / [E, H, I / 32]; activations unquantized:
- mirror: each weight dequantized exactly to bf16 (saturating, as `reference.gemm.w4a16_mxfp4`), GEMMs in
  fp32, the bf16 MoE mirror's roundings;
- ideal: float64 of the exactly dequantized weights (`w4a16_mxfp4.dequantize_exact`).
"""

from __future__ import annotations

import torch

from reference.gemm.block_fp8 import BLOCK, block_fp8_gemm_mirror, dequantize_activations, dequantize_weights
from reference.gemm.w4a16_mxfp4 import dequantize_exact
from reference.moe.experts import ACTIVATIONS, check_moe_args, combine_mirror, fused_moe_ideal, fused_moe_mirror
from reference.quant.fp8 import quantize_fp8
from reference.quant.mxfp4 import MX_BLOCK_SIZE, dequantize_mxfp4


def check_expert_blocks(name: str, codes: torch.Tensor, scales: torch.Tensor) -> None:
    if codes.dtype != torch.float8_e4m3fn or codes.dim() != 3:
        raise TypeError(f"{name}: must be float8_e4m3fn [experts, N, K], got {codes.dtype} {tuple(codes.shape)}")
    e, n, k = codes.shape
    want = (e, -(-n // BLOCK), k // BLOCK)
    if k % BLOCK or scales.dtype != torch.float32 or tuple(scales.shape) != want:
        raise ValueError(f"{name}_scales: must be float32 {list(want)} (K = {k} a multiple of {BLOCK}), got "
                         f"{scales.dtype} {tuple(scales.shape)}")  # fmt: skip


def _dequantize_experts(codes: torch.Tensor, scales: torch.Tensor, device) -> torch.Tensor:
    """float64 [E, N, K] on `device`: every expert's codes times their tiles' scales (exact)."""
    return torch.stack([dequantize_weights(c.to(device), s.to(device)) for c, s in zip(codes, scales, strict=True)])


def _group_quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return quantize_fp8(x, granularity="group", group_size=BLOCK)


def block_fp8_moe_mirror(x, w13, w13_scales, w2, w2_scales, topk_weights, topk_ids, activation="silu", expert_map=None):
    check_expert_blocks("w13", w13, w13_scales)
    check_expert_blocks("w2", w2, w2_scales)
    experts = check_moe_args(x, w13, w2, topk_weights, topk_ids, activation, expert_map=expert_map)  # E4M3 is a float
    act, dtype, device = ACTIVATIONS[activation], x.dtype, x.device
    xq, xs = _group_quantize(x)

    def expert_out(e, rows):
        h = block_fp8_gemm_mirror(xq[rows], xs[rows], w13[e].to(device), w13_scales[e].to(device), torch.float32)
        hq, hs = _group_quantize(act(h).to(dtype))
        return block_fp8_gemm_mirror(hq, hs, w2[e].to(device), w2_scales[e].to(device), torch.float32)

    return combine_mirror(topk_weights, topk_ids.to(device), experts, expert_map, x.shape[1], dtype, expert_out)


def block_fp8_moe_ideal(x, w13, w13_scales, w2, w2_scales, topk_weights, topk_ids, activation="silu", expert_map=None):
    check_expert_blocks("w13", w13, w13_scales)
    check_expert_blocks("w2", w2, w2_scales)
    xq, xs = _group_quantize(x)
    w13_64, w2_64 = _dequantize_experts(w13, w13_scales, x.device), _dequantize_experts(w2, w2_scales, x.device)
    x64 = dequantize_activations(xq, xs)
    return fused_moe_ideal(x64, w13_64, w2_64, topk_weights, topk_ids, activation, expert_map=expert_map)


def check_mx_experts(name: str, codes: torch.Tensor, scales: torch.Tensor) -> None:
    if codes.dtype != torch.uint8 or scales.dtype != torch.uint8 or codes.dim() != 3:
        raise TypeError(f"{name}: codes and scales must be uint8, codes [experts, N, K / 2]")
    e, n, half = codes.shape
    if (2 * half) % MX_BLOCK_SIZE or tuple(scales.shape) != (e, n, 2 * half // MX_BLOCK_SIZE):
        raise ValueError(f"{name}_scales: must be [{e}, {n}, {2 * half // MX_BLOCK_SIZE}] (K = {2 * half} a "
                         f"multiple of {MX_BLOCK_SIZE}), got {tuple(scales.shape)}")  # fmt: skip


def mxfp4_moe_mirror(
    x, w13, w13_scales, w2, w2_scales, topk_weights, topk_ids, activation="silu", w13_bias=None, w2_bias=None,
    expert_map=None,
):  # fmt: skip
    check_mx_experts("w13", w13, w13_scales)
    check_mx_experts("w2", w2, w2_scales)
    device = x.device
    w13_16 = dequantize_mxfp4(w13.to(device), w13_scales.to(device), dtype=torch.bfloat16)
    w2_16 = dequantize_mxfp4(w2.to(device), w2_scales.to(device), dtype=torch.bfloat16)
    return fused_moe_mirror(x, w13_16, w2_16, topk_weights, topk_ids, activation, w13_bias, w2_bias, expert_map)


def mxfp4_moe_ideal(
    x, w13, w13_scales, w2, w2_scales, topk_weights, topk_ids, activation="silu", w13_bias=None, w2_bias=None,
    expert_map=None,
):  # fmt: skip
    check_mx_experts("w13", w13, w13_scales)
    check_mx_experts("w2", w2, w2_scales)
    device = x.device
    w13_64 = dequantize_exact(w13.to(device), w13_scales.to(device))
    w2_64 = dequantize_exact(w2.to(device), w2_scales.to(device))
    return fused_moe_ideal(x, w13_64, w2_64, topk_weights, topk_ids, activation, w13_bias, w2_bias, expert_map)
