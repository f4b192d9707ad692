"""Fusing the gate (w1) and up (w3) projections of an NVFP4 MoE expert into one w13 tensor, one global scale.

Checkpoints quantize w1 and w3 separately (ModelOpt, compressed-tensors), so each half carries its own
global scale; fused MoE kernels take one per expert. What to do when they differ is a named policy:
- "raise": refuse (ValueError naming both scales).
- "use_w1" (default, the established convention): keep w1's global scale for both halves and warn, as
  vLLM's compressed-tensors and ModelOpt NVFP4 MoE loaders do ("w1_weight_global_scale must match
  w3_weight_global_scale. Accuracy may be affected."). w3's values come out scaled by s_dec1 / s_dec3:
  vLLM issue #54974 (a GLM-5.3-Flash NVFP4 checkpoint: 69% of gate/up pairs mismatched, ratios up to 10x).
- "max_requant": keep the larger decode scale s_dec = max(s_dec1, s_dec3) (the larger amax) and re-encode
  the other half's E4M3 block scales onto it: byte' = e4m3_rne_satfinite(fp32(e4m3(byte) * fp32(s_half /
  s_dec))), factor <= 1; the FP4 codes are untouched (vLLM PRs #55073 and #56095; vLLM's FP8 per-tensor MoE
  loader already does this: "Use the max to requantize"). Costs one E4M3 rounding per rescaled block (and
  blocks whose scale falls below half of 2**-9 become zero); NaN scale bytes stay NaN.
Equal global scales (same decode value, bit for bit) fuse identically under every policy, without a
warning. Halves are stacked along the rows: w13 = [w1; w3] ([2N, K//2] codes, [2N, K//16] scales), the
layout of vLLM's w13 weights.
"""

from __future__ import annotations

import dataclasses
import warnings

import torch

from reference.formats.e4m3 import decode_e4m3, encode_e4m3
from reference.quant.nvfp4_global_scale import DecodeScale, GlobalScale, decode_value

W13_POLICIES = ("raise", "use_w1", "max_requant")
DEFAULT_W13_POLICY = "use_w1"


class W13ScaleMismatchWarning(UserWarning):
    """w1 and w3 carry different global scales and the fused tensor uses w1's for both."""


@dataclasses.dataclass(frozen=True, eq=False)
class NVFP4Tensor:
    """An NVFP4-quantized matrix: codes uint8 [N, K//2], row-major E4M3 scales uint8 [N, K//16], global scale."""

    codes: torch.Tensor
    scales: torch.Tensor
    global_scale: GlobalScale


def rescale_block_scales(scales: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """E4M3 bytes times an fp32 factor, re-encoded with RNE (saturating; NaN stays 0x7F)."""
    return encode_e4m3(decode_e4m3(scales) * factor)


def fuse_w13(w1: NVFP4Tensor, w3: NVFP4Tensor, policy: str = DEFAULT_W13_POLICY) -> NVFP4Tensor:
    """Stack gate and up halves into one NVFP4 tensor with one global scale (a `DecodeScale`)."""
    if policy not in W13_POLICIES:
        raise ValueError(f"policy must be one of {W13_POLICIES}, got {policy!r}")
    for name, half in (("w1", w1), ("w3", w3)):
        if not isinstance(half, NVFP4Tensor):
            raise TypeError(f"{name}: must be an NVFP4Tensor, got {type(half).__name__}")
    if w1.codes.shape[1:] != w3.codes.shape[1:] or w1.scales.shape[1:] != w3.scales.shape[1:]:
        raise ValueError(f"w1 {tuple(w1.codes.shape)} and w3 {tuple(w3.codes.shape)}: halves must share K")
    s1, s3 = decode_value(w1.global_scale, "w1.global_scale"), decode_value(w3.global_scale, "w3.global_scale")
    codes = torch.cat((w1.codes, w3.codes))
    if bool(torch.equal(s1.view(torch.int32), s3.view(torch.int32))) or policy == "use_w1":
        if policy == "use_w1" and not torch.equal(s1.view(torch.int32), s3.view(torch.int32)):
            warnings.warn(
                f"w1 global scale (decode {float(s1):.6g}) differs from w3's ({float(s3):.6g}); using "
                f"w1's for both halves: w3 dequantizes scaled by {float(s1 / s3):.4g}. Accuracy may be "
                f"affected (policy 'max_requant' re-encodes instead).",
                W13ScaleMismatchWarning,
                stacklevel=2,
            )
        return NVFP4Tensor(codes, torch.cat((w1.scales, w3.scales)), DecodeScale(s1))
    if policy == "raise":
        raise ValueError(
            f"w1.global_scale (decode {float(s1):.6g}) and w3.global_scale (decode {float(s3):.6g}) "
            f"differ; policy 'raise' refuses to fuse them"
        )
    shared = torch.maximum(s1, s3)
    scales = [
        half.scales if bool(s == shared) else rescale_block_scales(half.scales, s / shared)
        for half, s in ((w1, s1), (w3, s3))
    ]
    return NVFP4Tensor(codes, torch.cat(scales), DecodeScale(shared))
