"""Triton helpers on `kernels.mxfp4_fragment_layout`'s prepared words for the kernels that read them by row and
K (`kernels.w4a16_mxfp4_fragment_gemm`, `kernels.mxfp4_fragment_dequantize`); no launch of their own.

A word and its block's bf16 scale give four bf16x2 registers, elements 2i and 2i + 1 of the word in register i:
the E2M1 values times the scale, exact (powers of two; the contract's scale bytes 253 and 254 aside). Where the
packed PTX runs (NVIDIA sm_90+) the layout's own decode text does it (`decode_block_ptx(scaled=True)`); elsewhere
(the interpreter, ROCm, older GPUs) the same rotations and masks in Triton integer ops and an fp32 multiply do,
giving the same bytes (NaN payloads aside).
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernels import mxfp4_fragment_layout as layout

SCALED_DECODE = tl.constexpr(layout.decode_block_ptx(scaled=True))
MASK = tl.constexpr(layout.MASK)
R3_LOW_MASK = tl.constexpr(layout.R3_LOW_MASK)
R3_REST_MASK = tl.constexpr(layout.MASK & ~layout.R3_LOW_MASK)
R1_ROTATION = tl.constexpr(layout.ROTATIONS[1])
R2_ROTATION = tl.constexpr(layout.ROTATIONS[2])
R3_LOW_ROTATION = tl.constexpr(layout.R3_LOW_ROTATION)
R3_REST_ROTATION = tl.constexpr(layout.R3_REST_ROTATION)
TWO_126 = tl.constexpr(8.507059173023462e37)


@triton.jit
def _rotr(u, R: tl.constexpr):
    return (u >> R) | (u << (32 - R))


@triton.jit
def _swap_halves(reg):
    u = reg.to(tl.uint32, bitcast=True)
    return ((u >> 16) | (u << 16)).to(tl.int32, bitcast=True)


@triton.jit
def _scaled_register(reg, scale):
    """A decoded register (uint32: two bf16 E2M1 values * 2**-126) times fp32 `scale`, back as bf16x2 (exact)."""
    low = ((reg & 0xFFFF) << 16).to(tl.float32, bitcast=True) * TWO_126 * scale
    high = (reg & 0xFFFF0000).to(tl.float32, bitcast=True) * TWO_126 * scale
    return ((low.to(tl.uint32, bitcast=True) >> 16) | (high.to(tl.uint32, bitcast=True) & 0xFFFF0000)).to(
        tl.int32, bitcast=True
    )


@triton.jit
def fragment_registers(words, scale_bits, PTX: tl.constexpr):
    """Prepared words (int32) and their blocks' scales as bf16 bits (int32, 0 .. 0xFFFF), same shape -> (R0, R1, R2,
    R3) int32, register i = elements 2i (low half) and 2i + 1 (high) of each word, bf16, times the scale."""
    if PTX:
        pair = scale_bits | (scale_bits << 16)
        return tl.inline_asm_elementwise(
            SCALED_DECODE, "=r,=r,=r,=r,r,r", [words, pair], dtype=(tl.int32,) * 4, is_pure=True, pack=1
        )
    u = words.to(tl.uint32, bitcast=True)
    scale = (scale_bits.to(tl.uint32) << 16).to(tl.float32, bitcast=True)
    r0 = u & MASK
    r1 = _rotr(u, R1_ROTATION) & MASK
    r2 = _rotr(u, R2_ROTATION) & MASK
    r3 = (_rotr(u, R3_LOW_ROTATION) & R3_LOW_MASK) | (_rotr(u, R3_REST_ROTATION) & R3_REST_MASK)
    return (
        _scaled_register(r0, scale),
        _scaled_register(r1, scale),
        _scaled_register(r2, scale),
        _scaled_register(r3, scale),
    )


@triton.jit
def stacked_registers(r0, r1, r2, r3):
    """Four register tensors [...] -> [..., 2, 2], R0 .. R3 in order when the last two dims are flattened."""
    return tl.join(tl.join(r0, r2), tl.join(r1, r3))


@triton.jit
def fragment_tile(
    words_ptr, pairs_ptr, row_tile, tile, n_steps, GROUPS: tl.constexpr, FAULT: tl.constexpr, PTX: tl.constexpr
):
    """K tile `tile` (GROUPS MX blocks, GROUPS even: GROUPS / 2 steps) of the row tiles `row_tile` ([T] int64) as one
    bf16 [16 T, GROUPS * 32] tile, row 16 t + r of it row 16 row_tile[t] + r of W, K in `fragment_k_order`. That
    order puts each lane's decoded registers where the tensor-core A operand wants them (lane 4 g + c: rows g and
    g + 8, columns 2c, 2c + 1, 2c + 8, 2c + 9 of each 16-column slab), so a lane's own 16 bytes of a step become its
    operand with no exchange between lanes. Steps past the end read as code 0 with scale 0 (zeros). FAULT (the
    W4A16 GEMM's planted bugs): 1 a block scaled by the next block's scale (the last keeps its own), 2 each
    register's halves exchanged, 3 the next block's scale with no clamp (the last row tile reads past the end)."""
    S: tl.constexpr = GROUPS // 2
    T: tl.constexpr = row_tile.shape[0]
    j = tl.arange(0, S * 128)  # (step, lane g c, word b h): a row tile's words of the S steps, in memory order
    step = tile * S + j // 128
    live = step < n_steps
    at = (row_tile[:, None] * n_steps + tl.where(live, step, 0)[None, :]) * 128 + (j % 128)[None, :]
    words = tl.load(words_ptr + at, mask=live[None, :], other=0)
    q = tl.arange(0, S * 16)  # (step, g, block b): one scale pair (rows g, g + 8) a block
    block = (tile * S + q // 16) * 2 + q % 2
    if FAULT == 1:
        block = tl.minimum(block + 1, 2 * n_steps - 1)
    if FAULT == 3:
        block = block + 1
    scale_live = (tile * S + q // 16) < n_steps
    scale_step = tl.where(scale_live, block // 2, 0)
    pair_at = ((row_tile[:, None] * n_steps + scale_step[None, :]) * 8 + ((q // 2) % 8)[None, :]) * 2 + (block % 2)
    pairs = tl.load(pairs_ptr + pair_at, mask=scale_live[None, :], other=0)
    halves = tl.reshape(tl.join(pairs & 0xFFFF, (pairs >> 16) & 0xFFFF), [T, S, 8, 1, 2, 2])  # (.., g, c, b, h)
    scale_bits = tl.reshape(tl.broadcast_to(halves, [T, S, 8, 4, 2, 2]), [T, S * 128])
    r0, r1, r2, r3 = fragment_registers(words, scale_bits, PTX)
    if FAULT == 2:
        r0, r1, r2, r3 = _swap_halves(r0), _swap_halves(r1), _swap_halves(r2), _swap_halves(r3)
    regs = tl.reshape(stacked_registers(r0, r1, r2, r3), [T, S, 8, 4, 2, 2, 2, 2])  # (t, step, g, c, b, h, i1, i0)
    regs = tl.reshape(tl.permute(regs, (0, 5, 2, 1, 4, 6, 7, 3)), [16 * T, S * 32]).to(tl.uint32, bitcast=True)
    elements = tl.join((regs & 0xFFFF).to(tl.uint16), (regs >> 16).to(tl.uint16))
    return tl.reshape(elements, [16 * T, S * 64]).to(tl.bfloat16, bitcast=True)


@triton.jit
def fragment_k_order(BK: tl.constexpr):
    """The K index, within a tile of BK (a multiple of 64), of each column of `fragment_tile`'s tiles: column
    (step, block b, i1, i0, c, bit) holds element e = 4 i1 + 2 i0 + bit of lane column c's word of block b, K index
    64 step + 32 b + 8 c + e."""
    i = tl.arange(0, BK)
    return (i // 64) * 64 + ((i // 32) % 2) * 32 + ((i // 2) % 4) * 8 + ((i // 16) % 2) * 4 + ((i // 8) % 2) * 2 + i % 2
