"""FP8 per-token-group quantization benchmark (DeepSeek-V3 activations): bf16 [M, 7168] -> e4m3fn codes
[M, 7168] + fp32 scales [M, 56] (one per 128 elements), fp32 scales and UE8M0 scales as two ops.

Bandwidth-bound, measured against the same-run memcpy roof. Bytes per call: the bf16 tensor (M*K*2) read,
codes (M*K) and scales (M*K/128*4) written. Implementations as for MXFP4 (bench/quant/mxfp4.py): the eager
reference (the definition every row is checked against), torch.compile of it (an ungated peer), Triton.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from bench.quant.sweeps import bf16_input, quant_op, sweeps
from bench.registry import Case, OpBench, register
from reference.quant.fp8 import quantize_fp8

K = 7168
GROUP = 128
# Peak memory of one eager call over the bf16 input, measured as peak-RSS growth on CPU at 64 MiB: 6.1x
# (fp32 copy, product, clamp, codes). Cheap enough to run at every GPU size.
EAGER_TEMPORARIES = 6
EAGER_GPU_MAX_MIB = 1024


def fp8_group_bytes(case: Case) -> int:
    m, k = case.shape
    return m * k * 2 + m * k + m * (k // GROUP) * 4


def _with(get_fn: Callable[[], Callable], ue8m0: bool) -> Callable[[torch.Tensor], Callable[[], object]]:
    def factory(x: torch.Tensor) -> Callable[[], object]:
        fn = get_fn()
        return lambda: fn(x, granularity="group", group_size=GROUP, fmt="e4m3fn", ue8m0=ue8m0)

    return factory


def _op(name: str, ue8m0: bool) -> OpBench:
    return quant_op(
        name,
        "bfloat16->e4m3fn",
        sweeps(K),
        bf16_input,
        fp8_group_bytes,
        lambda get_fn: _with(get_fn, ue8m0),
        quantize_fp8,
        "kernels.fp8_quant",
        "quantize_fp8",
        EAGER_TEMPORARIES,
        EAGER_GPU_MAX_MIB,
    )


GROUP_QUANT = register(_op("fp8_group128_quantize", ue8m0=False))
GROUP_QUANT_UE8M0 = register(_op("fp8_group128_ue8m0_quantize", ue8m0=True))
