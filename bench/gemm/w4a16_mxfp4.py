"""W4A16 MXFP4 GEMM benchmark: y = x @ W^T, x bf16 [M, K], W MXFP4 [N, K] (codes + E8M0 scales), N = K = 8192.

The x axis is M (1 = decode ... 1024 = prefill). Bytes per call (compulsory): codes N*K/2 + scales N*K/32 +
x M*K*2 + y M*N*2; FLOPs 2*M*N*K. The roof is the same-run memcpy: small M is weight-bandwidth bound (the bar
at M = 1: >= 0.75x memcpy and >= 3x the bf16 matmul of the same run); at M = 1024 the bf16-matmul column is the
one to read. Implementations:
- reference-eager: the mirror reference (dequantize to bf16, fp32 matmul, one rounding): the baseline;
- reference-compiled: the same under torch.compile (an ungated peer);
- bf16-matmul: torch.matmul(x, W_bf16^T) on the dequantized weights (cuBLAS; an ungated peer, the speed bar);
- triton: kernels.w4a16_mxfp4_gemm, on the interchange codes;
- triton-prepared: kernels.w4a16_mxfp4_gemm_prepared, on the codes in the layout the runner prepares once at
  load (kernels.w4a16_mxfp4_layout; prepared before timing);
- triton-fragments: kernels.w4a16_mxfp4_fragment_gemv, the tensor-core GEMV on the weights in mma fragment order
  (kernels.mxfp4_fragment_layout, prepared before timing; its scales are bf16, so it reads 6 % more bytes than
  the byte count above, which stays the interchange layout's). Eight x rows a pass: past M = 8 it re-reads W.
Correctness: lossy against the mirror (kernels.tolerances row "w4a16_mxfp4_gemm").

Timing: every impl is timed as a CUDA-graph replay (`cuda_graph=True`; bench.timing.graphed says why: the
op's host cost, ~50 us through torch.ops at M = 1 on the H200, exceeds the ~20 us kernel), with L2 flushed by a
256 MB read between repetitions (bench.timing), so the 34 MiB of weights come from HBM, not the 50 MB L2.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from bench.correctness import lossy_check
from bench.quant.sweeps import compiled, kernel, triton_skip
from bench.registry import Case, Impl, OpBench, register
from kernels.tolerances import families
from reference.gemm.w4a16_mxfp4 import w4a16_mxfp4_gemm_mirror
from reference.quant.mxfp4 import MX_BLOCK_SIZE, dequantize_mxfp4

FULL_M = (1, 4, 16, 64, 128, 1024)  # the bars: M = 1, 16, 64
FULL_NK = 8192
SMALL_M = (1, 4)
SMALL_NK = 512  # the CPU sweep only exercises the harness (eager mirror ~0.1 s per call there)
SCALE_RANGE = (118, 125)  # E8M0 bytes 2**-9 .. 2**-3: weights of magnitude ~1e-3 .. 0.1, as in checkpoints


def cases(ms: tuple[int, ...], nk: int) -> list[Case]:
    return [Case(f"M{m}", float(m), (m, nk, nk)) for m in ms]


def gemm_bytes(case: Case) -> int:
    m, n, k = case.shape
    return n * k // 2 + n * k // MX_BLOCK_SIZE + m * k * 2 + m * n * 2


def gemm_flops(case: Case) -> int:
    m, n, k = case.shape
    return 2 * m * n * k


def inputs(case: Case, torch_device: str) -> tuple[torch.Tensor, ...]:
    """x, codes, scales, and the bf16 weights the matmul peer multiplies (W dequantized once, untimed)."""
    m, n, k = case.shape
    generator = torch.Generator(device=torch_device).manual_seed(0)
    x = torch.randn(m, k, dtype=torch.bfloat16, device=torch_device, generator=generator)
    codes, scales = random_weights(n, k, generator)
    return x, codes, scales, dequantize_mxfp4(codes, scales, dtype=torch.bfloat16)


def random_weights(n: int, k: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP4 weights [n, k] on the generator's device: uniform codes, scale bytes in SCALE_RANGE."""
    device = generator.device
    codes = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device=device, generator=generator)
    low, high = SCALE_RANGE
    scales = torch.randint(low, high, (n, k // MX_BLOCK_SIZE), dtype=torch.uint8, device=device, generator=generator)
    return codes, scales


def _with(get_fn: Callable[[], Callable]) -> Callable[[tuple], Callable[[], object]]:
    def factory(args: tuple[torch.Tensor, ...]) -> Callable[[], object]:
        fn = get_fn()
        x, codes, scales, _ = args
        return lambda: fn(x, codes, scales)

    return factory


def _prepared(args: tuple[torch.Tensor, ...]) -> Callable[[], object]:
    from kernels.w4a16_mxfp4_gemm import w4a16_mxfp4_gemm_prepared
    from kernels.w4a16_mxfp4_layout import prepare_codes

    x, codes, scales, _ = args
    prepared = prepare_codes(codes)
    return lambda: w4a16_mxfp4_gemm_prepared(x, prepared, scales)


def _fragments(args: tuple[torch.Tensor, ...]) -> Callable[[], object]:
    from kernels.mxfp4_fragment_layout import prepare
    from kernels.w4a16_mxfp4_fragment_gemv import w4a16_mxfp4_fragment_gemv

    x, codes, scales, _ = args
    words, pairs = prepare(codes, scales)
    return lambda: w4a16_mxfp4_fragment_gemv(x, words, pairs)


def _matmul(args: tuple[torch.Tensor, ...]) -> Callable[[], object]:
    x, _, _, w = args
    return lambda: torch.matmul(x, w.T)


W4A16 = register(
    OpBench(
        name="w4a16_mxfp4_gemm",
        area="gemm",
        dtype="bf16 x mxfp4 -> bf16",
        x_name="M",
        sweeps={"small": cases(SMALL_M, SMALL_NK), "full": cases(FULL_M, FULL_NK)},
        make_inputs=inputs,
        impls=(
            Impl("reference-eager", _with(lambda: w4a16_mxfp4_gemm_mirror)),
            Impl("reference-compiled", _with(lambda: compiled(w4a16_mxfp4_gemm_mirror)), gated=False),
            Impl("bf16-matmul", _matmul, gated=False),
            Impl("triton", _with(lambda: kernel("kernels.w4a16_mxfp4_gemm", "w4a16_mxfp4_gemm")), triton_skip),
            Impl("triton-prepared", _prepared, triton_skip),
            Impl("triton-fragments", _fragments, triton_skip),
        ),
        bytes_model=gemm_bytes,
        flops_model=gemm_flops,
        roof="memcpy",
        baselines=("reference-eager", "reference-compiled"),
        compare_to="bf16-matmul",
        headline=(
            ("triton-prepared", "bf16-matmul"),
            ("triton-prepared", "memcpy"),
            ("triton-prepared", "triton"),
            ("triton-fragments", "bf16-matmul"),
            ("triton-fragments", "memcpy"),
        ),
        check=lossy_check(families.W4A16_MXFP4_GEMM),
        cuda_graph=True,
    )
)
