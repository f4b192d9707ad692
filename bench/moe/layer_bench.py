"""What the MoE layer benchmarks share (bench/moe/fused_moe.py, block_fp8_moe.py, mxfp4_moe.py): the layer's
shape and cases, the seeded routing and the experts it touches, the FLOPs model, the impl factory, the op
definition and the accuracy table's rows."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import torch

from bench.quant.sweeps import kernel
from bench.registry import Case, Impl, OpBench, register
from kernels.tolerances.lossy import lossy_metrics
from reference.moe.routing import softmax_topk


@dataclasses.dataclass(frozen=True)
class Shape:
    experts: int
    top_k: int
    hidden: int
    inter: int


def cases(shape: Shape, tokens: tuple[int, ...]) -> list[Case]:
    return [Case(f"T{t}", float(t), (t, shape.experts, shape.top_k, shape.hidden, shape.inter)) for t in tokens]


@functools.cache
def routing(tokens: int, experts: int, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(topk_weights fp32, topk_ids int32) [T, k] on the CPU, from seeded router logits: the same assignment on
    every device, so the bytes model can count the experts a case touches."""
    logits = torch.randn(tokens, experts, generator=torch.Generator().manual_seed(tokens * 1000 + experts))
    weights, ids = softmax_topk(logits, top_k, renormalize=True)
    return weights, ids.to(torch.int32)


def touched_experts(case: Case) -> int:
    tokens, experts, top_k = case.shape[:3]
    return int(routing(tokens, experts, top_k)[1].unique().numel())


def flops(case: Case) -> int:
    """Two GEMMs over the k x T assignments: 2 T k (2I) H + 2 T k H I."""
    tokens, _, top_k, hidden, inter = case.shape
    return 6 * tokens * top_k * hidden * inter


def with_args(get_fn: Callable[[], Callable]) -> Callable[[tuple], Callable[[], object]]:
    """An impl factory: the function `get_fn` returns, called on the case's inputs."""

    def factory(args: tuple) -> Callable[[], object]:
        fn = get_fn()
        return lambda: fn(*args)

    return factory


def moe_op(
    name: str, dtype: str, full: list[Case], small: list[Case], roof: str, inputs, impls: tuple[Impl, ...],
    bytes_model, compare_to: str, check,
) -> OpBench:  # fmt: skip
    """Register one MoE layer op: tokens on the x axis, the mirror as the baseline, CUDA-graph replays."""
    return register(
        OpBench(
            name=name,
            area="moe",
            dtype=dtype,
            x_name="tokens",
            sweeps={"small": small, "full": full},
            make_inputs=inputs,
            impls=impls,
            bytes_model=bytes_model,
            flops_model=flops,
            roof=roof,
            baselines=("reference-mirror",),
            compare_to=compare_to,
            headline=(("triton", compare_to), ("triton", roof)),
            check=check,
            cuda_graph=True,
        )
    )


def accuracy_rows(
    shapes: dict[str, Shape], tokens: tuple[int, ...], tiny: Shape, inputs, mirror, ideal, kernel_name: str
) -> list[dict]:
    """Per shape and token count on a GPU (the CPU: the tiny shape, 5 tokens, the mirror only): the kernel's SQNR
    against the ideal and its distance from the mirror, beside the mirror's own SQNR."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        shapes, tokens = {"tiny": tiny}, (5,)
    fused = kernel(*kernel_name.rsplit(".", 1)) if device == "cuda" else None
    rows = []
    for label, shape in shapes.items():
        for case in cases(shape, tokens):
            args = inputs(case, device)
            want, exact = mirror(*args), ideal(*args)
            got = fused(*args) if fused else None
            vs = lossy_metrics(got, want, exact) if got is not None else None
            rows.append(
                {
                    "shape": f"{label}: E{shape.experts} top{shape.top_k} H{shape.hidden} I{shape.inter}",
                    "tokens": case.shape[0],
                    "kernel_sqnr_vs_ideal_db": vs.sqnr_db if vs else "needs a GPU",
                    "mirror_sqnr_vs_ideal_db": lossy_metrics(want, want, exact).sqnr_db,
                    "kernel_max_rel_vs_mirror": vs.max_rel if vs else "",
                    "kernel_rms_rel_vs_mirror": vs.rms_rel if vs else "",
                }
            )
            del args, want, exact, got
    return rows
