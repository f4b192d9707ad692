"""MXFP4 quantize / dequantize in Triton, bit-exact with `reference.quant.mxfp4` in every scale mode.

Ops: `touchstone::quantize_mxfp4(x, scale_mode) -> (codes, scales)` and
`touchstone::dequantize_mxfp4(codes, scales, dtype) -> values`; call them through
`quantize_mxfp4` / `dequantize_mxfp4` below, which have the reference's signatures.

How the kernels stay exact without a sticky bit: everything is decided on fp32 bit patterns, and the
rounding is done either by the FPU on an exact value or by integer arithmetic on the bits.
- amax is an integer max over |x|'s bits (for non-negative floats integer order is float order, and NaN
  and Inf have the largest patterns, so "amax bits >= 0x7F800000" means the block holds NaN or Inf).
- The scale byte is amax's biased exponent E minus emax_elem (2) plus a per-mode bump read off amax's
  mantissa bits M: floor never, rceil M > 0x400000 (m > 1.5), even M >= 0x600000 (m >= 1.75), ceil M != 0;
  clamped at 0, which also covers amax == 0 and fp32-subnormal amax.
- Elements: see `kernels._e2m1.e2m1_code` (one fma for v < 2, a carry on the bits for v >= 2). bf16 pairs
  are read as one 32-bit word and rounded together; the pair is exactly the two nibbles of one output byte.
- Dequantize: see `_e2m1_bits`; products are exact, saturated at the output dtype's max, NaN for 0xFF.
The kernels issue ~12 SASS instructions per element (quantize, bf16), so on the H200 they are as much
ALU- as memory-bound; the launch shapes below were swept for that.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._boundary import check_device, runs_interpreted
from kernels._e2m1 import e2m1_code, round_index
from kernels._tiles import (
    block_offsets,
    load_block_words,
    packed_fp4_outputs,
    packed_rows,
    store_block_words,
    word_rows,
)
from reference.quant.mx_scale import SCALE_MODES
from reference.quant.mxfp4 import MX_BLOCK_SIZE, check_dequantize_args, check_quantize_args

_MODE_ID = {mode: i for i, mode in enumerate(SCALE_MODES)}  # floor 0, rceil 1, even 2, ceil 3
_DTYPE_ID = {torch.bfloat16: 0, torch.float16: 1, torch.float32: 2}  # INPUT / OUTPUT constexprs

# Planted bugs for the suites' negative controls; FAULT is a constexpr, so fault 0 compiles them away.
FAULTS = {
    "none": 0,
    "drop_sticky": 1,  # E2M1-subnormal region (|v| < 1) loses the 2 bits a shifting converter drops unsticky
    "swap_nibbles": 2,  # element 2i in the high nibble
    "rceil_at_1_5": 3,  # rceil bumps at m >= 1.5 instead of m > 1.5
}

# Launch shapes: (blocks of 32 elements per tile, tiles per program, warps per program), measured on the
# H200 at 1 GiB of input by `python -m bench.quant.mxfp4_launch_sweep` (fraction of a same-run memcpy):
# - quantize bf16: (64, 8, 2) 0.918x; (32, 8, 1) 0.917x; (128, 1, 1) 0.895x; (64, 1, 2) 0.823x. Several tiles
#   per program let a warp's next loads fly while its ALUs round the current tile (~12 SASS ops/element).
# - quantize fp32 (swept with one tile per program): (64, 1, 4) 0.957x,
#   (128, 1, 1) 0.849x (64-bit words: fewer elements per register). fp16 reuses the bf16 shape, unswept.
# - dequantize: (64, 1, 2) 0.959x; (128, 1, 4) 0.950x; (32, 1, 1) 0.917x.
_QUANTIZE_GPU = {torch.bfloat16: (64, 8, 2), torch.float16: (64, 8, 2), torch.float32: (64, 1, 4)}
_DEQUANTIZE_GPU = (64, 1, 2)
# The interpreter costs ~1 ms per program whatever its size: few, large programs, one tile each.
_INTERPRETER = (2048, 1, 1)


@triton.jit
def _quantize_mxfp4_kernel(
    x_ptr,
    codes_ptr,
    scales_ptr,
    n_blocks,
    blocks_per_row,
    x_row_stride,
    BLOCKS: tl.constexpr,
    TILES: tl.constexpr,
    INPUT: tl.constexpr,
    SCALE_MODE: tl.constexpr,
    CONTIGUOUS: tl.constexpr,
    FAULT: tl.constexpr,
):
    # Each program quantizes TILES consecutive tiles of BLOCKS blocks, loading tile t + 1 before it
    # computes tile t, so every warp keeps a tile's loads in flight while its ALUs work.
    block = tl.program_id(0).to(tl.int64) * (BLOCKS * TILES) + tl.arange(0, BLOCKS)
    words = load_block_words(x_ptr, block, n_blocks, blocks_per_row, x_row_stride, 16, CONTIGUOUS)
    for _ in range(TILES - 1):
        next_words = load_block_words(x_ptr, block + BLOCKS, n_blocks, blocks_per_row, x_row_stride, 16, CONTIGUOUS)
        _quantize_tile(words, block, n_blocks, codes_ptr, scales_ptr, INPUT, SCALE_MODE, FAULT)
        block += BLOCKS
        words = next_words
    _quantize_tile(words, block, n_blocks, codes_ptr, scales_ptr, INPUT, SCALE_MODE, FAULT)


@triton.jit
def _quantize_tile(
    words, block, n_blocks, codes_ptr, scales_ptr, INPUT: tl.constexpr, SCALE_MODE: tl.constexpr, FAULT: tl.constexpr
):
    # INPUT 0: bf16, 1: fp16, 2: fp32.
    in_range = block < n_blocks
    if INPUT == 0:
        words = words.to(tl.uint32, bitcast=True)
        pair_magnitude = words & 0x7FFF7FFF
        low = pair_magnitude << 16  # bf16 -> fp32 bits is exactly a 16-bit shift
        high = pair_magnitude & 0xFFFF0000
    elif INPUT == 1:
        words = words.to(tl.uint32, bitcast=True)
        low = (words & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32).to(tl.uint32, bitcast=True)
        high = (words >> 16).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32).to(tl.uint32, bitcast=True)
        low_sign, high_sign = (low >> 28) & 0x8, (high >> 28) & 0x8
        low, high = low & 0x7FFFFFFF, high & 0x7FFFFFFF
    else:
        words = words.to(tl.uint64, bitcast=True)
        low = (words & 0xFFFFFFFF).to(tl.uint32)
        high = (words >> 32).to(tl.uint32)
        low_sign, high_sign = (low >> 28) & 0x8, (high >> 28) & 0x8
        low, high = low & 0x7FFFFFFF, high & 0x7FFFFFFF

    # amax as an integer max over |x|'s bits; NaN and Inf have the largest patterns.
    amax_bits = tl.max(tl.maximum(low, high), axis=1)
    biased_exp = (amax_bits >> 23).to(tl.int32)
    mantissa = amax_bits & 0x7FFFFF
    if SCALE_MODE == 0:
        bump = tl.zeros_like(biased_exp)
    elif SCALE_MODE == 1:
        if FAULT == 3:
            bump = (mantissa >= 0x400000).to(tl.int32)
        else:
            bump = (mantissa > 0x400000).to(tl.int32)
    elif SCALE_MODE == 2:
        bump = (mantissa >= 0x600000).to(tl.int32)
    else:
        bump = (mantissa != 0).to(tl.int32)
    not_finite = amax_bits >= 0x7F800000
    scale = tl.maximum(biased_exp - 2 + bump, 0)  # E8M0 byte; < 255 for every finite amax
    e = tl.minimum(scale, 253) - 127  # unbiased exponent (clamped for NaN blocks, whose codes are zeroed)
    scale = tl.where(not_finite, 255, scale)
    inv_scale = ((127 - e).to(tl.uint32) << 23).to(tl.float32, bitcast=True)[:, None]
    rebias = ((126 + e) << 1).to(tl.uint32)[:, None]
    large_from = ((128 + e) << 23).to(tl.uint32)[:, None]

    if FAULT == 1:  # the E2M1-subnormal region loses the 2 bits a shifting converter drops without a sticky bit
        low = tl.where(low < large_from - 0x800000, low & 0xFFFFFFFC, low)
        high = tl.where(high < large_from - 0x800000, high & 0xFFFFFFFC, high)
    if INPUT == 0:
        # Both bf16 halves rounded to 1 significand bit in one 32-bit add (no carry crosses a half: each
        # half is below 0x8000 + 0x20); the high half's index is then bits 31:22, the low half's 15:6.
        pair_rounded = pair_magnitude + 0x001F001F + ((pair_magnitude >> 6) & 0x00010001)
        low_index = (pair_rounded << 16) >> 22
        high_index = pair_rounded >> 22
        # Sign bits 15 and 31 of the word land on bits 3 and 7 of the product's high word (above: junk).
        signs = tl.umulhi(words & 0x80008000, 0x00100100)
    else:
        low_index = round_index(low)
        high_index = round_index(high)
        signs = low_sign | (high_sign << 4)
    code_low = e2m1_code(low, low_index, inv_scale, rebias, large_from)
    code_high = e2m1_code(high, high_index, inv_scale, rebias, large_from)
    if FAULT == 2:
        code_low, code_high = code_high, code_low
    # A multiply-add packs the pair: the small path's junk bits sit above bit 21, so they never reach the
    # low byte, which is all the uint8 conversion keeps.
    keep = tl.where(not_finite, 0, 0xFF).to(tl.uint32)[:, None]  # NaN/Inf blocks: all codes 0
    packed = (((code_low + code_high * 16) | signs) & keep).to(tl.uint8)
    tl.store(codes_ptr + block[:, None] * 16 + tl.arange(0, 16)[None, :], packed, mask=in_range[:, None])
    tl.store(scales_ptr + block, scale.to(tl.uint8), mask=in_range)


@triton.jit
def _e2m1_bits(code, scale_value, OUTPUT: tl.constexpr):
    """E2M1 codes [B, 16] (uint32, one nibble) times scale_value [B] -> output-dtype bit patterns (uint32).

    Placing a code's 3 magnitude bits at fp32 bits 24:22 gives exponent field e and mantissa bit m, so the
    fp32 value is (1 + m/2) * 2**(e - 127), or m * 2**-127 for e = 0: exactly the E2M1 value times 2**-126,
    subnormal case included. Two exact multiplies (2**126, then the block scale) finish the magnitude, one
    min() saturates it (MX has no Inf), and the sign bit is ORed in last.
    """
    magnitude = ((code & 0x7) << 22).to(tl.float32, bitcast=True) * 8.507059173023462e37 * scale_value[:, None]
    if OUTPUT == 0:
        magnitude = tl.minimum(magnitude, 3.3895313892515355e38)  # bfloat16 max
        # Every product (3 significant bits, exponent inside bf16's range once clamped) is a bf16 value, so
        # narrowing is exactly dropping the low 16 bits; no rounding mode is involved.
        return (magnitude.to(tl.uint32, bitcast=True) >> 16) | ((code & 0x8) << 12)
    elif OUTPUT == 1:
        magnitude = tl.minimum(magnitude, 65504.0)
        return magnitude.to(tl.float16).to(tl.uint16, bitcast=True).to(tl.uint32) | ((code & 0x8) << 12)
    else:
        magnitude = tl.minimum(magnitude, 3.4028234663852886e38)
        return magnitude.to(tl.uint32, bitcast=True) | ((code & 0x8) << 28)


@triton.jit
def _dequantize_mxfp4_kernel(
    codes_ptr,
    scales_ptr,
    out_ptr,
    n_blocks,
    blocks_per_row,
    codes_row_stride,
    scales_row_stride,
    BLOCKS: tl.constexpr,
    OUTPUT: tl.constexpr,
    CONTIGUOUS: tl.constexpr,
    PREPARED: tl.constexpr = False,
):
    # The output is written as words holding one element pair: OUTPUT 0 bf16 / 1 fp16 pairs in int32
    # words, 2 fp32 pairs in int64 words; word j of a block is exactly code byte j's two nibbles, or, for codes
    # in the W4A16 GEMM's prepared layout (PREPARED, `kernels.w4a16_mxfp4_layout`), where code bytes 4t .. 4t + 3
    # hold elements 8t + (0, 2), (4, 6), (1, 3), (5, 7), pairs of same-nibble values two bytes apart.
    block = tl.program_id(0).to(tl.int64) * BLOCKS + tl.arange(0, BLOCKS)
    in_range = block < n_blocks
    code_offset = block_offsets(block, blocks_per_row, codes_row_stride, 16, CONTIGUOUS)
    scale_offset = block_offsets(block, blocks_per_row, scales_row_stride, 1, CONTIGUOUS)
    packed = tl.load(codes_ptr + code_offset[:, None] + tl.arange(0, 16)[None, :], mask=in_range[:, None], other=0)
    packed = packed.to(tl.uint32)
    scale = tl.load(scales_ptr + scale_offset, mask=in_range, other=0).to(tl.uint32)
    # E8M0 byte s -> 2**(s - 127); byte 0 is the fp32 subnormal 2**-127; 0xFF handled below.
    scale_value = tl.where(scale == 0, 0x00400000, tl.minimum(scale, 254) << 23).to(tl.uint32)
    scale_value = scale_value.to(tl.float32, bitcast=True)
    low = _e2m1_bits(packed & 0xF, scale_value, OUTPUT)
    high = _e2m1_bits(packed >> 4, scale_value, OUTPUT)
    if PREPARED:
        # [block, word t, byte b // 2, byte b % 2, nibble] -> word 4t + q holds byte (q // 2) and byte (q // 2) + 2
        # of word t, nibble q % 2 of each.
        both = tl.join(tl.reshape(low, [BLOCKS, 4, 2, 2]), tl.reshape(high, [BLOCKS, 4, 2, 2]))
        low, high = tl.split(tl.permute(both, [0, 1, 3, 4, 2]))
        low, high = tl.reshape(low, [BLOCKS, 16]), tl.reshape(high, [BLOCKS, 16])
    nan_block = (scale == 255)[:, None]
    store_block_words(out_ptr, block, in_range, low, high, nan_block, 16, OUTPUT)


def launch_quantize(x: torch.Tensor, scale_mode: str, fault: str = "none"):
    """Validate, allocate and launch; `fault` plants a named bug (negative controls only)."""
    check_quantize_args(x, scale_mode)
    check_device(x=x)
    rows, codes, scales, n_blocks = packed_fp4_outputs(x, MX_BLOCK_SIZE)
    k = x.shape[-1]
    if n_blocks:
        words = word_rows(rows)
        blocks, tiles, warps = _INTERPRETER if runs_interpreted(x.device) else _QUANTIZE_GPU[x.dtype]
        _quantize_mxfp4_kernel[(triton.cdiv(n_blocks, blocks * tiles),)](
            words,
            codes,
            scales,
            n_blocks,
            k // MX_BLOCK_SIZE,
            words.stride(0),
            BLOCKS=blocks,
            TILES=tiles,
            INPUT=_DTYPE_ID[x.dtype],
            SCALE_MODE=_MODE_ID[scale_mode],
            CONTIGUOUS=rows.shape[0] == 1 or words.stride(0) == k // 2,
            FAULT=FAULTS[fault],
            num_warps=warps,
        )
    return codes, scales


def launch_dequantize(codes: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype, prepared: bool = False):
    """Validate, allocate and launch; `prepared`: the codes are in `kernels.w4a16_mxfp4_layout`'s layout."""
    check_dequantize_args(codes, scales, dtype)
    check_device(codes=codes, scales=scales)
    code_rows, scale_rows, contiguous = packed_rows(codes, scales)
    blocks_per_row = scales.shape[-1]
    out = torch.empty(*codes.shape[:-1], codes.shape[-1] * 2, dtype=dtype, device=codes.device)
    n_blocks = scale_rows.shape[0] * blocks_per_row
    if n_blocks:
        blocks, _, warps = _INTERPRETER if runs_interpreted(codes.device) else _DEQUANTIZE_GPU
        _dequantize_mxfp4_kernel[(triton.cdiv(n_blocks, blocks),)](
            code_rows,
            scale_rows,
            word_rows(out.view(-1, out.shape[-1])),
            n_blocks,
            blocks_per_row,
            code_rows.stride(0),
            scale_rows.stride(0),
            BLOCKS=blocks,
            OUTPUT=_DTYPE_ID[dtype],
            CONTIGUOUS=contiguous,
            PREPARED=prepared,
            num_warps=warps,
        )
    return out


@torch.library.custom_op("touchstone::quantize_mxfp4", mutates_args=())
def _quantize_op(x: torch.Tensor, scale_mode: str) -> tuple[torch.Tensor, torch.Tensor]:
    return launch_quantize(x, scale_mode)


@_quantize_op.register_fake
def _(x, scale_mode):
    check_quantize_args(x, scale_mode)
    k = x.shape[-1]
    return (
        x.new_empty(*x.shape[:-1], k // 2, dtype=torch.uint8),
        x.new_empty(*x.shape[:-1], k // MX_BLOCK_SIZE, dtype=torch.uint8),
    )


@torch.library.custom_op("touchstone::dequantize_mxfp4", mutates_args=())
def _dequantize_op(codes: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return launch_dequantize(codes, scales, dtype)


@_dequantize_op.register_fake
def _dequantize_fake(codes, scales, dtype):
    check_dequantize_args(codes, scales, dtype)
    return codes.new_empty(*codes.shape[:-1], codes.shape[-1] * 2, dtype=dtype)


@torch.library.custom_op("touchstone::dequantize_mxfp4_prepared", mutates_args=())
def _dequantize_prepared_op(codes: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return launch_dequantize(codes, scales, dtype, prepared=True)


_dequantize_prepared_op.register_fake(_dequantize_fake)


def quantize_mxfp4(x: torch.Tensor, *, scale_mode: str = "floor") -> tuple[torch.Tensor, torch.Tensor]:
    """Kernel twin of `reference.quant.mxfp4.quantize_mxfp4` (same arguments, same bytes)."""
    return torch.ops.touchstone.quantize_mxfp4(x, scale_mode)


def dequantize_mxfp4(codes: torch.Tensor, scales: torch.Tensor, *, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """Kernel twin of `reference.quant.mxfp4.dequantize_mxfp4`."""
    return torch.ops.touchstone.dequantize_mxfp4(codes, scales, dtype)


def dequantize_mxfp4_prepared(
    codes: torch.Tensor, scales: torch.Tensor, *, dtype: torch.dtype = torch.bfloat16
) -> torch.Tensor:
    """`dequantize_mxfp4` of codes in the W4A16 GEMM's prepared layout (`kernels.w4a16_mxfp4_layout`): the same
    values as `dequantize_mxfp4(interchange_codes(codes), scales)`."""
    return torch.ops.touchstone.dequantize_mxfp4_prepared(codes, scales, dtype)
