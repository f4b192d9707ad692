"""E4M3 (OCP FP8 "e4m3fn") scale codec, as NVFP4 stores its per-16-element block scales.

Format: 1 sign bit, 4 exponent bits (bias 7), 3 mantissa bits; no Inf; 0x7F and 0xFF are NaN. Largest
finite value 448 (0x7E), smallest normal 2**-6, smallest subnormal 2**-9 (0x01).

`encode_e4m3` rounds to nearest, ties to even, and saturates: finite values beyond +-448 and +-Inf give
+-448, NaN gives 0x7F. The clamp runs before torch's cast, so the bytes do not depend on whether the cast
itself saturates (it does from torch 2.13; earlier releases, 2.11 for one, map overflow to NaN:
NVIDIA/Model-Optimizer#1633 wrote NaN bytes into NVFP4 checkpoints that way). This is also what the
GPU's `cvt.rn.satfinite.e4m3x2.f32` computes. Values at or below half the smallest subnormal round to
signed zero.
"""

from __future__ import annotations

import torch

E4M3_MAX = 448.0
E4M3_NAN = 0x7F


def encode_e4m3(values: torch.Tensor) -> torch.Tensor:
    """float32 values -> E4M3 bytes (uint8): RNE, saturating at +-448, NaN -> 0x7F."""
    clamped = values.to(torch.float32).clamp(-E4M3_MAX, E4M3_MAX)  # clamp keeps NaN
    encoded = clamped.to(torch.float8_e4m3fn).view(torch.uint8)
    return torch.where(clamped.isnan(), torch.full_like(encoded, E4M3_NAN), encoded)


def decode_e4m3(scale_bytes: torch.Tensor) -> torch.Tensor:
    """E4M3 bytes (uint8) -> float32 values, exact; 0x7F and 0xFF decode to NaN."""
    return scale_bytes.view(torch.float8_e4m3fn).to(torch.float32)
