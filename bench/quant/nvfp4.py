"""NVFP4 quantize / dequantize benchmarks, and the fused w1/w3 global-scale policy accuracy table.

Ops: bf16 [M, 7168] (the DeepSeek-V3 hidden size, a multiple of 16) <-> codes uint8 [M, 3584] + E4M3 scales
[M, 448], with one fp32 global scale (EncodeScale.from_amax of the input, computed once per case: the op
takes the global scale as an input). Both bandwidth-bound, measured against the same-run memcpy roof. Bytes
per call: the bf16 tensor (M*K*2) + codes (M*K/2) + scales (M*K/16), read on one side and written on the
other (the 4-byte global scale is negligible). Implementations as for MXFP4 (bench/quant/mxfp4.py): the
eager reference (the definition every row is checked against, bit-exact), torch.compile of it (an ungated
peer), the Triton kernel. Bars (H200, >= 256 MiB): quantize >= 0.90x memcpy and >= 4x
reference-compiled.

Accuracy table `nvfp4_w13_policies`: SQNR (dB, against the fp64 unquantized weights) of a fused gate/up
weight under each `reference.quant.nvfp4_fused_w13` policy, for up/gate amax ratios 1x, 2x and 10x, next to
"separate" (each half dequantized with its own global scale: the ideal a split-scale kernel reaches).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch

from bench.quant.sweeps import bf16_input, packed_fp4_input, quant_op, sweeps
from bench.registry import AccuracyReport, Case, OpBench, register, register_accuracy
from reference.quant.nvfp4 import NVFP4_BLOCK_SIZE, dequantize_nvfp4, quantize_nvfp4
from reference.quant.nvfp4_fused_w13 import W13_POLICIES, NVFP4Tensor, fuse_w13
from reference.quant.nvfp4_global_scale import DecodeScale, EncodeScale, tensor_amax

K = 7168
# Peak memory of one eager call over the bf16 input, by the temporaries' sizes: quantize is dominated by
# encode_e2m1's float64 [..., 8] distance grid (as MXFP4's 72x), dequantize by fp32 values and decoded codes.
# Not measured on this CPU VM (RSS growth); MXFP4's measured 72x / 17x are the model.
EAGER_TEMPORARIES = {"quantize": 72, "dequantize": 17}
EAGER_GPU_MAX_MIB = 1024
SCALE_RANGE = (0x20, 0x7E)  # E4M3 bytes 2**-4 .. 448: realistic block scales, no NaN byte
W13_RATIOS = (1.0, 2.0, 10.0)


def nvfp4_bytes(case: Case) -> int:
    m, k = case.shape
    return m * k * 2 + m * k // 2 + m * k // NVFP4_BLOCK_SIZE


def quantize_inputs(case: Case, torch_device: str) -> tuple[torch.Tensor, EncodeScale]:
    x = bf16_input(case, torch_device)
    return x, EncodeScale.from_amax(tensor_amax(x))


def dequantize_inputs(case: Case, torch_device: str) -> tuple[torch.Tensor, torch.Tensor, DecodeScale]:
    codes, scales = packed_fp4_input(case, torch_device, NVFP4_BLOCK_SIZE, SCALE_RANGE)
    return codes, scales, DecodeScale(torch.tensor(3.0e-3, device=torch_device))


def _quantize_with(get_fn: Callable[[], Callable]) -> Callable[[tuple], Callable[[], object]]:
    def factory(inputs: tuple[torch.Tensor, EncodeScale]) -> Callable[[], object]:
        fn = get_fn()
        x, scale = inputs
        return lambda: fn(x, scale)

    return factory


def _dequantize_with(get_fn: Callable[[], Callable]) -> Callable[[tuple], Callable[[], object]]:
    def factory(inputs: tuple[torch.Tensor, torch.Tensor, DecodeScale]) -> Callable[[], object]:
        fn = get_fn()
        codes, scales, scale = inputs
        return lambda: fn(codes, scales, scale, dtype=torch.bfloat16)

    return factory


def _op(name: str, kind: str, dtype: str, make_inputs: Callable, wrap: Callable, reference: Callable) -> OpBench:
    return quant_op(
        name,
        dtype,
        sweeps(K),
        make_inputs,
        nvfp4_bytes,
        wrap,
        reference,
        "kernels.nvfp4",
        f"{kind}_nvfp4",
        EAGER_TEMPORARIES[kind],
        EAGER_GPU_MAX_MIB,
    )


QUANTIZE = register(
    _op("nvfp4_quantize", "quantize", "bfloat16->nvfp4", quantize_inputs, _quantize_with, quantize_nvfp4)
)
DEQUANTIZE = register(
    _op("nvfp4_dequantize", "dequantize", "nvfp4->bfloat16", dequantize_inputs, _dequantize_with, dequantize_nvfp4)
)


def _sqnr_db(got: torch.Tensor, ideal: torch.Tensor) -> float:
    noise = float(((got.double() - ideal.double()) ** 2).sum())
    return float("inf") if noise == 0 else 10.0 * torch.log10(ideal.double().pow(2).sum() / noise).item()


def w13_policy_rows(rows: int = 256, k: int = 1024, seed: int = 0) -> list[dict[str, object]]:
    """SQNR of each fused w1/w3 policy for up/gate amax ratios W13_RATIOS (reference, CPU, fixed seed)."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for ratio in W13_RATIOS:
        w1 = torch.randn(rows, k, generator=gen)
        w3 = torch.randn(rows, k, generator=gen)
        w3 = w3 * (ratio * tensor_amax(w1) / tensor_amax(w3))  # amax ratio exactly `ratio`
        halves = []
        for w in (w1, w3):
            scale = DecodeScale.from_amax(tensor_amax(w))  # as ModelOpt writes weight_scale_2
            halves.append(NVFP4Tensor(*quantize_nvfp4(w, scale), scale))
        ideal = torch.cat((w1, w3))

        def dequantized(t: NVFP4Tensor) -> torch.Tensor:
            return dequantize_nvfp4(t.codes, t.scales, t.global_scale, dtype=torch.float32)

        results = {"separate": torch.cat([dequantized(h) for h in halves])}
        for policy in W13_POLICIES:
            if policy == "raise" and ratio != 1.0:
                continue
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                results[policy] = dequantized(fuse_w13(*halves, policy))
        for policy, got in results.items():
            out.append(
                {
                    "amax_ratio_up_over_gate": ratio,
                    "policy": policy,
                    "sqnr_db": _sqnr_db(got, ideal),
                    "sqnr_gate_db": _sqnr_db(got[:rows], w1),
                    "sqnr_up_db": _sqnr_db(got[rows:], w3),
                    "shape_per_half": f"[{rows}, {k}]",
                }
            )
        if ratio != 1.0:
            out.append(
                {
                    "amax_ratio_up_over_gate": ratio,
                    "policy": "raise",
                    "sqnr_db": "refused (ValueError)",
                    "sqnr_gate_db": "",
                    "sqnr_up_db": "",
                    "shape_per_half": f"[{rows}, {k}]",
                }
            )
    return out


W13_POLICIES_TABLE = register_accuracy(
    AccuracyReport(
        name="nvfp4_w13_policies",
        title="NVFP4 fused w1/w3 global-scale policies: SQNR against the unquantized weights",
        ops=("nvfp4_quantize", "nvfp4_dequantize"),
        rows=w13_policy_rows,
        note=(
            "Gate (w1) and up (w3) halves of randn weights, the up half scaled to the given amax ratio, each "
            "quantized to NVFP4 with its own global scale (DecodeScale.from_amax), then fused by "
            "`reference.quant.nvfp4_fused_w13.fuse_w13`. `separate`: each half with its own scale (the ideal). "
            "`use_w1`: vLLM's current loaders (the up half dequantizes scaled by gs_w1/gs_w3). `max_requant`: "
            "the larger global scale, the other half's E4M3 block scales re-encoded (FP4 codes untouched). "
            "Computed by the reference on the CPU, fixed seed: device-independent."
        ),
    )
)
