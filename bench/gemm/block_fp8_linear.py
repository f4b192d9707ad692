"""Block-FP8 linear benchmark (`kernels.block_fp8_linear`: bf16 activations quantized per 1x128 group inside
the GEMM), at decode's few rows on Llama-3.1-8B's widest projection (gate_up: N 28672, K 4096), M 1 ... 16.

Bytes: the FP8 weight and its fp32 tile scales, bf16 x in and the bf16 output (what a decode step must move),
against the same-run memcpy roof. Implementations: reference-mirror (`block_fp8_linear_mirror`, eager: the
baseline), triton (the fused kernel, gated), and ungated peers: triton-quantize-then-gemm (the two launches
the fused kernel replaces: `kernels.fp8_quant` then `kernels.block_fp8_gemm`, the same bytes) and cublas-bf16
(bf16 `matmul` of x and the dequantized weight: what the layer costs unquantized). CUDA-graph replays.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from bench.correctness import expected_difference, lossy_check
from bench.quant.sweeps import kernel, triton_skip
from bench.registry import Case, Impl, OpBench, register
from kernels.tolerances import families
from reference.gemm.block_fp8 import BLOCK, dequantize_weights
from reference.gemm.block_fp8_linear import block_fp8_linear_mirror
from reference.quant.fp8 import quantize_fp8_blocks

GATE_UP = (28672, 4096)
DECODE_M = (1, 4, 8, 16)
SMALL = ((1, 256, 512), (5, 384, 256))


@dataclasses.dataclass
class Operands:
    x: torch.Tensor  # [M, K] bf16
    b: torch.Tensor  # [N, K] e4m3fn
    b_scales: torch.Tensor  # [N / 128, K / 128] fp32


def _case(m: int, n: int, k: int) -> Case:
    return Case(f"M{m}_N{n}_K{k}", float(m), (m, n, k))


def inputs(case: Case, torch_device: str) -> Operands:
    m, n, k = case.shape
    g = torch.Generator(device=torch_device).manual_seed(0)
    x = torch.randn(m, k, dtype=torch.bfloat16, device=torch_device, generator=g)
    w = torch.randn(n, k, dtype=torch.bfloat16, device=torch_device, generator=g) / k**0.5
    b, b_scales = quantize_fp8_blocks(w, block=BLOCK)
    return Operands(x, b, b_scales)


def linear_bytes(case: Case) -> int:
    m, n, k = case.shape
    return n * k + 4 * (-(-n // BLOCK)) * (k // BLOCK) + 2 * m * k + 2 * m * n


def _mirror(ops: Operands) -> Callable[[], torch.Tensor]:
    return lambda: block_fp8_linear_mirror(ops.x, ops.b, ops.b_scales, torch.bfloat16)


def _triton(ops: Operands) -> Callable[[], torch.Tensor]:
    fn = kernel("kernels.block_fp8_linear", "block_fp8_linear")
    return lambda: fn(ops.x, ops.b, ops.b_scales, torch.bfloat16)


def _two_kernels(ops: Operands) -> Callable[[], torch.Tensor]:
    quantize = kernel("kernels.fp8_quant", "quantize_fp8")
    gemm = kernel("kernels.block_fp8_gemm", "block_fp8_gemm")

    def run() -> torch.Tensor:
        a, a_scales = quantize(ops.x, granularity="group", group_size=BLOCK)
        return gemm(a, a_scales, ops.b, ops.b_scales, torch.bfloat16)

    return run


def cuda_only(case: Case, backend: str) -> str | None:
    return None if backend == "cuda" else f"the peer is cuBLAS: an NVIDIA GPU (backend {backend})"


def _bf16(ops: Operands) -> Callable[[], torch.Tensor]:
    w = dequantize_weights(ops.b, ops.b_scales).to(torch.bfloat16)
    return lambda: torch.matmul(ops.x, w.t())


# The bf16 product of the unquantized activations differs from the block-FP8 one by the activation rounding
# (e4m3: 2**-4 relative per element, averaged over K); bound as bench/gemm/block_fp8.py's bf16 peer.
BF16_CHECK = expected_difference("bf16 GEMM of the unquantized activations", 0.015)

IMPLS = (
    Impl("reference-mirror", _mirror),
    Impl("triton", _triton, triton_skip),
    Impl("triton-quantize-then-gemm", _two_kernels, triton_skip, gated=False),
    Impl("cublas-bf16", _bf16, cuda_only, gated=False, check=BF16_CHECK),
)

OP = register(
    OpBench(
        name="block_fp8_linear_decode_gate_up",
        area="gemm",
        dtype="bfloat16 x e4m3fn->bfloat16",
        x_name="M",
        sweeps={"full": [_case(m, *GATE_UP) for m in DECODE_M], "small": [_case(*s) for s in SMALL]},
        make_inputs=inputs,
        impls=IMPLS,
        bytes_model=linear_bytes,
        flops_model=lambda case: 2 * case.shape[0] * case.shape[1] * case.shape[2],
        roof="memcpy",
        baselines=("reference-mirror",),
        compare_to="triton-quantize-then-gemm",
        headline=(("triton", "triton-quantize-then-gemm"), ("triton", "memcpy")),
        check=lossy_check(families.BLOCK_FP8_GEMM),
        cuda_graph=True,
    )
)
