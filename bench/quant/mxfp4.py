"""MXFP4 quantize / dequantize benchmarks: bf16 [M, 4096] <-> codes uint8 [M, 2048] + E8M0 scales [M, 128].

Both ops are bandwidth-bound, measured against the same-run memcpy roof. Bytes (compulsory, per call):
the bf16 tensor (M*K*2) + packed codes (M*K/2) + scales (M*K/32), read on one side and written on the
other. No FLOPs model: the work per byte is a handful of integer/compare ops, never the limit.

Sizes are the bf16 tensor's size (x = bf16_MiB): 1 MiB to 1 GiB on GPUs (1 GiB: M = 131072), up to 8 MiB on
CPU. Implementations:
- reference-eager: reference.quant.mxfp4 as written (float64, large temporaries);
- reference-compiled: the same functions under torch.compile, compiled once per process with dynamic
  shapes, so the sweep reuses one graph across sizes;
- triton: kernels.mxfp4, imported when first used (a missing module makes the impl a recorded skip);
- triton-fragment (dequantize): kernels.mxfp4_fragment_dequantize on the same weights in the fragment layout
  the runner stores where the packed PTX runs (kernels.mxfp4_fragment_layout, prepared before timing; its
  scales are bf16 pairs, so it reads 1/32 of a byte a weight more than the bytes model counts).
Correctness: bit-exact (codes and scales; output bits) against reference-eager where it ran, else against
reference-compiled.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from bench.quant.sweeps import bf16_input, packed_fp4_input, quant_op, sweeps, triton_skip
from bench.registry import Case, Impl, OpBench, register
from reference.quant.mxfp4 import MX_BLOCK_SIZE, dequantize_mxfp4, quantize_mxfp4

K = 4096
# Peak memory of one eager call over the bf16 tensor's size, measured as peak-RSS growth on CPU at 64 MiB:
# quantize 72x (encode_e2m1's float64 [..., 8] distance grid dominates), dequantize 17x.
EAGER_TEMPORARIES = {"quantize": 72, "dequantize": 17}
# The eager reference runs at every GPU size, 1 GiB included (72 GiB of temporaries for quantize, within the
# H200's 141 GB; 66 ms per call at 256 MiB): it is the definition every other row's bytes are checked against.
EAGER_GPU_MAX_MIB = 1024
SCALE_RANGE = (112, 143)  # E8M0 bytes 2**-15 .. 2**15: realistic weight/activation scales, no NaN byte
SWEEPS = sweeps(K)


def mxfp4_bytes(case: Case) -> int:
    m, k = case.shape
    return m * k * 2 + m * k // 2 + m * k // MX_BLOCK_SIZE


def dequantize_inputs(case: Case, torch_device: str) -> tuple[torch.Tensor, torch.Tensor]:
    return packed_fp4_input(case, torch_device, MX_BLOCK_SIZE, SCALE_RANGE)


def _quantize_with(get_fn: Callable[[], Callable]) -> Callable[[torch.Tensor], Callable[[], object]]:
    def factory(x: torch.Tensor) -> Callable[[], object]:
        fn = get_fn()
        return lambda: fn(x, scale_mode="floor")

    return factory


def _dequantize_with(get_fn: Callable[[], Callable]) -> Callable[[tuple], Callable[[], object]]:
    def factory(inputs: tuple[torch.Tensor, torch.Tensor]) -> Callable[[], object]:
        fn = get_fn()
        codes, scales = inputs
        return lambda: fn(codes, scales, dtype=torch.bfloat16)

    return factory


def _op(name: str, kind: str, dtype: str, make_inputs: Callable, wrap: Callable, reference: Callable) -> OpBench:
    return quant_op(
        name,
        dtype,
        SWEEPS,
        make_inputs,
        mxfp4_bytes,
        wrap,
        reference,
        "kernels.mxfp4",
        f"{kind}_mxfp4",
        EAGER_TEMPORARIES[kind],
        EAGER_GPU_MAX_MIB,
    )


def _fragment_dequantize(inputs: tuple[torch.Tensor, torch.Tensor]) -> Callable[[], object]:
    from kernels.mxfp4_fragment_dequantize import dequantize_mxfp4_fragment
    from kernels.mxfp4_fragment_layout import prepare

    words, pairs = prepare(*inputs)
    return lambda: dequantize_mxfp4_fragment(words, pairs)


def _with_fragment(op: OpBench) -> OpBench:
    fragment = Impl("triton-fragment", _fragment_dequantize, triton_skip)
    headline = (*op.headline, ("triton-fragment", "memcpy"))
    return dataclasses.replace(op, impls=(*op.impls, fragment), headline=headline)


QUANTIZE = register(_op("mxfp4_quantize", "quantize", "bfloat16->mxfp4", bf16_input, _quantize_with, quantize_mxfp4))
DEQUANTIZE = register(
    _with_fragment(
        _op("mxfp4_dequantize", "dequantize", "mxfp4->bfloat16", dequantize_inputs, _dequantize_with, dequantize_mxfp4)
    )
)
