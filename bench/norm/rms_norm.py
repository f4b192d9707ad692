"""RMSNorm and fused residual-add + RMSNorm benchmarks (the runner's decode step: 2 norm sites x 30 layers of
SmolLM2-135M, hidden 576; hidden 4096 for a Llama-8B-sized row), bf16, rows 1..4096 (decode batch to prefill).

Bandwidth-bound, measured against the same-run memcpy roof. Bytes per call: plain, x read + out written +
weight read ((2 * rows + 1) * hidden * 2); fused, x and residual read, out and new residual written
((4 * rows + 1) * hidden * 2). Implementations: the eager reference (the mirror every row is checked against,
lossy row "rms_norm"), `runner-eager` (runner/model/layers.py RMSNorm after `h = x + residual`, the ~9 kernels
the fused op replaces; an ungated peer), torch.compile of the reference (ungated peer), Triton, and `triton-fp8`,
its form that writes the normalized output quantized for a block-FP8 GEMM (E4M3 codes and a scale per 128,
checked by dequantizing against the baseline, bench.correctness_fp8; the fused op's new residual is written as
ever but not compared). Timing: CUDA-graph
replays (`cuda_graph=True`): a decode-sized norm runs for a few microseconds, less than the host's dispatch.
"""

from __future__ import annotations

import torch

from bench.correctness import lossy_check
from bench.correctness_fp8 import FP8_GROUPS_CHECK
from bench.quant.sweeps import compiled, kernel, triton_skip
from bench.registry import Case, Impl, OpBench, register
from kernels.tolerances import families
from reference.norm.rms_norm import rms_norm

EPS = 1e-5
HIDDENS = (576, 4096)
FULL_ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
SMALL_ROWS = (1, 4, 32)


def _sweeps(hidden: int) -> dict[str, list[Case]]:
    return {
        sweep: [Case(f"{rows}x{hidden}", float(rows), (rows, hidden)) for rows in rows_list]
        for sweep, rows_list in (("small", SMALL_ROWS), ("full", FULL_ROWS))
    }


def _inputs(fused: bool):
    def make(case: Case, torch_device: str):
        g = torch.Generator(device=torch_device).manual_seed(0)
        hidden = case.shape[1]
        x = torch.randn(case.shape, dtype=torch.bfloat16, device=torch_device, generator=g)
        weight = (1 + torch.randn(hidden, device=torch_device, generator=g) / 4).to(torch.bfloat16)
        residual = torch.randn(case.shape, dtype=torch.bfloat16, device=torch_device, generator=g) if fused else None
        return x, weight, residual

    return make


def _wrap(get_fn):
    def factory(inputs):
        fn = get_fn()
        x, weight, residual = inputs
        return lambda: fn(x, weight, EPS, residual)

    return factory


def _runner_eager(inputs):
    from runner.model.layers import RMSNorm

    x, weight, residual = inputs
    module = RMSNorm(x.shape[-1], EPS, x.dtype, x.device)
    with torch.no_grad():
        module.weight.copy_(weight)

    @torch.no_grad()
    def call():
        if residual is None:
            return module(x)
        h = x + residual
        return module(h), h

    return call


def _fp8(fused: bool):
    """The kernel's form quantized for a block-FP8 GEMM (E4M3, group 128): the normalized output alone."""

    def factory(inputs):
        fn = kernel("kernels.rms_norm", "rms_norm_fp8")
        x, weight, residual = inputs
        if fused:
            return lambda: fn(x, weight, EPS, residual)[0]
        return lambda: fn(x, weight, EPS)

    return factory


def _op(fused: bool, hidden: int) -> OpBench:
    per_row = 4 if fused else 2
    return OpBench(
        name=f"{'fused_add_rms_norm' if fused else 'rms_norm'}_h{hidden}",
        area="norm",
        dtype="bfloat16",
        x_name="rows",
        sweeps=_sweeps(hidden),
        make_inputs=_inputs(fused),
        impls=(
            Impl("reference-eager", _wrap(lambda: rms_norm)),
            Impl("runner-eager", _runner_eager, gated=False),
            Impl("reference-compiled", _wrap(lambda: compiled(rms_norm)), gated=False),
            Impl("triton", _wrap(lambda: kernel("kernels.rms_norm", "rms_norm")), triton_skip),
            Impl("triton-fp8", _fp8(fused), triton_skip, check=FP8_GROUPS_CHECK),
        ),
        bytes_model=lambda case: (per_row * case.shape[0] + 1) * case.shape[1] * 2,
        flops_model=lambda case: 4 * case.shape[0] * case.shape[1],
        roof="memcpy",
        baselines=("reference-eager", "runner-eager", "reference-compiled"),
        compare_to="runner-eager",
        headline=(("triton", "runner-eager"), ("triton", "reference-compiled"), ("triton", "memcpy")),
        check=lossy_check(families.RMS_NORM),
        cuda_graph=True,
    )


OPS = [register(_op(fused, hidden)) for fused in (True, False) for hidden in HIDDENS]
