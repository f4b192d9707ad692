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

import dataclasses
import functools

import torch

from bench.correctness import expected_difference, lossy_check
from bench.moe.grouped_mm_peer import grouped_mm_moe
from bench.quant.sweeps import kernel, triton_skip
from bench.registry import AccuracyReport, Case, Impl, OpBench, register, register_accuracy
from kernels.tolerances import families
from kernels.tolerances.lossy import lossy_metrics
from reference.moe.experts import fused_moe_ideal, fused_moe_mirror
from reference.moe.routing import softmax_topk


@dataclasses.dataclass(frozen=True)
class Shape:
    experts: int
    top_k: int
    hidden: int
    inter: int


SHAPES = {"mixtral": Shape(8, 2, 4096, 14336), "qwen3": Shape(128, 8, 2048, 768)}
TINY = Shape(4, 2, 64, 96)  # the CPU sweep exercises the harness only
DECODE_T, PREFILL_T = (1, 4, 16, 64), (256, 1024, 4096)


def cases(shape: Shape, tokens: tuple[int, ...]) -> list[Case]:
    return [Case(f"T{t}", float(t), (t, shape.experts, shape.top_k, shape.hidden, shape.inter)) for t in tokens]


@functools.cache
def routing(tokens: int, experts: int, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(topk_weights fp32, topk_ids int32) [T, k] on the CPU, from seeded router logits."""
    logits = torch.randn(tokens, experts, generator=torch.Generator().manual_seed(tokens * 1000 + experts))
    weights, ids = softmax_topk(logits, top_k, renormalize=True)
    return weights, ids.to(torch.int32)


def touched_experts(case: Case) -> int:
    tokens, experts, top_k = case.shape[:3]
    return int(routing(tokens, experts, top_k)[1].unique().numel())


def moved_bytes(case: Case) -> int:
    tokens, _, _, hidden, inter = case.shape
    return touched_experts(case) * 3 * hidden * inter * 2 + 2 * tokens * hidden * 2


def flops(case: Case) -> int:
    tokens, _, top_k, hidden, inter = case.shape
    return 6 * tokens * top_k * hidden * inter


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


def _with(get_fn):
    def factory(args: tuple[torch.Tensor, ...]):
        fn = get_fn()
        return lambda: fn(*args)

    return factory


def _cuda_only(case: Case, backend: str) -> str | None:
    return None if backend == "cuda" else f"torch._grouped_mm runs on NVIDIA GPUs (backend {backend})"


# Distance of the grouped-GEMM peer from the mirror: bf16 roundings of gate, up and the product before the
# routing weight, each within a few bf16 ulps of the output's peak; the bound is a bug's size, not rounding's.
GROUPED_MM_CHECK = expected_difference("gate/up rounded to bf16 before SiLU, the weight applied after rounding", 0.05)

IMPLS = (
    Impl("reference-mirror", _with(lambda: fused_moe_mirror)),
    Impl("triton", _with(lambda: kernel("kernels.fused_moe", "fused_moe")), triton_skip),
    Impl("grouped-mm", _with(lambda: grouped_mm_moe), _cuda_only, gated=False, check=GROUPED_MM_CHECK),
)


def _op(name: str, full: list[Case], small: list[Case], roof: str) -> OpBench:
    return register(
        OpBench(
            name=name,
            area="moe",
            dtype="bf16",
            x_name="tokens",
            sweeps={"small": small, "full": full},
            make_inputs=inputs,
            impls=IMPLS,
            bytes_model=moved_bytes,
            flops_model=flops,
            roof=roof,
            baselines=("reference-mirror",),
            compare_to="grouped-mm",
            headline=(("triton", "grouped-mm"), ("triton", roof)),
            check=lossy_check(families.FUSED_MOE),
            cuda_graph=True,
        )
    )


OPS = tuple(
    op
    for label, shape in SHAPES.items()
    for op in (
        _op(f"fused_moe_decode_{label}", cases(shape, DECODE_T), cases(TINY, (1, 5)), "memcpy"),
        _op(f"fused_moe_prefill_{label}", cases(shape, PREFILL_T), cases(TINY, (33,)), "gemm"),
    )
)

# Accuracy: one decode and one prefill size per shape on a GPU (the CPU: the tiny shape, the mirror only).
ACCURACY_T = (16, 1024)


def accuracy_rows() -> list[dict]:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    shapes = SHAPES if device == "cuda" else {"tiny": TINY}
    fused = kernel("kernels.fused_moe", "fused_moe") if device == "cuda" else None
    rows = []
    for label, shape in shapes.items():
        for case in cases(shape, ACCURACY_T if device == "cuda" else (5,)):
            args = inputs(case, device)
            mirror, ideal = fused_moe_mirror(*args), fused_moe_ideal(*args)
            got = fused(*args) if fused else None
            vs_mirror = lossy_metrics(got, mirror, ideal) if got is not None else None
            rows.append(
                {
                    "shape": label,
                    "tokens": case.shape[0],
                    "kernel_sqnr_vs_ideal_db": vs_mirror.sqnr_db if vs_mirror else "needs a GPU",
                    "mirror_sqnr_vs_ideal_db": lossy_metrics(mirror, mirror, ideal).sqnr_db,
                    "kernel_max_rel_vs_mirror": vs_mirror.max_rel if vs_mirror else "",
                    "kernel_rms_rel_vs_mirror": vs_mirror.rms_rel if vs_mirror else "",
                }
            )
            del args, mirror, ideal, got
    return rows


ACCURACY = register_accuracy(
    AccuracyReport(
        name="fused_moe_accuracy",
        title="bf16 fused MoE: SQNR against the fp64 ideal, distance from the precision mirror",
        ops=tuple(op.name for op in OPS),
        rows=accuracy_rows,
        note=(
            "The benchmark's inputs (bench/moe/fused_moe.py): randn activations, randn / sqrt(fan-in) weights, "
            "softmax top-k routing. Ideal: `fused_moe_ideal` (fp64, no rounding); mirror: `fused_moe_mirror` "
            "(the kernel's roundings); max_rel / rms_rel: the kernel against the mirror, relative to the "
            "mirror's peak / RMS, as the 'fused_moe' tolerance row bounds them."
        ),
    )
)
