"""Block-FP8 W8A8 MoE layer benchmark (`kernels.block_fp8_moe`): DeepSeek-V3's routed experts (E 256, top 8,
hidden 7168, intermediate 2048), E4M3 weights with 128 x 128 tile scales, activations quantized per 128-wide
group inside the op. Routing and cases as bench/moe/fused_moe.py. Two ops:
- block_fp8_moe_decode_dsv3, T 1 ... 64, against memcpy on the bytes moved: the touched experts' E4M3 weights
  and fp32 tile scales, x in and the output out. The bar: >= 0.70x memcpy.
- block_fp8_moe_prefill_dsv3, T 256 ... 4096, against the GEMM roof (FLOPs 6 T k H I) and the per-expert cuBLAS
  blockwise loop (bench/moe/block_fp8_loop_peer.py). The bar: >= 1.5x that loop at T 4096.
Implementations: reference-mirror (`block_fp8_moe_mirror` on the device: the baseline, checked with the
"block_fp8_moe" tolerance row), triton (gated), cublas-blockwise-loop (ungated; rounds gate and up to bf16 before
the activation, so it is checked against the mirror with a bound). The weights (11.3 GB at the full shape) are
made once per process and shared by the cases.
"""

from __future__ import annotations

import functools

import torch

from bench.correctness import expected_difference, lossy_check
from bench.gemm.block_fp8 import fp8_cublas_skip
from bench.moe.block_fp8_loop_peer import cublas_loop_moe
from bench.moe.layer_bench import Shape, accuracy_rows, cases, moe_op, routing, touched_experts, with_args
from bench.quant.sweeps import kernel, triton_skip
from bench.registry import AccuracyReport, Case, Impl, register_accuracy
from kernels.tolerances import families
from reference.moe.quantized import block_fp8_moe_ideal, block_fp8_moe_mirror
from reference.quant.fp8 import quantize_fp8_blocks

DSV3 = Shape(256, 8, 7168, 2048)
TINY = Shape(4, 2, 256, 128)  # the CPU sweep exercises the harness only
DECODE_T, PREFILL_T = (1, 4, 16, 64), (256, 1024, 4096)


def moved_bytes(case: Case) -> int:
    tokens, _, _, hidden, inter = case.shape
    scales = -(-2 * inter // 128) * (hidden // 128) + -(-hidden // 128) * (inter // 128)
    per_expert = 3 * hidden * inter + 4 * scales
    return touched_experts(case) * per_expert + 2 * tokens * hidden * 2


@functools.lru_cache(maxsize=1)
def expert_weights(experts: int, hidden: int, inter: int, torch_device: str) -> tuple[torch.Tensor, ...]:
    """(w13, w13_scales, w2, w2_scales): randn / sqrt(fan-in) weights, block-quantized one expert at a time."""
    g = torch.Generator(device=torch_device).manual_seed(0)
    w13 = torch.empty(experts, 2 * inter, hidden, dtype=torch.float8_e4m3fn, device=torch_device)
    w2 = torch.empty(experts, hidden, inter, dtype=torch.float8_e4m3fn, device=torch_device)
    s13 = torch.empty(experts, -(-2 * inter // 128), hidden // 128, device=torch_device)
    s2 = torch.empty(experts, -(-hidden // 128), inter // 128, device=torch_device)
    for e in range(experts):
        w13[e], s13[e] = quantize_fp8_blocks(
            torch.randn(2 * inter, hidden, device=torch_device, generator=g) * hidden**-0.5
        )
        w2[e], s2[e] = quantize_fp8_blocks(torch.randn(hidden, inter, device=torch_device, generator=g) * inter**-0.5)
    return w13, s13, w2, s2


def inputs(case: Case, torch_device: str) -> tuple[torch.Tensor, ...]:
    tokens, experts, top_k, hidden, inter = case.shape
    g = torch.Generator(device=torch_device).manual_seed(1)
    x = torch.randn(tokens, hidden, device=torch_device, generator=g).to(torch.bfloat16)
    weights, ids = routing(tokens, experts, top_k)
    return x, *expert_weights(experts, hidden, inter, torch_device), weights.to(torch_device), ids.to(torch_device)


# Distance of the cuBLAS loop from the mirror: gate and up rounded to bf16 before the activation, cuBLAS's own
# FP8 accumulation; rounding of that kind stays within a few percent of the output's peak.
LOOP_CHECK = expected_difference("gate/up rounded to bf16 before SiLU; cuBLAS FP8 accumulation", 0.15)

IMPLS = (
    Impl("reference-mirror", with_args(lambda: block_fp8_moe_mirror)),
    Impl("triton", with_args(lambda: kernel("kernels.block_fp8_moe", "block_fp8_moe")), triton_skip),
    Impl("cublas-blockwise-loop", with_args(lambda: cublas_loop_moe), fp8_cublas_skip, gated=False, check=LOOP_CHECK),
)


def _op(name: str, full: list[Case], small: list[Case], roof: str):
    return moe_op(
        name, "e4m3fn->bf16", full, small, roof, inputs, IMPLS, moved_bytes, "cublas-blockwise-loop",
        lossy_check(families.BLOCK_FP8_MOE),
    )  # fmt: skip


OPS = (
    _op("block_fp8_moe_decode_dsv3", cases(DSV3, DECODE_T), cases(TINY, (1, 5)), "memcpy"),
    _op("block_fp8_moe_prefill_dsv3", cases(DSV3, PREFILL_T), cases(TINY, (33,)), "gemm"),
)

# Accuracy: DeepSeek-V3's expert shapes with 16 experts (the fp64 ideal of all 256 would need 90 GB).
DSV3_16 = Shape(16, 8, 7168, 2048)


def _accuracy() -> list[dict]:
    rows = accuracy_rows(
        {"dsv3-16e": DSV3_16}, (16, 256), TINY, inputs, block_fp8_moe_mirror, block_fp8_moe_ideal,
        "kernels.block_fp8_moe.block_fp8_moe",
    )  # fmt: skip
    expert_weights.cache_clear()
    return rows


ACCURACY = register_accuracy(
    AccuracyReport(
        name="block_fp8_moe_accuracy",
        title="Block-FP8 MoE: SQNR against the fp64 ideal, distance from the precision mirror",
        ops=tuple(op.name for op in OPS),
        rows=_accuracy,
        note=(
            "The benchmark's inputs (bench/moe/block_fp8_moe.py) with 16 experts. Ideal: `block_fp8_moe_ideal` "
            "(fp64 of the dequantized operands, no intermediate quantization); mirror: `block_fp8_moe_mirror` (the "
            "kernel's quantization and roundings); max_rel / rms_rel: the kernel against the mirror, relative to "
            "the mirror's peak / RMS, as the 'block_fp8_moe' tolerance row bounds them."
        ),
    )
)
