"""bf16 fused MoE layer benchmark (`kernels.fused_moe`): the experts of one layer for T tokens, routed top-k.

Shapes (E experts, top k, hidden H, intermediate I): Mixtral-8x7B (8, 2, 4096, 14336) and Qwen3-30B-A3B
(128, 8, 2048, 768). Routing: softmax top-k of seeded randn router logits drawn on the CPU (the same
assignment on every device, so the bytes model can count the experts a case touches). Two ops per shape:
- fused_moe_decode_<shape>, T 1 ... 64, against memcpy on the bytes actually moved: the weights of the experts
  the routing touches (w13 2I x H + w2 H x I each, bf16), x in and the output out. The bar: >= 0.80x memcpy
  (Mixtral shape).
- fused_moe_prefill_<shape>, T 256 ... 4096, against the GEMM roof (FLOPs 6 T k H I: two GEMMs of the k x T
  assignments) and the grouped-GEMM peer. The bar: >= 1.0x the grouped-GEMM peer at T 4096.
Implementations: reference-mirror (`reference.moe.experts.fused_moe_mirror` on the device: the baseline each row
is checked against with the "fused_moe" tolerance row), triton (gated) and grouped-mm (ungated;
bench/moe/grouped_mm_peer.py). torch.compile of the reference is not a peer here: the reference loops over
the experts present (a host read of the routing per call), which dynamo splits into graph breaks.
Timing: CUDA-graph replays (`cuda_graph=True`), so decode rows time the GPU, not op dispatch; the reference
cannot be captured (its host read) and is timed eagerly, as its row's note says.
Accuracy: `fused_moe_accuracy` gives the kernel's SQNR against the fp64 ideal and its distance from the mirror.
"""

from __future__ import annotations

import torch

from bench.correctness import expected_difference, lossy_check
from bench.moe.grouped_mm_peer import grouped_mm_moe
from bench.moe.layer_bench import Shape, accuracy_rows, cases, moe_op, routing, touched_experts, with_args
from bench.quant.sweeps import kernel, triton_skip
from bench.registry import AccuracyReport, Case, Impl, register_accuracy
from kernels.tolerances import families
from reference.moe.experts import fused_moe_ideal, fused_moe_mirror

SHAPES = {"mixtral": Shape(8, 2, 4096, 14336), "qwen3": Shape(128, 8, 2048, 768)}
TINY = Shape(4, 2, 64, 96)  # the CPU sweep exercises the harness only
DECODE_T, PREFILL_T = (1, 4, 16, 64), (256, 1024, 4096)


def moved_bytes(case: Case) -> int:
    tokens, _, _, hidden, inter = case.shape
    return touched_experts(case) * 3 * hidden * inter * 2 + 2 * tokens * hidden * 2


def inputs(case: Case, torch_device: str) -> tuple[torch.Tensor, ...]:
    """x, w13, w2 (randn scaled by 1 / sqrt(fan-in), bf16) and the routing, all on the device."""
    tokens, experts, top_k, hidden, inter = case.shape
    g = torch.Generator(device=torch_device).manual_seed(0)
    x = torch.randn(tokens, hidden, device=torch_device, generator=g).to(torch.bfloat16)
    w13 = torch.empty(experts, 2 * inter, hidden, dtype=torch.bfloat16, device=torch_device)
    w2 = torch.empty(experts, hidden, inter, dtype=torch.bfloat16, device=torch_device)
    for e in range(experts):  # one expert at a time: no fp32 copy of every weight at once
        w13[e] = torch.randn(2 * inter, hidden, device=torch_device, generator=g) * hidden**-0.5
        w2[e] = torch.randn(hidden, inter, device=torch_device, generator=g) * inter**-0.5
    weights, ids = routing(tokens, experts, top_k)
    return x, w13, w2, weights.to(torch_device), ids.to(torch_device)


def _cuda_only(case: Case, backend: str) -> str | None:
    return None if backend == "cuda" else f"torch._grouped_mm runs on NVIDIA GPUs (backend {backend})"


# Distance of the grouped-GEMM peer from the mirror: bf16 roundings of gate, up and the product before the
# routing weight, each within a few bf16 ulps of the output's peak; the bound is a bug's size, not rounding's.
GROUPED_MM_CHECK = expected_difference("gate/up rounded to bf16 before SiLU, the weight applied after rounding", 0.05)

IMPLS = (
    Impl("reference-mirror", with_args(lambda: fused_moe_mirror)),
    Impl("triton", with_args(lambda: kernel("kernels.fused_moe", "fused_moe")), triton_skip),
    Impl("grouped-mm", with_args(lambda: grouped_mm_moe), _cuda_only, gated=False, check=GROUPED_MM_CHECK),
)


def _op(name: str, full: list[Case], small: list[Case], roof: str):
    return moe_op(
        name, "bf16", full, small, roof, inputs, IMPLS, moved_bytes, "grouped-mm", lossy_check(families.FUSED_MOE)
    )


OPS = tuple(
    op
    for label, shape in SHAPES.items()
    for op in (
        _op(f"fused_moe_decode_{label}", cases(shape, DECODE_T), cases(TINY, (1, 5)), "memcpy"),
        _op(f"fused_moe_prefill_{label}", cases(shape, PREFILL_T), cases(TINY, (33,)), "gemm"),
    )
)

ACCURACY = register_accuracy(
    AccuracyReport(
        name="fused_moe_accuracy",
        title="bf16 fused MoE: SQNR against the fp64 ideal, distance from the precision mirror",
        ops=tuple(op.name for op in OPS),
        # one decode and one prefill size per shape
        rows=lambda: accuracy_rows(
            SHAPES, (16, 1024), TINY, inputs, fused_moe_mirror, fused_moe_ideal, "kernels.fused_moe.fused_moe"
        ),
        note=(
            "The benchmark's inputs (bench/moe/fused_moe.py): randn activations, randn / sqrt(fan-in) weights, "
            "softmax top-k routing. Ideal: `fused_moe_ideal` (fp64, no rounding); mirror: `fused_moe_mirror` "
            "(the kernel's roundings); max_rel / rms_rel: the kernel against the mirror, relative to the "
            "mirror's peak / RMS, as the 'fused_moe' tolerance row bounds them."
        ),
    )
)
