"""W4A16 NVFP4 GEMM benchmark: y = x @ W^T, x bf16 [M, K], W NVFP4 [N, K] (codes + E4M3 scales per 16 + a global
scale), N = K = 8192.

The x axis is M (1 = decode ... 1024 = prefill). Bytes per call (compulsory): codes N*K/2 + scales N*K/16 + x M*K*2
+ y M*N*2; FLOPs 2*M*N*K. The roof is the same-run memcpy (small M is weight-bandwidth bound); at M = 1024 the
bf16-matmul column is the one to read. Implementations:
- reference-eager: the mirror reference (block-scaled weights, fp32 matmul, the global scale, one rounding): the
  baseline;
- reference-compiled: the same under torch.compile (an ungated peer);
- bf16-matmul: torch.matmul(x, W_bf16^T) on the dequantized weights (cuBLAS; an ungated peer);
- dequantize-matmul: the dequantize kernel (`kernels.nvfp4.dequantize_nvfp4`) then torch.matmul, each call: what
  the runner ran for NVFP4 layers before this kernel (an ungated peer; its bf16 rounding of the weights differs
  from the mirror's one rounding of the output, within the lossy row);
- triton: kernels.w4a16_nvfp4_gemm, on the interchange codes and scales.
Correctness: lossy against the mirror (kernels.tolerances row "w4a16_nvfp4_gemm").

Timing: CUDA-graph replays (`cuda_graph=True`, as the MXFP4 GEMM's bench and for its reason: the op's host cost
exceeds a decode-sized kernel), L2 flushed by a 256 MB read between repetitions (bench.timing), so the weights
come from HBM.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from bench.correctness import lossy_check
from bench.gemm.w4a16_mxfp4 import FULL_M, SMALL_M, SMALL_NK, cases, gemm_flops
from bench.quant.sweeps import compiled, kernel, triton_skip
from bench.registry import Impl, OpBench, register
from kernels.tolerances import families
from reference.gemm.w4a16_nvfp4 import w4a16_nvfp4_gemm_mirror
from reference.quant.nvfp4 import NVFP4_BLOCK_SIZE, dequantize_nvfp4
from reference.quant.nvfp4_global_scale import DecodeScale

FULL_NK = 8192
# E4M3 scale bytes 0x30 .. 0x3F (0.5 .. 1.875) under a global decode scale of 2**-8: weights ~2e-3 .. 0.04
SCALE_RANGE = (0x30, 0x40)
GLOBAL_DECODE = 2.0**-8


def gemm_bytes(case) -> int:
    m, n, k = case.shape
    return n * k // 2 + n * k // NVFP4_BLOCK_SIZE + m * k * 2 + m * n * 2


def inputs(case, torch_device: str) -> tuple[torch.Tensor, ...]:
    """x, codes, scales, the global decode scale (a 0-dim tensor) and the bf16 weights the matmul peer multiplies
    (dequantized once, untimed)."""
    m, n, k = case.shape
    generator = torch.Generator(device=torch_device).manual_seed(0)
    x = torch.randn(m, k, dtype=torch.bfloat16, device=torch_device, generator=generator)
    codes = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device=torch_device, generator=generator)
    low, high = SCALE_RANGE
    scales = torch.randint(
        low, high, (n, k // NVFP4_BLOCK_SIZE), dtype=torch.uint8, device=torch_device, generator=generator
    )
    decode = torch.tensor(GLOBAL_DECODE, device=torch_device)
    return x, codes, scales, decode, dequantize_nvfp4(codes, scales, DecodeScale(decode), dtype=torch.bfloat16)


def _with(get_fn: Callable[[], Callable]) -> Callable[[tuple], Callable[[], object]]:
    def factory(args: tuple[torch.Tensor, ...]) -> Callable[[], object]:
        fn = get_fn()
        x, codes, scales, decode, _ = args
        scale = DecodeScale(decode)
        return lambda: fn(x, codes, scales, scale)

    return factory


def _matmul(args: tuple[torch.Tensor, ...]) -> Callable[[], object]:
    x, _, _, _, w = args
    return lambda: torch.matmul(x, w.T)


def _dequantize_matmul(args: tuple[torch.Tensor, ...]) -> Callable[[], object]:
    dequantize = kernel("kernels.nvfp4", "dequantize_nvfp4")
    x, codes, scales, decode, _ = args
    scale = DecodeScale(decode)
    return lambda: torch.matmul(x, dequantize(codes, scales, scale, dtype=torch.bfloat16).T)


W4A16_NVFP4 = register(
    OpBench(
        name="w4a16_nvfp4_gemm",
        area="gemm",
        dtype="bf16 x nvfp4 -> bf16",
        x_name="M",
        sweeps={"small": cases(SMALL_M, SMALL_NK), "full": cases(FULL_M, FULL_NK)},
        make_inputs=inputs,
        impls=(
            Impl("reference-eager", _with(lambda: w4a16_nvfp4_gemm_mirror)),
            Impl("reference-compiled", _with(lambda: compiled(w4a16_nvfp4_gemm_mirror)), gated=False),
            Impl("bf16-matmul", _matmul, gated=False),
            Impl("dequantize-matmul", _dequantize_matmul, triton_skip, gated=False),
            Impl("triton", _with(lambda: kernel("kernels.w4a16_nvfp4_gemm", "w4a16_nvfp4_gemm")), triton_skip),
        ),
        bytes_model=gemm_bytes,
        flops_model=gemm_flops,
        roof="memcpy",
        baselines=("reference-eager", "reference-compiled"),
        compare_to="bf16-matmul",
        headline=(("triton", "bf16-matmul"), ("triton", "memcpy"), ("triton", "dequantize-matmul")),
        check=lossy_check(families.W4A16_NVFP4_GEMM),
        cuda_graph=True,
    )
)
