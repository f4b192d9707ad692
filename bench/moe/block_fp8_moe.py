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
from bench.moe.fused_moe import Shape, cases, routing, touched_experts
from bench.quant.sweeps import kernel, triton_skip
from bench.registry import AccuracyReport, Case, Impl, OpBench, register, register_accuracy
from kernels.tolerances import families
from kernels.tolerances.lossy import lossy_metrics
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


def flops(case: Case) -> int:
    tokens, _, top_k, hidden, inter = case.shape
    return 6 * tokens * top_k * hidden * inter


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


def _with(get_fn):
    def factory(args: tuple[torch.Tensor, ...]):
        fn = get_fn()
        return lambda: fn(*args)

    return factory


# Distance of the cuBLAS loop from the mirror: gate and up rounded to bf16 before the activation, cuBLAS's own
# FP8 accumulation; rounding of that kind stays within a few percent of the output's peak.
LOOP_CHECK = expected_difference("gate/up rounded to bf16 before SiLU; cuBLAS FP8 accumulation", 0.15)

IMPLS = (
    Impl("reference-mirror", _with(lambda: block_fp8_moe_mirror)),
    Impl("triton", _with(lambda: kernel("kernels.block_fp8_moe", "block_fp8_moe")), triton_skip),
    Impl("cublas-blockwise-loop", _with(lambda: cublas_loop_moe), fp8_cublas_skip, gated=False, check=LOOP_CHECK),
)


def _op(name: str, full: list[Case], small: list[Case], roof: str) -> OpBench:
    return register(
        OpBench(
            name=name,
            area="moe",
            dtype="e4m3fn->bf16",
            x_name="tokens",
            sweeps={"small": small, "full": full},
            make_inputs=inputs,
            impls=IMPLS,
            bytes_model=moved_bytes,
            flops_model=flops,
            roof=roof,
            baselines=("reference-mirror",),
            compare_to="cublas-blockwise-loop",
            headline=(("triton", "cublas-blockwise-loop"), ("triton", roof)),
            check=lossy_check(families.BLOCK_FP8_MOE),
            cuda_graph=True,
        )
    )


OPS = (
    _op("block_fp8_moe_decode_dsv3", cases(DSV3, DECODE_T), cases(TINY, (1, 5)), "memcpy"),
    _op("block_fp8_moe_prefill_dsv3", cases(DSV3, PREFILL_T), cases(TINY, (33,)), "gemm"),
)

# Accuracy: DeepSeek-V3's expert shapes with 16 experts (the fp64 ideal of all 256 would need 90 GB).
DSV3_16 = Shape(16, 8, 7168, 2048)


def accuracy_rows() -> list[dict]:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    shape = DSV3_16 if device == "cuda" else TINY
    fused = kernel("kernels.block_fp8_moe", "block_fp8_moe") if device == "cuda" else None
    rows = []
    for case in cases(shape, (16, 256) if device == "cuda" else (5,)):
        args = inputs(case, device)
        mirror, ideal = block_fp8_moe_mirror(*args), block_fp8_moe_ideal(*args)
        got = fused(*args) if fused else None
        vs = lossy_metrics(got, mirror, ideal) if got is not None else None
        rows.append(
            {
                "shape": f"E{shape.experts} top{shape.top_k} H{shape.hidden} I{shape.inter}",
                "tokens": case.shape[0],
                "kernel_sqnr_vs_ideal_db": vs.sqnr_db if vs else "needs a GPU",
                "mirror_sqnr_vs_ideal_db": lossy_metrics(mirror, mirror, ideal).sqnr_db,
                "kernel_max_rel_vs_mirror": vs.max_rel if vs else "",
                "kernel_rms_rel_vs_mirror": vs.rms_rel if vs else "",
            }
        )
        del args, mirror, ideal, got
    expert_weights.cache_clear()
    return rows


ACCURACY = register_accuracy(
    AccuracyReport(
        name="block_fp8_moe_accuracy",
        title="Block-FP8 MoE: SQNR against the fp64 ideal, distance from the precision mirror",
        ops=tuple(op.name for op in OPS),
        rows=accuracy_rows,
        note=(
            "The benchmark's inputs (bench/moe/block_fp8_moe.py) with 16 experts. Ideal: `block_fp8_moe_ideal` "
            "(fp64 of the dequantized operands, no intermediate quantization); mirror: `block_fp8_moe_mirror` (the "
            "kernel's quantization and roundings); max_rel / rms_rel: the kernel against the mirror, relative to "
            "the mirror's peak / RMS, as the 'block_fp8_moe' tolerance row bounds them."
        ),
    )
)
