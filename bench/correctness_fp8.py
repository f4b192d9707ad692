"""The check of an impl that returns its output quantized for a block-FP8 GEMM, (E4M3 codes, fp32 scales per
128-wide group), against a baseline that returns the output itself: the codes times their scales must stay
within E4M3's own rounding of the baseline (3 mantissa bits: half an ulp is 2**-4 relative to a value)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from kernels.tolerances import lossy_metrics

GROUP = 128
E4M3_MAX_REL = 2.0**-4  # per value, relative to the value's group amax at worst: well under this of the peak


def dequantized(out: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    codes, scales = out
    return (codes.float().unflatten(-1, (-1, GROUP)) * scales.float()[..., None]).flatten(-2)


def fp8_groups_check(out: Any, baseline: Any) -> str:
    """'close (E4M3 groups) ...' within the bound, else 'mismatch: ...'. A baseline that returns more than the
    output (the fused add's (out, new_residual)) is compared on its first tensor."""
    baseline = baseline[0] if isinstance(baseline, tuple | list) else baseline
    metrics = lossy_metrics(dequantized(out).cpu(), baseline.float().cpu(), baseline.double().cpu())
    text = f"max_rel {metrics.max_rel:.2g} of the peak, SQNR {metrics.sqnr_db:.1f} dB"
    return f"close (E4M3 groups): {text}" if metrics.max_rel <= E4M3_MAX_REL else f"mismatch: {text}"


FP8_GROUPS_CHECK: Callable[[Any, Any], str] = fp8_groups_check
