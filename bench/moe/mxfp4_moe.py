"""MXFP4 W4A16 MoE layer benchmark (`kernels.mxfp4_moe_fragment`, `kernels.mxfp4_moe`): gpt-oss-20b's experts
(E 32, top 4, hidden 2880, intermediate 2880, the clamped SwiGLU with biases), E2M1 codes with E8M0 scales per 32
weights, bf16 activations. Routing and cases as bench/moe/fused_moe.py. Two ops:
- mxfp4_moe_decode_gptoss, T 1 ... 64, against memcpy on the bytes moved: the touched experts' codes, scales and
  biases, x in and the output out. The bar: >= 0.60x memcpy at 1-16 tokens.
- mxfp4_moe_prefill_gptoss, T 256 ... 4096, against the GEMM roof (FLOPs 6 T k H I).
Implementations: reference-mirror (`mxfp4_moe_mirror` on the device: the baseline, "mxfp4_moe" row), triton
(gated), and bf16-fused-moe (ungated): `kernels.fused_moe` on the decoded bf16 weights, what the layer costs
unquantized. triton is `kernels.mxfp4_moe_fragment` on the weights prepared once in the fragment layout (untimed,
as a loader prepares them: its GEMVs at decode, the bf16 layer on the experts it decodes at prefill), with
triton-interchange (ungated) beside it: `kernels.mxfp4_moe` on the codes and scales (moe_gemv's GEMVs, the grouped
GEMM). The weights are made once per process and shared by the cases.
"""

from __future__ import annotations

import functools

import torch

from bench.correctness import lossy_check
from bench.moe.layer_bench import Shape, accuracy_rows, cases, moe_op, routing, touched_experts, with_args
from bench.quant.sweeps import kernel, triton_skip
from bench.registry import AccuracyReport, Case, Impl, Unavailable, register_accuracy
from kernels.tolerances import families
from reference.moe.quantized import mxfp4_moe_ideal, mxfp4_moe_mirror
from reference.quant.mxfp4 import dequantize_mxfp4, quantize_mxfp4

GPTOSS = Shape(32, 4, 2880, 2880)
TINY = Shape(4, 2, 64, 96)  # the CPU sweep exercises the harness only
DECODE_T, PREFILL_T = (1, 4, 16, 64), (256, 1024, 4096)


def moved_bytes(case: Case) -> int:
    tokens, _, _, hidden, inter = case.shape
    per_expert = 3 * hidden * inter // 2 + 3 * hidden * inter // 32 + (2 * inter + hidden) * 2
    return touched_experts(case) * per_expert + 2 * tokens * hidden * 2


@functools.lru_cache(maxsize=1)
def expert_weights(experts: int, hidden: int, inter: int, torch_device: str) -> tuple[torch.Tensor, ...]:
    """(w13, w13_scales, w2, w2_scales, w13_bias, w2_bias): randn / sqrt(fan-in) weights quantized to MXFP4 one
    expert at a time, w13 interleaved (gpt-oss), randn / 10 biases."""
    g = torch.Generator(device=torch_device).manual_seed(0)
    parts = [
        (
            quantize_mxfp4(torch.randn(2 * inter, hidden, device=torch_device, generator=g) * hidden**-0.5),
            quantize_mxfp4(torch.randn(hidden, inter, device=torch_device, generator=g) * inter**-0.5),
        )
        for _ in range(experts)
    ]
    w13, s13 = (torch.stack([p[0][i] for p in parts]) for i in (0, 1))
    w2, s2 = (torch.stack([p[1][i] for p in parts]) for i in (0, 1))
    b13 = (torch.randn(experts, 2 * inter, device=torch_device, generator=g) / 10).to(torch.bfloat16)
    b2 = (torch.randn(experts, hidden, device=torch_device, generator=g) / 10).to(torch.bfloat16)
    return w13, s13, w2, s2, b13, b2


@functools.lru_cache(maxsize=1)
def fragment_weights(experts: int, hidden: int, inter: int, torch_device: str) -> tuple[torch.Tensor, ...]:
    """(w13 words, w13 pairs, w2 words, w2 pairs): `expert_weights` in the fragment layout."""
    from kernels.mxfp4_fragment_layout import prepare

    w13, s13, w2, s2 = expert_weights(experts, hidden, inter, torch_device)[:4]
    return (*prepare(w13, s13), *prepare(w2, s2))


def _fragment_layer(args: tuple):
    """`kernels.mxfp4_moe_fragment` on the prepared weights (prepared once, untimed)."""
    layer = kernel("kernels.mxfp4_moe_fragment", "mxfp4_moe_fragment")
    x, w13, _, w2, _, weights, ids, activation, b13, b2 = args
    words = fragment_weights(w13.shape[0], x.shape[1], w2.shape[2] * 2, str(x.device))
    return lambda: layer(x, *words, weights, ids, activation, b13, b2)


def inputs(case: Case, torch_device: str) -> tuple:
    tokens, experts, top_k, hidden, inter = case.shape
    g = torch.Generator(device=torch_device).manual_seed(1)
    x = torch.randn(tokens, hidden, device=torch_device, generator=g).to(torch.bfloat16)
    w13, s13, w2, s2, b13, b2 = expert_weights(experts, hidden, inter, torch_device)
    weights, ids = routing(tokens, experts, top_k)
    return x, w13, s13, w2, s2, weights.to(torch_device), ids.to(torch_device), "swiglu_oai", b13, b2


def _bf16_layer(args: tuple):
    """`kernels.fused_moe` on the decoded weights (decoded once, untimed)."""
    if not torch.cuda.is_available():
        raise Unavailable("the bf16 layer kernel needs a GPU")
    fused = kernel("kernels.fused_moe", "fused_moe")
    x, w13, s13, w2, s2, weights, ids, activation, b13, b2 = args
    w13_16, w2_16 = (dequantize_mxfp4(c, s, dtype=torch.bfloat16) for c, s in ((w13, s13), (w2, s2)))
    return lambda: fused(x, w13_16, w2_16, weights, ids, activation, b13, b2)


_CHECK = lossy_check(families.MXFP4_MOE)
_INTERCHANGE = with_args(lambda: kernel("kernels.mxfp4_moe", "mxfp4_moe"))
_MIRROR = Impl("reference-mirror", with_args(lambda: mxfp4_moe_mirror))
_BF16 = Impl("bf16-fused-moe", _bf16_layer, triton_skip, gated=False, check=_CHECK)
IMPLS = (
    _MIRROR,
    Impl("triton", _fragment_layer, triton_skip),
    Impl("triton-interchange", _INTERCHANGE, triton_skip, gated=False, check=_CHECK),
    _BF16,
)


def _op(name: str, full: list[Case], small: list[Case], roof: str):
    return moe_op(name, "bf16 x mxfp4 -> bf16", full, small, roof, inputs, IMPLS, moved_bytes, "bf16-fused-moe", _CHECK)


OPS = (
    _op("mxfp4_moe_decode_gptoss", cases(GPTOSS, DECODE_T), cases(TINY, (1, 5)), "memcpy"),
    _op("mxfp4_moe_prefill_gptoss", cases(GPTOSS, PREFILL_T), cases(TINY, (33,)), "gemm"),
)

GPTOSS_4 = Shape(4, 4, 2880, 2880)  # the accuracy table's experts (the fp64 ideal of 32 would need 8 GB)


def _accuracy() -> list[dict]:
    rows = accuracy_rows(
        {"gpt-oss-4e": GPTOSS_4}, (16, 256), TINY, inputs, mxfp4_moe_mirror, mxfp4_moe_ideal,
        "kernels.mxfp4_moe.mxfp4_moe",
    )  # fmt: skip
    expert_weights.cache_clear()
    return rows


ACCURACY = register_accuracy(
    AccuracyReport(
        name="mxfp4_moe_accuracy",
        title="MXFP4 MoE: SQNR against the fp64 ideal of the decoded weights, distance from the precision mirror",
        ops=tuple(op.name for op in OPS),
        rows=_accuracy,
        note=(
            "The benchmark's inputs (bench/moe/mxfp4_moe.py) with 4 experts. Ideal: `mxfp4_moe_ideal` (fp64 of "
            "the exactly decoded weights); mirror: `mxfp4_moe_mirror` (the weights decoded to bf16, the bf16 "
            "layer's roundings); max_rel / rms_rel: the kernel against the mirror, as the 'mxfp4_moe' row bounds "
            "them."
        ),
    )
)
