"""E8M0 scale codec (OCP MX v1.0 section 5.4.1): an unsigned power of two.

Byte b encodes 2**(b - 127) for b in 0..254 (byte 0 is 2**-127, an fp32 subnormal; there is no zero) and
byte 0xFF encodes NaN. There is no sign and no infinity.
"""

from __future__ import annotations

import torch

E8M0_BIAS = 127
E8M0_NAN = 0xFF
E8M0_MIN_EXPONENT = -127
E8M0_MAX_EXPONENT = 127


def decode_e8m0(scale_bytes: torch.Tensor) -> torch.Tensor:
    """uint8 bytes -> float32 scales (2**(b-127), exact; 0xFF -> NaN)."""
    exponent = scale_bytes.to(torch.int32) - E8M0_BIAS
    value = torch.ldexp(torch.ones_like(exponent, dtype=torch.float64), exponent).to(torch.float32)
    return torch.where(scale_bytes == E8M0_NAN, torch.full_like(value, float("nan")), value)
