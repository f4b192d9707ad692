"""NVFP4 quantize / dequantize in Triton, bit-exact with `reference.quant.nvfp4`.

Ops: `touchstone::quantize_nvfp4(x, encode_scale) -> (codes, scales)` and
`touchstone::dequantize_nvfp4(codes, scales, decode_scale, dtype) -> values`; the argument names carry the
global-scale convention. Call them through `quantize_nvfp4` / `dequantize_nvfp4` below, which take an
`EncodeScale` or a `DecodeScale` like the reference.

How the kernels stay exact (the reference's order of fp32 operations, each one rounded once):
- amax is an integer max over |x|'s fp32 bits (NaN and Inf have the largest patterns, so "amax bits >=
  0x7F800000" means the block holds one); q = s_enc / 6 is one `tl.div_rn` per program.
- The block scale byte is `(amax * q).to(float8e4nv)`: on sm_90 one `cvt.rn.satfinite.e4m3x2.f32`, RNE and
  saturating at 448, which is the reference's clamp-then-round. r = s_enc / d is looked up by that byte in
  a 128-entry table the launcher computes with the reference's own division (`multipliers`), or, with the
  TABLE knob off, divided per block (`tl.div_rn`).
- v = fp32(|x| * r) is rounded on its own (an FMUL), then saturated by an integer min with the bits of 6.0,
  then rounded to E2M1 by one fma (`kernels._e2m1.e2m1_code_of_clamped`): two roundings, as the reference
  pins them. The integer min sits between the product and the fma, so they cannot be contracted into one
  rounding; the launch keeps `enable_fp_fusion=False` anyway, so no rewrite of this chain can silently
  fuse them (the "fused_product" fault plants exactly that; the suite's double-rounding probes catch it).
- NaN/Inf blocks: the saturation limit is 0 (codes 0) and the sign mask is 0 (signs 0); the scale byte is
  0x7F. The pair's two sign bits ride in x_2i's rounding (the `tag` of its base), so each pair's byte is
  one multiply-add of the two codes.
- Dequantize: e2m1 * 2**-126 placed in the bits, times 2**126 (exact), times d_b = fp32(e4m3) * s_dec: one
  rounding, as the reference's fp32 product; then a saturating clamp and one RNE conversion to the output.
The elements are read and written as words holding one element pair (the two nibbles of one code byte),
as in kernels/mxfp4.py, with a multi-tile prefetch (unrolled: no loop-carried register copies).

SASS per element, quantize bf16 (sm_90, Triton 3.6, compiled without a GPU by triton.compile + cuobjdump,
main path: slow-path division subroutines excluded), at one block per thread (128 blocks, 4 warps), TABLE off
(on): one tile (TILES=1) 14.44 (13.62), each extra tile 12.56 (11.44), the TILES=8 loop body 12.82 (11.87).
Per element: fmul, min (saturation), max (1.0), shift, imad (rounding base), fma = 6; per pair word: 3 to
split, 2 for the signs, 1 to pack; per block ~30 (amax, scale, lookup, stores). MXFP4's quantize counts 12.5
per element the same way (its loop body) and reached 0.92x memcpy on the H200.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._boundary import check_device, runs_interpreted
from kernels._e2m1 import e2m1_code_of_clamped
from kernels._tiles import (
    block_offsets,
    load_block_words,
    packed_fp4_outputs,
    packed_rows,
    store_block_words,
    word_rows,
)
from reference.formats.e4m3 import decode_e4m3
from reference.quant.nvfp4 import NVFP4_BLOCK_SIZE, check_dequantize_args, check_quantize_args
from reference.quant.nvfp4_global_scale import DecodeScale, EncodeScale, GlobalScale

_DTYPE_ID = {torch.bfloat16: 0, torch.float16: 1, torch.float32: 2}  # INPUT / OUTPUT constexprs
WORDS = tl.constexpr(NVFP4_BLOCK_SIZE // 2)  # element-pair words per block

# Planted bugs for the suites' negative controls; FAULT is a constexpr, so fault 0 compiles them away.
FAULTS = {
    "none": 0,
    "drop_sticky": 1,  # |v| < 1 loses the 2 low bits a shifting converter drops without a sticky bit
    "swap_nibbles": 2,  # element 2i in the high nibble
    "fused_product": 3,  # v = |x| * r not rounded before the E2M1 rounding (one fma: a single rounding)
}

# Launch shapes (blocks of 16 elements per tile, tiles per program, warps). H200, bf16 256 MiB, memcpy ~4108 GB/s
# (`python -m bench.quant.nvfp4_launch_sweep --mib 256`):
# - quantize, in-kernel division (TABLE off) at tiles 8: (64, 8, 2) 0.938x, (128, 8, 4) 0.936x, (256, 8, 8)
#   0.927x; with the multiplier table (its extra launch included) at most 0.919x (64, 2, 2) and 0.898x at
#   (128, 8, 4). One tile per program (0.72-0.73x) and 512-block tiles (0.70-0.72x) lost ~0.08x against the
#   tiles-8 plateau (0.799x) of a ~15-SASS-per-element version of the kernel. fp16 reuses bf16's shape; fp32
#   is not swept.
# - dequantize: (128, 1, 2) 93.9 us 0.892x (best); (256, 1, 4) 0.886x; (128, 1, 4) 0.822x.
_QUANTIZE_GPU = {torch.bfloat16: (128, 8, 4), torch.float16: (128, 8, 4), torch.float32: (128, 1, 4)}
_DEQUANTIZE_GPU = (128, 1, 2)
# r = s / d from the launcher's 128-entry table (one extra 128-element torch division per call, ~10 fewer
# instructions per block) or divided in the kernel: the H200 sweep above measured the division faster at
# 256 MiB (0.936x against 0.898x at the same shape), so the table is off.
_MULTIPLIER_TABLE = False
# The interpreter costs ~1 ms per program whatever its size: few, large programs, one tile each.
_INTERPRETER = (2048, 1, 1)


@triton.jit
def _magnitudes(words, INPUT: tl.constexpr):
    """Pair words -> fp32 bits of (|x_2i|, |x_2i+1|). INPUT 0 bf16, 1 fp16, 2 fp32."""
    if INPUT == 0:
        pair_magnitude = words.to(tl.uint32, bitcast=True) & 0x7FFF7FFF
        low = pair_magnitude << 16  # bf16 -> fp32 bits is exactly a 16-bit shift
        high = pair_magnitude & 0xFFFF0000
    elif INPUT == 1:
        words = words.to(tl.uint32, bitcast=True)
        low = (words & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32).to(tl.uint32, bitcast=True)
        high = (words >> 16).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32).to(tl.uint32, bitcast=True)
        low, high = low & 0x7FFFFFFF, high & 0x7FFFFFFF
    else:
        words = words.to(tl.uint64, bitcast=True)
        low = (words & 0x7FFFFFFF).to(tl.uint32)
        high = ((words >> 32) & 0x7FFFFFFF).to(tl.uint32)
    return low, high


@triton.jit
def _sign_tag(words, keep, INPUT: tl.constexpr):
    """2 + the pair's sign bits at bits 3 (x_2i) and 7 (x_2i+1), both 0 where `keep` ([B, 1]) is false (NaN/Inf
    blocks); junk at bit 19 for 16-bit inputs. It is the `tag` of x_2i's E2M1 rounding, which writes the two
    sign bits into that element's code byte for free (see `kernels._e2m1.e2m1_code_of_clamped`)."""
    if INPUT == 2:
        words = words.to(tl.uint64, bitcast=True)
        signs = (((words >> 28) & 0x8) | ((words >> 56) & 0x80)).to(tl.uint32)
        return (signs & tl.where(keep, 0xFF, 0).to(tl.uint32)) + 2
    else:
        # One multiply-high moves sign bit 15 to bit 3 (x 2**20) and bit 31 to bit 7 (x 2**8) of the high word
        # (bit 31 x 2**20 is the junk at bit 19), and the constant bit 13 adds the 2 (2**13 x 2**20 = 2**33);
        # the low word's terms (2**21 + 2**23 at most) never carry. (w & mask) | 0x2000 is one LOP3.
        sign_bits = (words.to(tl.uint32, bitcast=True) & tl.where(keep, 0x80008000, 0).to(tl.uint32)) | 0x2000
        return tl.umulhi(sign_bits, 0x00100100)


@triton.jit
def _code(magnitude, multiplier, limit, tag, FAULT: tl.constexpr):
    """E2M1 code (bits 2:0, then tag's bits 7:3, junk from bit 8) of fp32(|x| * r), RNE, saturating at 6;
    0 where limit is 0 (NaN/Inf blocks, whose products may be NaN)."""
    v = magnitude.to(tl.float32, bitcast=True) * multiplier
    # Saturate on the bits (v >= 0, so integer order is float order, and NaN's bits are large).
    clamped = tl.minimum(v.to(tl.uint32, bitcast=True), limit)
    if FAULT == 1:
        clamped = tl.where(clamped < 0x3F800000, clamped & 0xFFFFFFFC, clamped)
    code = e2m1_code_of_clamped(clamped, tag)
    if FAULT == 3:  # the fma sees the exact |x| * r: one rounding instead of two
        base = ((tl.maximum(clamped, 0x3F800000) >> 23) * 0x800002 + tag).to(tl.float32, bitcast=True)
        fused = tl.fma(magnitude.to(tl.float32, bitcast=True), multiplier * 2.0**-22, base)
        code = tl.where(clamped < limit, fused.to(tl.uint32, bitcast=True), code)
    return code


@triton.jit
def _quantize_tile(
    words,
    block,
    n_blocks,
    codes_ptr,
    scales_ptr,
    multipliers_ptr,
    s,
    q,
    INPUT: tl.constexpr,
    TABLE: tl.constexpr,
    FAULT: tl.constexpr,
):
    in_range = block < n_blocks
    low, high = _magnitudes(words, INPUT)
    amax_bits = tl.max(tl.maximum(low, high), axis=1)  # NaN and Inf have the largest patterns
    not_finite = amax_bits >= 0x7F800000
    scale_fp8 = (amax_bits.to(tl.float32, bitcast=True) * q).to(tl.float8e4nv)  # RNE, satfinite, NaN 0x7F
    scale_bits = scale_fp8.to(tl.uint8, bitcast=True)
    if TABLE:  # r = s / d looked up by the scale byte (see `multipliers`): one L1 load per block
        multiplier = tl.load(multipliers_ptr + scale_bits.to(tl.int32))[:, None]
    else:  # r = s / d divided here: ~10 more instructions per block
        stored = scale_fp8.to(tl.float32)
        multiplier = tl.where(stored == 0.0, 0.0, tl.div_rn(s + tl.zeros_like(stored), stored))[:, None]
    keep = (~not_finite)[:, None]
    limit = tl.where(keep, 0x40C00000, 0).to(tl.uint32)  # fp32 bits of 6.0; 0 zeroes NaN/Inf blocks' codes
    code_low = _code(low, multiplier, limit, _sign_tag(words, keep, INPUT), FAULT)  # carries both signs
    code_high = _code(high, multiplier, limit, 2, FAULT)
    if FAULT == 2:  # magnitudes swapped, signs in place
        code_low, code_high = (code_low & 0x88) | (code_high & 0x7), code_low & 0x7
    packed = (code_low + code_high * 16).to(tl.uint8)  # the junk from bit 8 up is dropped here
    scale_byte = tl.where(not_finite, 0x7F, scale_bits)
    tl.store(codes_ptr + block[:, None] * WORDS + tl.arange(0, WORDS)[None, :], packed, mask=in_range[:, None])
    tl.store(scales_ptr + block, scale_byte, mask=in_range)


@triton.jit
def _quantize_nvfp4_kernel(
    x_ptr,
    codes_ptr,
    scales_ptr,
    encode_ptr,
    multipliers_ptr,
    n_blocks,
    blocks_per_row,
    x_row_stride,
    BLOCKS: tl.constexpr,
    TILES: tl.constexpr,
    INPUT: tl.constexpr,
    CONTIGUOUS: tl.constexpr,
    TABLE: tl.constexpr,
    FAULT: tl.constexpr,
):
    # Each program quantizes TILES consecutive tiles of BLOCKS blocks, loading tile t + 1 before it
    # computes tile t, so every warp keeps a tile's loads in flight while its ALUs work.
    s = tl.load(encode_ptr)
    q = tl.div_rn(s, 6.0)
    block = tl.program_id(0).to(tl.int64) * (BLOCKS * TILES) + tl.arange(0, BLOCKS)
    words = load_block_words(x_ptr, block, n_blocks, blocks_per_row, x_row_stride, WORDS, CONTIGUOUS)
    for _ in tl.static_range(TILES - 1):
        next_words = load_block_words(x_ptr, block + BLOCKS, n_blocks, blocks_per_row, x_row_stride, WORDS, CONTIGUOUS)
        _quantize_tile(words, block, n_blocks, codes_ptr, scales_ptr, multipliers_ptr, s, q, INPUT, TABLE, FAULT)
        block += BLOCKS
        words = next_words
    _quantize_tile(words, block, n_blocks, codes_ptr, scales_ptr, multipliers_ptr, s, q, INPUT, TABLE, FAULT)


@triton.jit
def _element_bits(code, block_scale, OUTPUT: tl.constexpr):
    """E2M1 codes [B, 8] (uint32, one nibble) times block_scale [B, 1] -> output-dtype bit patterns (uint32).

    Code bits 2:0 placed at fp32 bits 24:22 are the E2M1 value times 2**-126 (subnormal code 1 included),
    so * 2**126 is exact and * block_scale is the one rounded product; the code's sign flips the product's
    sign bit (the sign a multiply by a signed value gives). Saturated at the output's max, then RNE.
    """
    product = ((code & 0x7) << 22).to(tl.float32, bitcast=True) * 8.507059173023462e37 * block_scale
    product = (product.to(tl.uint32, bitcast=True) ^ ((code & 0x8) << 28)).to(tl.float32, bitcast=True)
    if OUTPUT == 0:
        limit: tl.constexpr = 3.3895313892515355e38  # bfloat16 max
        clamped = tl.minimum(tl.maximum(product, -limit), limit)
        return clamped.to(tl.bfloat16).to(tl.uint16, bitcast=True).to(tl.uint32)
    elif OUTPUT == 1:
        clamped = tl.minimum(tl.maximum(product, -65504.0), 65504.0)
        return clamped.to(tl.float16).to(tl.uint16, bitcast=True).to(tl.uint32)
    else:
        limit: tl.constexpr = 3.4028234663852886e38
        return tl.minimum(tl.maximum(product, -limit), limit).to(tl.uint32, bitcast=True)


@triton.jit
def _dequantize_nvfp4_kernel(
    codes_ptr,
    scales_ptr,
    decode_ptr,
    out_ptr,
    n_blocks,
    blocks_per_row,
    codes_row_stride,
    scales_row_stride,
    BLOCKS: tl.constexpr,
    OUTPUT: tl.constexpr,
    CONTIGUOUS: tl.constexpr,
):
    # The output is written as words holding one element pair: OUTPUT 0 bf16 / 1 fp16 pairs in int32
    # words, 2 fp32 pairs in int64 words; word j of a block is exactly code byte j's two nibbles.
    t = tl.load(decode_ptr)
    block = tl.program_id(0).to(tl.int64) * BLOCKS + tl.arange(0, BLOCKS)
    in_range = block < n_blocks
    code_offset = block_offsets(block, blocks_per_row, codes_row_stride, WORDS, CONTIGUOUS)
    scale_offset = block_offsets(block, blocks_per_row, scales_row_stride, 1, CONTIGUOUS)
    packed = tl.load(codes_ptr + code_offset[:, None] + tl.arange(0, WORDS)[None, :], mask=in_range[:, None], other=0)
    packed = packed.to(tl.uint32)
    scale = tl.load(scales_ptr + scale_offset, mask=in_range, other=0)
    block_scale = (scale.to(tl.float8e4nv, bitcast=True).to(tl.float32) * t)[:, None]
    low = _element_bits(packed & 0xF, block_scale, OUTPUT)
    high = _element_bits(packed >> 4, block_scale, OUTPUT)
    nan_block = ((scale & 0x7F) == 0x7F)[:, None]
    store_block_words(out_ptr, block, in_range, low, high, nan_block, WORDS, OUTPUT)


_DIVISORS: dict[torch.device, torch.Tensor] = {}


def multipliers(encode_scale: torch.Tensor) -> torch.Tensor:
    """The 128 block multipliers r = s / d, one per non-negative E4M3 scale byte: the reference's own fp32
    division `s / stored` (tensor / tensor), so the kernel's r are its r. Byte 0 divides by +Inf (r = 0,
    the reference's d = 0 case); 0x7F (NaN) gives NaN, for blocks whose codes the kernel zeroes anyway.
    One 128-element division per call; the divisors are copied to each device once, on its first call
    (make that call outside CUDA-graph capture)."""
    divisors = _DIVISORS.get(encode_scale.device)
    if divisors is None:
        divisors = decode_e4m3(torch.arange(128, dtype=torch.uint8))
        divisors[0] = float("inf")
        divisors = _DIVISORS.setdefault(encode_scale.device, divisors.to(encode_scale.device))
    return encode_scale / divisors


def launch_quantize(x: torch.Tensor, encode_scale: torch.Tensor, fault: str = "none"):
    """Validate, allocate and launch; `fault` plants a named bug (negative controls only)."""
    check_quantize_args(x, EncodeScale(encode_scale))
    check_device(x=x, encode_scale=encode_scale)
    rows, codes, scales, n_blocks = packed_fp4_outputs(x, NVFP4_BLOCK_SIZE)
    k = x.shape[-1]
    if n_blocks:
        words = word_rows(rows)
        blocks, tiles, warps = _INTERPRETER if runs_interpreted(x.device) else _QUANTIZE_GPU[x.dtype]
        table = multipliers(encode_scale) if _MULTIPLIER_TABLE else encode_scale  # (unread without TABLE)
        _quantize_nvfp4_kernel[(triton.cdiv(n_blocks, blocks * tiles),)](
            words,
            codes,
            scales,
            encode_scale,
            table,
            n_blocks,
            k // NVFP4_BLOCK_SIZE,
            words.stride(0),
            BLOCKS=blocks,
            TILES=tiles,
            INPUT=_DTYPE_ID[x.dtype],
            CONTIGUOUS=rows.shape[0] == 1 or words.stride(0) == k // 2,
            TABLE=_MULTIPLIER_TABLE,
            FAULT=FAULTS[fault],
            num_warps=warps,
            enable_fp_fusion=False,
        )
    return codes, scales


def launch_dequantize(codes: torch.Tensor, scales: torch.Tensor, decode_scale: torch.Tensor, dtype: torch.dtype):
    check_dequantize_args(codes, scales, DecodeScale(decode_scale), dtype)
    check_device(codes=codes, scales=scales, decode_scale=decode_scale)
    code_rows, scale_rows, contiguous = packed_rows(codes, scales)
    blocks_per_row = scales.shape[-1]
    out = torch.empty(*codes.shape[:-1], codes.shape[-1] * 2, dtype=dtype, device=codes.device)
    n_blocks = scale_rows.shape[0] * blocks_per_row
    if n_blocks:
        blocks, _, warps = _INTERPRETER if runs_interpreted(codes.device) else _DEQUANTIZE_GPU
        _dequantize_nvfp4_kernel[(triton.cdiv(n_blocks, blocks),)](
            code_rows,
            scale_rows,
            decode_scale,
            word_rows(out.view(-1, out.shape[-1])),
            n_blocks,
            blocks_per_row,
            code_rows.stride(0),
            scale_rows.stride(0),
            BLOCKS=blocks,
            OUTPUT=_DTYPE_ID[dtype],
            CONTIGUOUS=contiguous,
            num_warps=warps,
            enable_fp_fusion=False,
        )
    return out


@torch.library.custom_op("touchstone::quantize_nvfp4", mutates_args=())
def _quantize_op(x: torch.Tensor, encode_scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return launch_quantize(x, encode_scale)


@_quantize_op.register_fake
def _(x, encode_scale):
    check_quantize_args(x, EncodeScale(encode_scale))
    k = x.shape[-1]
    return (
        x.new_empty(*x.shape[:-1], k // 2, dtype=torch.uint8),
        x.new_empty(*x.shape[:-1], k // NVFP4_BLOCK_SIZE, dtype=torch.uint8),
    )


@torch.library.custom_op("touchstone::dequantize_nvfp4", mutates_args=())
def _dequantize_op(
    codes: torch.Tensor, scales: torch.Tensor, decode_scale: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    return launch_dequantize(codes, scales, decode_scale, dtype)


@_dequantize_op.register_fake
def _(codes, scales, decode_scale, dtype):
    check_dequantize_args(codes, scales, DecodeScale(decode_scale), dtype)
    return codes.new_empty(*codes.shape[:-1], codes.shape[-1] * 2, dtype=dtype)


def quantize_nvfp4(x: torch.Tensor, global_scale: GlobalScale) -> tuple[torch.Tensor, torch.Tensor]:
    """Kernel twin of `reference.quant.nvfp4.quantize_nvfp4` (same arguments, same bytes)."""
    return torch.ops.touchstone.quantize_nvfp4(x, check_quantize_args(x, global_scale))


def dequantize_nvfp4(
    codes: torch.Tensor, scales: torch.Tensor, global_scale: GlobalScale, *, dtype: torch.dtype = torch.bfloat16
) -> torch.Tensor:
    """Kernel twin of `reference.quant.nvfp4.dequantize_nvfp4`."""
    t = check_dequantize_args(codes, scales, global_scale, dtype)
    return torch.ops.touchstone.dequantize_nvfp4(codes, scales, t, dtype)
