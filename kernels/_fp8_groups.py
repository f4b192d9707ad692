"""E4M3 group quantization of values a kernel already holds in registers, bit for bit
`reference.quant.fp8.quantize_fp8(granularity="group", fmt="e4m3fn")`: the tail of `kernels.fp8_quant`'s
kernel, shared with the kernels that quantize what they produce (RMSNorm, SiLU-and-mul) for a block-FP8 GEMM and
with the MoE grouped GEMM that quantizes what it loads (`kernels.moe_gemm`).

- amax: an integer max over |x|'s fp32 bits (NaN has the largest pattern, so it propagates, as in torch),
  clamped below at eps's bits;
- scale = amax / 448 and its reciprocal: IEEE divisions (`tl.div_rn`), as the reference spells them;
- codes: x * reciprocal converted by the hardware (`cvt.rn.satfinite.e4m3x2.f32` on sm_90: RNE, saturating at
  448, NaN to 0x7F), which equals the reference's clamp-then-RNE.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def group_scale(amax_bits, eps_bits, FP8_MAX: tl.constexpr):
    """fp32 scale of groups whose amax is `amax_bits` (|x|'s fp32 bits, int32): max(amax, eps) / FP8_MAX."""
    return tl.div_rn(tl.maximum(amax_bits, eps_bits).to(tl.float32, bitcast=True), FP8_MAX)


@triton.jit
def row_scales(x, eps_bits):
    """fp32 [G] scales of x fp32 [G, GROUP], one group a row (pad lanes 0): max(amax, eps) / 448."""
    return group_scale(tl.max(x.to(tl.int32, bitcast=True) & 0x7FFFFFFF, axis=1), eps_bits, 448.0)


@triton.jit
def e4m3fn_codes(x, scale):
    """x fp32 [G, GROUP] times the reciprocal of its rows' scales [G], as E4M3 (tl.float8e4nv)."""
    recip = tl.div_rn(tl.full(scale.shape, 1.0, tl.float32), scale)
    return (x * recip[:, None]).to(tl.float8e4nv)


@triton.jit
def e4m3fn_groups(x, eps_bits):
    """x fp32 [G, GROUP], one group a row (pad lanes 0) -> (e4m3fn codes as uint8 [G, GROUP], scales fp32 [G])."""
    scale = row_scales(x, eps_bits)
    return e4m3fn_codes(x, scale).to(tl.uint8, bitcast=True), scale
