"""SiLU-and-mul benchmark (the decoder MLP's activation between gate_up_proj and down_proj), bf16, Llama-3.1-8B's
intermediate size 14336, rows 1..4096 (decode batch to prefill).

Bandwidth-bound, measured against the same-run memcpy roof. Bytes per call: gate and up read, out written
(3 * rows * I * 2). Implementations: the eager mirror (reference.activation.silu_and_mul, the baseline every row is
checked against, lossy row "silu_and_mul"); `runner-eager`, the runner's former eager form `F.silu(gate) * up`
(two kernels; an ungated peer an ulp off the mirror); torch.compile of the mirror (ungated peer); Triton; and
`triton-fp8`, the fused form that writes the output quantized for a block-FP8 GEMM (1 byte a value plus a scale
per 128: fewer bytes than the model above counts; checked by dequantizing against the baseline,
bench.correctness_fp8). Timing: CUDA-graph replays (a decode-sized call runs for a few microseconds).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from bench.correctness import expected_difference, lossy_check
from bench.correctness_fp8 import FP8_GROUPS_CHECK
from bench.quant.sweeps import compiled, kernel, triton_skip
from bench.registry import Case, Impl, OpBench, register
from kernels.tolerances import families
from reference.activation.silu_and_mul import silu_and_mul_mirror

INTER = 14336
FULL_ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
SMALL_ROWS, SMALL_INTER = (1, 4), 256  # CPU: the harness only


def _inputs(case: Case, torch_device: str) -> torch.Tensor:
    g = torch.Generator(device=torch_device).manual_seed(0)
    return torch.randn(case.shape[0], 2 * case.shape[1], device=torch_device, generator=g).to(torch.bfloat16)


def _eager(x: torch.Tensor):
    gate, up = x.chunk(2, dim=-1)
    return lambda: F.silu(gate) * up


EAGER_CHECK = expected_difference("silu rounded to bf16 before the product", 2.0**-6)

OP = register(
    OpBench(
        name=f"silu_and_mul_i{INTER}",
        area="activation",
        dtype="bfloat16",
        x_name="rows",
        sweeps={
            "small": [Case(f"{r}x{SMALL_INTER}", float(r), (r, SMALL_INTER)) for r in SMALL_ROWS],
            "full": [Case(f"{r}x{INTER}", float(r), (r, INTER)) for r in FULL_ROWS],
        },
        make_inputs=_inputs,
        impls=(
            Impl("reference-mirror", lambda x: lambda: silu_and_mul_mirror(x)),
            Impl("runner-eager", _eager, gated=False, check=EAGER_CHECK),
            Impl(
                "reference-compiled", lambda x: (lambda fn: lambda: fn(x))(compiled(silu_and_mul_mirror)), gated=False
            ),
            Impl(
                "triton",
                lambda x: (lambda fn: lambda: fn(x))(kernel("kernels.silu_and_mul", "silu_and_mul")),
                triton_skip,
            ),
            Impl(
                "triton-fp8",
                lambda x: (lambda fn: lambda: fn(x))(kernel("kernels.silu_and_mul", "silu_and_mul_fp8")),
                triton_skip,
                check=FP8_GROUPS_CHECK,
            ),
        ),
        bytes_model=lambda case: 3 * case.shape[0] * case.shape[1] * 2,
        flops_model=lambda case: 5 * case.shape[0] * case.shape[1],
        roof="memcpy",
        baselines=("reference-mirror",),
        compare_to="runner-eager",
        headline=(("triton", "runner-eager"), ("triton", "memcpy"), ("triton-fp8", "triton")),
        check=lossy_check(families.SILU_AND_MUL),
        cuda_graph=True,
    )
)
