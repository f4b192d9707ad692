"""E4M3 (float8_e4m3fn) codes to fp16, exact, for kernels that feed FP8 codes to fp16 tensor-core operands.

Every e4m3fn code is an fp16 (and a bf16), so the conversion never rounds. The codes arrive as 32-bit words
of four, decoded whole: the four results stay in the word's thread, so the conversion runs in the load's
layout before any layout change. On NVIDIA sm_90+ (`kernels._packed_ptx`) one `cvt.rn.f16x2.e4m3x2` converts
two codes; elsewhere (the interpreter, which runs no PTX) Triton's cast converts each byte. Both give the
same bits, NaN codes included.

`fp16_range` gives the powers of two that bring an operand into fp16's range before such an MMA (and back after).

Why fp16 and not bf16 for bf16 models: sm_90 has no e4m3-to-bf16 conversion. Building bf16 from the code's
bits (sign, then exponent and mantissa shifted into place, times 2**120) took 5 instructions per 2 codes
against the cvt's 1; on the H200 FP8-cache decode (batch 128 x 4096) that path reached 0.59x memcpy, most of
its instructions the conversion.
"""

from __future__ import annotations

import triton
import triton.language as tl

_WORD_TO_F16_ASM = tl.constexpr(
    """
{
.reg .b16 lo, hi;
.reg .b32 r0, r1;
mov.b32 {lo, hi}, $4;
cvt.rn.f16x2.e4m3x2 r0, lo;
cvt.rn.f16x2.e4m3x2 r1, hi;
mov.b32 {$0, $1}, r0;
mov.b32 {$2, $3}, r1;
}
"""
)


@triton.jit
def e4m3_words_to_fp16(words, PTX: tl.constexpr):
    """uint32 `words` [R, C] of four float8_e4m3fn codes each (little-endian: code 4c + j in byte j of word c)
    as fp16 [R, 4C], exact; PTX: by `cvt.rn.f16x2.e4m3x2` (NVIDIA sm_90+ only), else by Triton's cast."""
    if PTX:
        c0, c1, c2, c3 = tl.inline_asm_elementwise(
            _WORD_TO_F16_ASM, "=h,=h,=h,=h,r", [words], dtype=(tl.float16,) * 4, is_pure=True, pack=1
        )
    else:
        c0 = (words & 0xFF).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float16)
        c1 = ((words >> 8) & 0xFF).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float16)
        c2 = ((words >> 16) & 0xFF).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float16)
        c3 = (words >> 24).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float16)
    quads = tl.join(tl.join(c0, c2), tl.join(c1, c3))  # [R, C, 2, 2]: [r, c, b, a] = c_(2b + a)
    return tl.reshape(quads, [words.shape[0], words.shape[1] * 4])


@triton.jit
def fp16_range(largest):
    """(down, up): powers of two with largest * down in [2**14, 2**15) (fp16's top binade but one: a product
    of it and p <= 1 stays finite) and up = 1 / down, both fp32 normals (exponents clamped; largest 0 or
    subnormal gives down = 2**126). Multiplying by either is exact."""
    biased = tl.maximum((largest.to(tl.uint32, bitcast=True) >> 23) & 0xFF, 15)
    down = ((268 - biased) << 23).to(tl.float32, bitcast=True)
    up = ((biased - 14) << 23).to(tl.float32, bitcast=True)
    return down, up
