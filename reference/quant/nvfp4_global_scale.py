"""NVFP4 per-tensor global scales, with the convention in the type: `EncodeScale` or `DecodeScale`.

NVFP4 scales twice: an fp32 global scale per tensor and an E4M3 scale per 16 elements. Two conventions
for the global scale are in use, and mixing them up is the most common NVFP4 porting bug (the tensor
comes out scaled by amax**2 / 2688**2, or its inverse):
- encode scale s_enc = 448 * 6 / amax (multiply to encode): vLLM, flashinfer, compressed-tensors
  `*_global_scale` checkpoints;
- decode scale s_dec = amax / (448 * 6) = 1 / s_enc (multiply to decode): ModelOpt `weight_scale_2`,
  torchao `per_tensor_scale`.
A bare float or tensor says neither, so the NVFP4 functions refuse one (`TypeError`); wrap it in the type
that names its convention. Conversions are explicit and cost one IEEE fp32 division: `to_decode()` is
fp32(1 / s_enc) and `to_encode()` fp32(1 / s_dec). A round trip returns the starting value or one of its
fp32 neighbours (the two reciprocals round independently); it is exact for powers of two.

Every division here is tensor / tensor: torch evaluates `scalar / tensor` as reciprocal(tensor) * scalar,
two roundings. Values are 0-dim float32 tensors (kept on their device: building or converting a scale never syncs).
The NVFP4 ops are specified for global scales with s_enc in [2**-126, 2**118] (s_dec in [2**-118, 2**126]),
where no per-block product or quotient overflows; `from_amax` always lands there: it clamps amax to
[AMAX_FLOOR, fp32 max] first, so an all-zero tensor gets a finite scale (and quantizes to zero blocks),
and propagates NaN.
"""

from __future__ import annotations

import dataclasses

import torch

from reference.formats.e2m1 import E2M1_MAX
from reference.formats.e4m3 import E4M3_MAX

# 448 * 6 = 2688: the global amax maps onto the largest block scale times the largest element.
GLOBAL_RANGE = E4M3_MAX * E2M1_MAX
# Smallest amax `from_amax` uses: 2688 / 2**-100 < 2**112 keeps s_enc inside the specified range.
AMAX_FLOOR = 2.0**-100
FP32_MAX = torch.finfo(torch.float32).max


def _as_scalar(value: torch.Tensor | float, kind: str) -> torch.Tensor:
    if isinstance(value, float | int) and not isinstance(value, bool):
        return torch.tensor(float(value), dtype=torch.float32)
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{kind}: value must be a float or a float32 tensor, got {type(value).__name__}")
    if value.dtype != torch.float32 or value.numel() != 1:
        raise TypeError(
            f"{kind}: value must be a one-element float32 tensor, got {value.dtype} with {value.numel()} elements"
        )
    return value.reshape(())


def _clamped_amax(amax: torch.Tensor | float) -> torch.Tensor:
    amax = torch.as_tensor(amax, dtype=torch.float32).reshape(())
    return amax.clamp(AMAX_FLOOR, FP32_MAX)  # clamp keeps NaN


@dataclasses.dataclass(frozen=True, eq=False)
class EncodeScale:
    """s_enc = 448 * 6 / amax: quantize multiplies by it (vLLM, flashinfer, compressed-tensors)."""

    value: torch.Tensor

    def __post_init__(self) -> None:
        object.__setattr__(self, "value", _as_scalar(self.value, "EncodeScale"))

    @classmethod
    def from_amax(cls, amax: torch.Tensor | float) -> EncodeScale:
        """fp32(2688 / amax), amax clamped to [AMAX_FLOOR, fp32 max]."""
        amax = _clamped_amax(amax)
        return cls(amax.new_tensor(GLOBAL_RANGE) / amax)  # tensor / tensor: `2688 / t` is reciprocal(t) * 2688

    def to_encode(self) -> EncodeScale:
        return self

    def to_decode(self) -> DecodeScale:
        return DecodeScale(torch.ones_like(self.value) / self.value)

    def to(self, device: torch.device | str) -> EncodeScale:
        return EncodeScale(self.value.to(device))


@dataclasses.dataclass(frozen=True, eq=False)
class DecodeScale:
    """s_dec = amax / (448 * 6): dequantize multiplies by it (ModelOpt `weight_scale_2`, torchao)."""

    value: torch.Tensor

    def __post_init__(self) -> None:
        object.__setattr__(self, "value", _as_scalar(self.value, "DecodeScale"))

    @classmethod
    def from_amax(cls, amax: torch.Tensor | float) -> DecodeScale:
        """fp32(amax / 2688), amax clamped as in `EncodeScale.from_amax` (ModelOpt's weights_scaling_factor_2)."""
        return cls(_clamped_amax(amax) / GLOBAL_RANGE)

    def to_encode(self) -> EncodeScale:
        return EncodeScale(torch.ones_like(self.value) / self.value)

    def to_decode(self) -> DecodeScale:
        return self

    def to(self, device: torch.device | str) -> DecodeScale:
        return DecodeScale(self.value.to(device))


GlobalScale = EncodeScale | DecodeScale


def tensor_amax(x: torch.Tensor) -> torch.Tensor:
    """max |x| as a 0-dim float32 tensor (NaN if x holds one): the input of `from_amax`."""
    return x.detach().abs().amax().to(torch.float32)


def _require(scale: object, argument: str) -> GlobalScale:
    if not isinstance(scale, EncodeScale | DecodeScale):
        raise TypeError(
            f"{argument}: must be an EncodeScale (448*6/amax, vLLM/compressed-tensors) or a DecodeScale "
            f"(amax/(448*6), ModelOpt/torchao), got {type(scale).__name__}; a bare value does not say which"
        )
    return scale


def encode_value(scale: GlobalScale, argument: str = "global_scale") -> torch.Tensor:
    """The encode scale s_enc (0-dim float32 tensor) of either convention."""
    return _require(scale, argument).to_encode().value


def decode_value(scale: GlobalScale, argument: str = "global_scale") -> torch.Tensor:
    """The decode scale s_dec (0-dim float32 tensor) of either convention."""
    return _require(scale, argument).to_decode().value
