"""Block-FP8 W8A8 GEMM benchmark (DeepSeek-V3: 1x128 activation groups, 128x128 weight blocks), bf16 out.

Compute-bound for large M, measured against the same-run bf16 GEMM roof; FLOPs 2*M*N*K, bytes the FP8
operands + fp32 scales + bf16 output (bench/gemm/block_fp8_peers.py). One op per weight shape (x = M):
- block_fp8_gemm_square: M = N = K (the 8192^3 bar: Triton >= 0.95x cuBLAS blockwise of the same run);
- block_fp8_gemm_n{N}_k{K}: DeepSeek-V3 projections (N, K) in {(2112, 7168), (24576, 1536), (7168, 16384),
  (7168, 2048)}, M in {1, 16, 128, 1024, 4096}.
Implementations: reference-mirror (reference.gemm.block_fp8, eager: the baseline every row is checked
against with the suites' tolerance row), triton (kernels.block_fp8_gemm, gated), and ungated vendor peers:
cublas-blockwise (`torch._scaled_mm` with 1x128 / 128x128 scales: the bar), cublas-rowwise-fp8 and
cublas-bf16 (see block_fp8_peers.py). The last two multiply differently quantized (rowwise) or unquantized
(bf16) operands: not expected to equal the block-FP8 result, their verdict records the distance from it
("differs as expected") and is a mismatch only beyond a bound that rounding of that kind cannot reach.
Timing: CUDA-graph replays for every impl (`cuda_graph=True`; bench.timing.graphed says why), so the small-M
rows time the GPU, not the host's op dispatch.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from bench.correctness import expected_difference, lossy_check
from bench.gemm import block_fp8_peers as peers
from bench.quant.sweeps import kernel, triton_skip
from bench.registry import Case, Impl, OpBench, Unavailable, register
from kernels.tolerances import families
from reference.gemm.block_fp8 import block_fp8_gemm_mirror

DSV3_SHAPES = ((2112, 7168), (24576, 1536), (7168, 16384), (7168, 2048))
DSV3_M = (1, 16, 128, 1024, 4096)
SQUARE = (2048, 4096, 8192)
# CPU: the eager mirror only (kernels and cuBLAS need a GPU); DeepSeek-V3 ops use M 1 and 16 at K = 1024.
SMALL = ((16, 256, 512), (64, 576, 1024))


def _case(m: int, n: int, k: int) -> Case:
    return Case(f"M{m}_N{n}_K{k}", float(m), (m, n, k))


def inputs(case: Case, torch_device: str) -> peers.Operands:
    return peers.make_operands(*case.shape, torch_device)


def _mirror(ops: peers.Operands) -> Callable[[], torch.Tensor]:
    return lambda: block_fp8_gemm_mirror(*ops.args, out_dtype=torch.bfloat16)


def _triton(ops: peers.Operands) -> Callable[[], torch.Tensor]:
    fn = kernel("kernels.block_fp8_gemm", "block_fp8_gemm")
    return lambda: fn(*ops.args, out_dtype=torch.bfloat16)


def _peer(make: Callable[[peers.Operands], Callable[[], torch.Tensor]]):
    def factory(ops: peers.Operands) -> Callable[[], torch.Tensor]:
        if not hasattr(torch, "_scaled_mm"):
            raise Unavailable(f"torch {torch.__version__} has no _scaled_mm")
        return make(ops)

    return factory


def cuda_only(case: Case, backend: str) -> str | None:
    if backend != "cuda":
        return f"cuBLAS needs an NVIDIA GPU (backend {backend})"
    return None


def fp8_cublas_skip(case: Case, backend: str) -> str | None:
    reason = cuda_only(case, backend)
    if reason is None and torch.cuda.get_device_capability() < (9, 0):
        return "FP8 _scaled_mm needs sm_89+, blockwise scales sm_90"
    return reason


# Distances from the block-FP8 mirror measured on the H200 (randn operands, every shape of this file, M 1-8192):
# rowwise FP8 max_rel 0.031-0.048, bf16 of the unquantized operands 0.0033-0.0071; bounds ~2x the worst.
ROWWISE_CHECK = expected_difference("rowwise FP8 scales, not 1x128 / 128x128 blocks", 0.1)
BF16_CHECK = expected_difference("bf16 GEMM of the unquantized operands", 0.015)

IMPLS = (
    Impl("reference-mirror", _mirror),
    Impl("triton", _triton, triton_skip),
    Impl("cublas-blockwise", _peer(peers.cublas_blockwise), fp8_cublas_skip, gated=False),
    Impl("cublas-rowwise-fp8", _peer(peers.cublas_rowwise), fp8_cublas_skip, gated=False, check=ROWWISE_CHECK),
    Impl("cublas-bf16", peers.bf16_matmul, cuda_only, gated=False, check=BF16_CHECK),
)


def _op(name: str, full: list[Case], small: list[Case]) -> OpBench:
    return OpBench(
        name=name,
        area="gemm",
        dtype="e4m3fn->bfloat16",
        x_name="M",
        sweeps={"small": small, "full": full},
        make_inputs=inputs,
        impls=IMPLS,
        bytes_model=lambda case: peers.gemm_bytes(*case.shape),
        flops_model=lambda case: peers.gemm_flops(*case.shape),
        roof="gemm",
        baselines=("reference-mirror",),
        compare_to="cublas-blockwise",
        headline=(("triton", "cublas-blockwise"), ("triton", "gemm")),
        check=lossy_check(families.BLOCK_FP8_GEMM),
        cuda_graph=True,
    )


SQUARE_OP = register(_op("block_fp8_gemm_square", [_case(s, s, s) for s in SQUARE], [_case(*shape) for shape in SMALL]))
DSV3_OPS = tuple(
    register(_op(f"block_fp8_gemm_n{n}_k{k}", [_case(m, n, k) for m in DSV3_M], [_case(m, n, 1024) for m in (1, 16)]))
    for n, k in DSV3_SHAPES
)
