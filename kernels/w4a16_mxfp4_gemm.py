"""W4A16 MXFP4 GEMM in Triton: y = x @ W^T, x bf16 [M, K], W as MXFP4 codes [N, K/2] + E8M0 scales [N, K/32].

Op: `touchstone::w4a16_mxfp4_gemm(x, codes, scales) -> y` (bf16 [M, N]); call it through
`w4a16_mxfp4_gemm` below, which has the reference's signature (`reference.gemm.w4a16_mxfp4`). Its twin
`touchstone::w4a16_mxfp4_gemm_prepared` reads the codes in the layout `kernels.w4a16_mxfp4_layout` prepares
once at load (PREPARED: each word's nibbles in the order the packed decode yields, so x is read as it is).

Both kernels dequantize W inside the K loop and never write it out. They compute what the mirror reference
computes (exact products of bf16 x and exact weights, fp32 sums, one bf16 rounding) in their own order:
- `_gemv_kernel` (M = 1 decode; any M works, one x row per program): fp32 FMAs on CUDA cores, written for
  the H200's issue rate: at ~0.75x memcpy the 67 M weights of an 8192 x 8192 matrix leave ~5 instructions
  per weight, so the scale is not applied per weight. Each weight is decoded as E2M1 value * 2**-126 in 2
  integer ops (shift, mask: `_spread_weight`) from a word whose nibbles have their signs moved 6 bits up
  (`_sign_spread`, one select per 4 weights), multiplied with x * 2**64 in one FFMA chain per 32-element MX
  block, and the block sum is scaled once (* 2**62 * 2**e, exact: powers of two). A tile is [GROUPS,
  BLOCK_N] blocks, block dim first so that Triton's default layout gives a thread several rows of one block
  and each x element is converted once for all of them. Codes are read as int32 words (16 bytes per block
  and row, one 128-bit load); x as int32 words of bf16 pairs, whose even and odd elements meet a code byte's
  low and high nibbles (nothing is interleaved). With PREFETCH the next K tile's loads are issued before
  the current tile is computed. SASS (sm_90, the K loop at BLOCK_N 16..64, GROUPS 8..32, prefetch):
  ~4.5-4.7 instructions per weight, of which ~1.9 on the ALU pipe (LOP3, SHF), ~1.1 IMAD, 1 FFMA.
  Exactness domain: products x * 2**64 * w * 2**-126 are exact fp32 products for 2**-77 <= |x| < 2**64
  (and x = 0, +-Inf, NaN); smaller |x| may lose bits to fp32 subnormals, larger overflows to Inf. The
  block-sum scaling never forms a weight, so no saturation applies (see the contract below).
- `_dot_kernel` (larger M): tensor cores (wgmma on sm_90). The product is computed transposed, y^T tile
  [BLOCK_N, BLOCK_M] = W tile [BLOCK_N, BK] @ x tile^T, so the dequantized weights are tl.dot's first operand
  and BLOCK_M may be 16 ("swap AB": M = 2..16 pays for no more MMA rows than M = 16). Weights are decoded
  exactly to bf16: on NVIDIA sm_90 and later by packed integer instructions and bf16x2 multiplies
  (`_blocked_weights`): the codes are read as int32 words, whole 16-byte block rows a thread, so a thread
  needs one scale per block row and its loads are 16 bytes wide; each word gives four bf16x2 registers of
  nibbles two bytes apart, and x's K tile is permuted to that order (`_in_word_k_order`), one
  dot a K tile. Elsewhere (the interpreter, which runs no PTX, ROCm, older NVIDIA GPUs) in fp32
  (`_tile_weights`: `_signed_nibble`, then * 2**126 * block scale), the even and odd halves of a K tile two
  dots of depth BK/2 (low nibbles with x's even elements, high with odd). Both decodes are exact, so both
  give the same bytes (`packed_decode` picks one).
Split-K (both kernels): SPLIT_K programs per output tile each sum a contiguous range of K tiles into an
fp32 workspace [SPLIT_K, M, N]; `kernels.split_k.sum_splits` adds the partials in split order and rounds once.

Contract beyond the mirror's: scale bytes 253 and 254 (2**126, 2**127), the only ones whose weights can
reach 2**128 and saturate in the mirror, are outside the kernel's contract: the GEMV path uses the exact
weight, the dot path an fp32 product that overflows to Inf. No producer of finite bf16 weights emits 254,
and 253 only from rceil on |w| > 2.5e38. NaN (byte 0xFF) follows the mirror in both paths.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._boundary import check_device, runs_interpreted
from kernels._packed_ptx import packed_ptx
from kernels._tiles import store_partial
from kernels.split_k import launch_split, sum_splits
from reference.gemm.w4a16_mxfp4 import check_w4a16_args
from reference.quant.mxfp4 import MX_BLOCK_SIZE

SPREAD_MASK = 0x00770077  # `_sign_spread`'s select: magnitudes of nibbles 0, 1, 4, 5

# Planted bugs for the suite's negative controls; FAULT is a constexpr, so fault 0 compiles them away.
FAULTS = {
    "none": 0,
    "scale_of_next_block": 1,  # block j's weights scaled by block j+1's scale (the last block keeps its own)
    "swap_nibbles": 2,  # the high nibble taken as element 2i
    "scale_past_end": 3,  # block j's weights scaled by block j+1's scale: the last row's last block reads past the end
}

# Launch configs. Rows: (largest M, kernel, BLOCK_N, BLOCK_M, GROUPS, SPLIT_K, warps, stages); the first row
# whose M bound holds is used. For the GEMV, stages 2 is its one-tile register prefetch (PREFETCH), 1 none.
# H200 sweep (bench/gemm/w4a16_mxfp4_launch_sweep.py, N = K = 8192, CUDA-graph replay, bf16 matmul 44.0 us):
# - M = 1: 70 GEMV candidates span 20.5-34.2 us; best (32, 1, 32, split 1, 8 warps, prefetch) 20.5 us = 2.14x
#   bf16, 0.411x memcpy; the row below (16, 1, 32, split 1, 4 warps, prefetch) 20.6 us (2.13x, 0.409x).
#   Split-K gains nothing, and the GEMV sits at ~0.41x memcpy, short of the 0.75x it was written for (module
#   doc). The sweep is flat across occupancy, so latency alone does not explain it; the per-tile shared-memory
#   round trip of x and its barriers are the likely limit (not measured). Through torch.ops without a CUDA
#   graph the M = 1 call takes 52.5 us: host dispatch dominates, which is why bench/gemm/w4a16_mxfp4.py times
#   graph replays. Measured since: sm_90 SASS of the prefetching K loop at 16 x 32 / 4 warps has 18 barriers a
#   tile (x's pairs cross warps through shared memory to reach the threads that hold its block). A variant that
#   loads x per thread in the broadcast layout (4 scalar loads of a block's pairs per byte position; 2 barriers a
#   tile, 5.2 instructions a weight) was slower on the H200 at every shape and config tried (12 configs; N = K =
#   8192: 28.7 us at best against 20.4 us; Llama-3.1-8B's projections 1.3-1.9x slower), so the exchange through
#   shared memory is not what holds the GEMV at 0.41x memcpy.
# - M = 4 and 16: dot (64, 16, 4, split 4) 46.3 us at M = 4 (GEMV 54-56 us); the bench ran this row at 0.96x
#   and 0.95x bf16 matmul (reports/cuda-h200/w4a16_mxfp4_gemm.md, before the packed decode). Re-swept at M = 16
#   (4516f71, 12 dot candidates, reports/cuda-h200/launch_sweeps/w4a16_mxfp4_launch_sweep.csv): still the best.
# - With the packed decode (`_packed_weights`), swept again (H200, triton.testing.do_bench_cudagraph without an
#   L2 flush, so the 34 MiB of MXFP4 weights may sit in the 50 MiB L2: read its figures against each other, not
#   against bf16; 24 candidates at BLOCK_M 16 and 12 at 64: BLOCK_N 64/128, GROUPS 4/8, split-K 1..16, 4/8
#   warps, 3/4 stages): M = 16 best (128, 16, 4, split 8)
#   34.2 us, 42.9 us for the same row with the fp32 decode, 36.2 us for the previous row; M = 64 best
#   (128, 64, 4, split 4) 48.0 us (the previous row 52.5 us). Every candidate lies within 34-47 us at M = 16,
#   flat in M up to 16 and in occupancy: the decode, not the MMA or the grid, bounds it. M = 1 stays on the
#   GEMV (14.3 us there; the dot path 33.3 us). Nsight Compute on the M = 16 row (128 x 16, split 8): 123
#   registers and 29.7 KB of shared memory a program, so 4 programs (16 warps) an SM, and the grid of 512 is
#   0.97 waves; each scheduler issues 0.44 instructions a cycle (3.35 warps active, 0.77 eligible). The sm_90
#   SASS of its K loop (679 instructions for a thread's 128 weights a tile): the packed decode ~2.6 a weight,
#   the E8M0 -> bf16 scale operand ~1.1 (the 0 / 255 selects, byte extraction and pairing, for every scale a
#   thread's layout holds), pairing the 16-bit code loads 0.25, x and the loop ~0.5.
# - The blocked decode (`_blocked_weights`: whole block rows a thread, one scale a block row, 16-byte code
#   loads) replaced that operand-layout decode; its sm_90 SASS K loop at 64 x 16 is 279 instructions for a
#   thread's 64 weights (the operand-layout decode: 758 for 128). Swept on the H200 (this sweep's dot list,
#   N = K = 8192, CUDA-graph replays with an L2 flush; bf16 matmul 44.5 / 45.7 / 46.8 / 188 us at M = 16 /
#   64 / 128 / 1024): M = 16 best (64, 16, 4, split 4, 4 warps) 37.6 us = 1.18x bf16 (the previous decode
#   39.7 us in the report); M = 64 (128, 64, 4, split 4, 8 warps) 52.7 us = 0.87x; M = 128 (128, 128, 4,
#   split 2, 8 warps) 78.9 us = 0.59x (the previous decode 113 us); M = 1024 (128, 128, 4, split 1, 8 warps)
#   511 us = 0.37x (538 us).
# - The prepared layout (`w4a16_mxfp4_gemm_prepared`, `--prepared`: x read in K order, no permute), same sweep
#   and shapes: M = 16 (64, 16, 4, split 4, 4 warps) 33.0 us = 1.35x bf16; M = 64 (128, 64, 4, split 4, 8 warps)
#   43.3 us = 1.08x; M = 128 (64, 128, 4, split 2, 4 warps) 52.9 us = 0.88x (the table's M <= 256 row stays the
#   interchange layout's best: the runner dequantizes from 128 rows). Llama-3.1-8B's projections with the table:
#   M = 8 1.21-1.30x bf16 (the best per shape 1.26-1.37x), M = 32 1.13-1.19x (1.19-1.31x).
# - Llama-3.1-8B's projections (`--shapes 4096x14336,28672x4096,6144x4096 --m 8 32 --only dot`): at M = 8 the
#   M <= 16 row is within 2 us of the best (1.13-1.16x bf16); at M = 32 BLOCK_M 32, 64 x 32 tiles and 4 warps
#   win on all three (1.01-1.06x bf16; best split 8, 2 and 4 by shape, split 4 in the table). With the
#   128 x 64 row at M = 32 the 8B-shape MXFP4 model decoded 4,098 tok/s at batch 32 (the previous decode:
#   4,205, a run earlier).
# Every row here and every candidate of the sweep compiles for sm_90 (Triton 3.6, no GPU) with no
# local-memory spills: wgmma for the dot kernel; registers 92-224 (GEMV), 70-255 (dot).
_GPU_CONFIGS = (
    (1, "gemv", 16, 1, 32, 1, 4, 2),
    (16, "dot", 64, 16, 4, 4, 4, 3),
    (32, "dot", 64, 32, 4, 4, 4, 3),
    (64, "dot", 128, 64, 4, 4, 8, 3),
    (256, "dot", 128, 128, 4, 2, 8, 3),
    (None, "dot", 128, 128, 4, 1, 8, 3),
)
# Wide projections (N >= WIDE_N, e.g. Llama-3.1-8B's gate_up, N 28672 x K 4096) at M = 1: GROUPS 16 and 2 warps,
# 30.2-30.3 us against 32.0 for the row above in three H200 sweeps (`--set model`, CUDA-graph replays, cold L2;
# the last: reports/cuda-h200/launch_sweeps/w4a16_mxfp4_launch_sweep_llama8b.csv). The other 8B projections
# (N 4096 and 6144) were within 0.5 us of the row above.
WIDE_N = 16384
_GPU_CONFIGS_WIDE = ((1, "gemv", 16, 1, 16, 1, 2, 2), *_GPU_CONFIGS[1:])
# The interpreter costs ~1 ms per program and much more per tl.dot: few programs, one-tile-wide K loops.
_INTERPRETER_CONFIGS = (
    (1, "gemv", 16, 1, 2, 1, 1, 2),
    (None, "dot", 16, 16, 2, 1, 1, 1),
)


@triton.jit
def _scale_values(scale):
    """E8M0 bytes (uint32) -> fp32 2**(s - 127): byte 0 is the subnormal 2**-127, byte 0xFF is NaN."""
    bits = tl.where(scale == 0, 0x00400000, scale << 23)
    return tl.where(scale == 255, 0x7FC00000, bits).to(tl.uint32).to(tl.float32, bitcast=True)


@triton.jit
def _signed_nibble(bits):
    """int32 with a nibble at bits 31:28 -> fp32 E2M1 value * 2**-126 (sign at 31, magnitude at 24:22).

    The arithmetic shift right by 6 moves the magnitude bits to 24:22 (fp32 exponent LSBs and top mantissa
    bit: exactly the E2M1 value times 2**-126, the subnormal 0.5 included) and smears the sign over 31:25;
    the mask keeps bits 31 and 24:22. Three integer ops per element (two when no left shift is needed).
    """
    return ((bits >> 6) & -2118123520).to(tl.float32, bitcast=True)  # -2118123520 = 0x81C00000


@triton.jit
def _tile_loads(
    codes_ptr,
    scales_ptr,
    n,
    n_mask,
    block,
    codes_row_stride,
    scales_row_stride,
    n_blocks,
    UNITS: tl.constexpr,
    EVEN_K: tl.constexpr,
    FAULT: tl.constexpr,
):
    """One tile's codes [BLOCK_N, GROUPS, UNITS] (a 32-block's 16 bytes as UNITS elements of codes_ptr's type)
    and scale bytes [BLOCK_N, GROUPS]; rows past N and blocks past K read as code 0 and scale 127."""
    unit = tl.arange(0, UNITS)
    code_offsets = n[:, None, None] * codes_row_stride + block[None, :, None] * UNITS + unit[None, None, :]
    scale_block = block
    if FAULT == 1:
        scale_block = tl.minimum(block + 1, n_blocks - 1)
    if FAULT == 3:
        scale_block = block + 1
    scale_offsets = n[:, None] * scales_row_stride + scale_block[None, :]
    if EVEN_K:
        codes = tl.load(codes_ptr + code_offsets, mask=n_mask[:, None, None], other=0)
        scale = tl.load(scales_ptr + scale_offsets, mask=n_mask[:, None], other=127)
    else:
        in_k = block < n_blocks
        codes = tl.load(codes_ptr + code_offsets, mask=n_mask[:, None, None] & in_k[None, :, None], other=0)
        scale = tl.load(scales_ptr + scale_offsets, mask=n_mask[:, None] & in_k[None, :], other=127)
    return codes, scale


@triton.jit
def _tile_weights(codes, scale):
    """Decoded weights of one tile from `_tile_loads`' codes (bytes [BLOCK_N, GROUPS, 16]) and scale bytes, split
    by nibble: (low, high), each fp32 [BLOCK_N, GROUPS, 16]; element (r, g, i) of `low` is W[n[r], 32 * block[g]
    + 2i], of `high` W[n[r], 32 * block[g] + 2i + 1]."""
    codes = codes.to(tl.int32)
    scale = _scale_values(scale.to(tl.uint32))[:, :, None]
    # * 2**126 gives the E2M1 value, * scale the weight: both exact (2**126 * scale itself could overflow).
    low = _signed_nibble(codes << 28) * 8.507059173023462e37 * scale
    high = _signed_nibble(codes << 24) * 8.507059173023462e37 * scale
    return low, high


# PTX of `_packed_weights`. In: one register of two 16-bit code elements (bytes b0 b1 of element 0, b2 b3 of
# element 1; byte i holds a weight in each nibble) and one bf16x2 register of their blocks' scales. Out: four
# bf16x2 registers, each the same nibble of both elements: (b0, b2) low nibbles, (b1, b3) low, (b0, b2) high,
# (b1, b3) high. Nibbles j and j + 4 of the register are such a pair. `spread` (one shift, one LOP3 select)
# keeps the magnitudes of nibbles 0, 1, 4, 5 in place and moves their signs 6 bits up; then one shift and one
# mask leave a pair as bf16 E2M1 value * 2**-126 (magnitude at bits 8:6, sign at 15, as `_signed_nibble`
# does in fp32), and two bf16x2 multiplies (* 2**126, * scale) make the weights, both exact. 22
# instructions per 8 weights (the fp32 decode of `_tile_weights` and its conversion: ~70).
_PACKED_DECODE_ASM = tl.constexpr(
    """
{
.reg .b32 t, s0, s1, u, bias;
mov.b32 bias, 0x7E807E80;
shl.b32 t, $4, 6;
lop3.b32 s0, $4, t, 0x00770077, 0xE4;
shr.u32 u, $4, 8;
shl.b32 t, u, 6;
lop3.b32 s1, u, t, 0x00770077, 0xE4;
shl.b32 t, s0, 6;
and.b32 $0, t, 0x81C081C0;
shl.b32 t, s1, 6;
and.b32 $1, t, 0x81C081C0;
shl.b32 t, s0, 2;
and.b32 $2, t, 0x81C081C0;
shl.b32 t, s1, 2;
and.b32 $3, t, 0x81C081C0;
mul.rn.bf16x2 $0, $0, bias;
mul.rn.bf16x2 $1, $1, bias;
mul.rn.bf16x2 $2, $2, bias;
mul.rn.bf16x2 $3, $3, bias;
mul.rn.bf16x2 $0, $0, $5;
mul.rn.bf16x2 $1, $1, $5;
mul.rn.bf16x2 $2, $2, $5;
mul.rn.bf16x2 $3, $3, $5;
}
"""
)


@triton.jit
def _scale_bf16(scale):
    """E8M0 bytes (uint16) -> bf16 2**(s - 127): byte 0 is the subnormal 2**-127 (0x0040), 0xFF is NaN."""
    bits = tl.where(scale == 0, 0x0040, scale << 7)
    return tl.where(scale == 255, 0x7FC0, bits).to(tl.uint16).to(tl.bfloat16, bitcast=True)


@triton.jit
def _packed_weights(codes, scale):
    """`_tile_weights` as bf16, decoded by packed integer and bf16x2 instructions (`_PACKED_DECODE_ASM`; NVIDIA
    sm_90+ only, the interpreter runs no PTX) from the codes read as 16-bit elements (byte pairs [BLOCK_N,
    GROUPS, 8]): (low, high) bf16 [BLOCK_N, GROUPS, 16], the same values."""
    scale = tl.broadcast_to(_scale_bf16(scale.to(tl.uint16))[:, :, None], codes.shape)
    low_even, low_odd, high_even, high_odd = tl.inline_asm_elementwise(
        _PACKED_DECODE_ASM,
        "=r,=r,=r,=r,r,r",
        [codes, scale],
        dtype=(tl.bfloat16, tl.bfloat16, tl.bfloat16, tl.bfloat16),
        is_pure=True,
        pack=2,
    )
    low = tl.reshape(tl.join(low_even, low_odd), [codes.shape[0], codes.shape[1], 16])
    high = tl.reshape(tl.join(high_even, high_odd), [codes.shape[0], codes.shape[1], 16])
    return low, high


@triton.jit
def _scale_pairs(scale):
    """E8M0 bytes -> int32 bf16x2 (2**(s - 127), the same) per byte: `_scale_bf16` in both halves, for the
    packed decode's scale operand."""
    bits = tl.where(scale == 0, 0x00400040, scale * 0x00800080)
    return tl.where(scale == 255, 0x7FC07FC0, bits).to(tl.int32, bitcast=True)


@triton.jit
def _in_word_k_order(x, BK: tl.constexpr):
    """x [rows, BK] (K in order) with each 8 columns put in the order of a `_blocked_weights` tile's word:
    elements 0, 4, 1, 5, 2, 6, 3, 7 (the word's four bf16x2 registers, each a pair of nibbles two bytes apart,
    in the order `_blocked_weights` joins them), as reshapes and a permute of the loaded tile."""
    rows: tl.constexpr = x.shape[0]
    return tl.reshape(tl.permute(tl.reshape(x, [rows, BK // 8, 2, 4]), [0, 1, 3, 2]), [rows, BK])


@triton.jit
def _blocked_weights(
    codes_ptr,
    scales_ptr,
    n,
    n_mask,
    tile,
    codes_row_stride,
    scales_row_stride,
    n_blocks,
    GROUPS: tl.constexpr,
    EVEN_K: tl.constexpr,
    FAULT: tl.constexpr,
):
    """K tile `tile` of the rows n, decoded exactly to bf16 by the packed decode: [BLOCK_N, GROUPS * 32], columns
    in `_word_k_order`. codes_ptr holds int32 words (8 codes each, 4 a block and row), so a thread's loads are
    whole 16-byte block rows and it needs one scale per block and row; rows past N and blocks past K read as
    code 0 and scale 127."""
    WORDS: tl.constexpr = GROUPS * 4
    word = tile * WORDS + tl.arange(0, WORDS)
    block = tile * GROUPS + tl.arange(0, GROUPS)
    scale_block = block
    if FAULT == 1:
        scale_block = tl.minimum(block + 1, n_blocks - 1)
    if FAULT == 3:
        scale_block = block + 1
    code_offsets = n[:, None] * codes_row_stride + word[None, :]
    scale_offsets = n[:, None] * scales_row_stride + scale_block[None, :]
    if EVEN_K:
        codes = tl.load(codes_ptr + code_offsets, mask=n_mask[:, None], other=0)
        scale = tl.load(scales_ptr + scale_offsets, mask=n_mask[:, None], other=127)
    else:
        codes = tl.load(codes_ptr + code_offsets, mask=n_mask[:, None] & (word // 4 < n_blocks)[None, :], other=0)
        scale = tl.load(scales_ptr + scale_offsets, mask=n_mask[:, None] & (block < n_blocks)[None, :], other=127)
    pairs = tl.broadcast_to(_scale_pairs(scale.to(tl.uint32))[:, :, None], [n.shape[0], GROUPS, 4])
    pairs = tl.reshape(pairs, [n.shape[0], WORDS])
    return _packed_word_weights(codes, pairs, FAULT == 2)


@triton.jit
def _packed_word_weights(codes, pairs, SWAP_NIBBLES: tl.constexpr):
    """int32 code words [rows, WORDS] (8 E2M1 codes each) and their int32 bf16x2 scale pairs -> the weights,
    bf16 [rows, WORDS * 8], each word's eight in `_in_word_k_order` (`_PACKED_DECODE_ASM`, exact).
    SWAP_NIBBLES plants the swapped-nibble bug of the suites' negative controls."""
    rows: tl.constexpr = codes.shape[0]
    WORDS: tl.constexpr = codes.shape[1]
    lo0, lo1, hi0, hi1 = tl.inline_asm_elementwise(
        _PACKED_DECODE_ASM,
        "=r,=r,=r,=r,r,r",
        [codes, pairs],
        dtype=(tl.int32, tl.int32, tl.int32, tl.int32),
        is_pure=True,
        pack=1,
    )
    if SWAP_NIBBLES:
        lo0, lo1, hi0, hi1 = hi0, hi1, lo0, lo1
    regs = tl.reshape(tl.join(tl.join(lo0, lo1), tl.join(hi0, hi1)), [rows, WORDS * 4]).to(tl.uint32, bitcast=True)
    halves = tl.join((regs & 0xFFFF).to(tl.uint16), (regs >> 16).to(tl.uint16))
    return tl.reshape(halves, [rows, WORDS * 8]).to(tl.bfloat16, bitcast=True)


@triton.jit
def _weight_tile(
    codes_ptr,
    scales_ptr,
    n,
    n_mask,
    block,
    codes_row_stride,
    scales_row_stride,
    n_blocks,
    EVEN_K: tl.constexpr,
    FAULT: tl.constexpr,
    PACKED: tl.constexpr,
):
    """One tile's (low, high) weights, exact: `_packed_weights` (codes_ptr in byte pairs, 8 a block and row) when
    PACKED, else `_tile_weights` (codes_ptr in bytes, 16 a block and row); `packed_decode` says which a device
    runs."""
    UNITS: tl.constexpr = 8 if PACKED else 16
    codes, scale = _tile_loads(
        codes_ptr, scales_ptr, n, n_mask, block, codes_row_stride, scales_row_stride, n_blocks, UNITS, EVEN_K, FAULT
    )
    if PACKED:
        low, high = _packed_weights(codes, scale)
    else:
        low, high = _tile_weights(codes, scale)
    if FAULT == 2:
        low, high = high, low
    return low, high


@triton.jit
def _x_halves(words):
    """int32 words of bf16 pairs -> (even, odd) elements as fp32 (bf16 -> fp32 is a 16-bit shift)."""
    words = words.to(tl.uint32, bitcast=True)
    return (words << 16).to(tl.float32, bitcast=True), (words & 0xFFFF0000).to(tl.float32, bitcast=True)


@triton.jit
def _gemv_kernel(
    x_ptr,
    codes_ptr,
    scales_ptr,
    out_ptr,
    N,
    n_blocks,
    tiles_per_split,
    x_row_stride,
    codes_row_stride,
    scales_row_stride,
    out_row_stride,
    out_split_stride,
    spread_mask,
    BLOCK_N: tl.constexpr,
    GROUPS: tl.constexpr,
    PREFETCH: tl.constexpr,
    EVEN_K: tl.constexpr,
    OUT_FP32: tl.constexpr,
    FAULT: tl.constexpr,
    PREPARED: tl.constexpr = False,
):
    # x_ptr: int32 words (bf16 pairs) [M, K/2]; codes_ptr: int32 view of the codes; program (n tile, m, split).
    pid_n, m, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = n < N
    n = tl.where(n_mask, n, 0).to(tl.int64)
    first = split * tiles_per_split
    last = tl.minimum(first + tiles_per_split, tl.cdiv(n_blocks, GROUPS))
    y = _gemv_rows(
        x_ptr + m.to(tl.int64) * x_row_stride, codes_ptr, scales_ptr, n, n_mask, first, last, n_blocks,
        codes_row_stride, scales_row_stride, spread_mask, GROUPS, PREFETCH, EVEN_K, FAULT, PREPARED,
    )  # fmt: skip
    out = out_ptr + split.to(tl.int64) * out_split_stride + m.to(tl.int64) * out_row_stride + n
    store_partial(out, y, n_mask, OUT_FP32)


@triton.jit
def _gemv_rows(
    x_row, codes_ptr, scales_ptr, n, n_mask, first, last, n_blocks, codes_row_stride, scales_row_stride,
    spread_mask, GROUPS: tl.constexpr, PREFETCH: tl.constexpr, EVEN_K: tl.constexpr, FAULT: tl.constexpr,
    PREPARED: tl.constexpr,
):  # fmt: skip
    """fp32 [BLOCK_N]: rows `n` (int64, clamped into range; `n_mask` the real ones) of the codes times the x row
    (int32 words of bf16 pairs at `x_row`), over K tiles [first, last) of GROUPS blocks: the GEMV's K loop, also
    `kernels.moe_gemv`'s."""
    # Tiles are [GROUPS, BLOCK_N, 4] (block, row, code word): with the block dim first Triton's default layout
    # spreads a warp's threads over blocks before rows, so a thread holds several rows of the same block and
    # converts each x element once for all of them.
    # PREFETCH: tile t + 1's codes, scales and x are loaded (into registers) before tile t is computed, so a
    # warp keeps one tile in flight while it decodes; without it each tile's loads wait out a full DRAM
    # latency with nothing to overlap but the other resident warps.
    acc = tl.zeros([GROUPS, n.shape[0]], dtype=tl.float32)
    if PREFETCH:
        codes, scale, pairs = _gemv_tile_loads(
            x_row,
            codes_ptr,
            scales_ptr,
            n,
            n_mask,
            first,
            first < last,
            n_blocks,
            codes_row_stride,
            scales_row_stride,
            GROUPS,
            EVEN_K,
            FAULT,
        )
        for tile in range(first, last):
            # The last iteration's prefetch is masked off (a uniform predicate): no bytes beyond the split.
            next_codes, next_scale, next_pairs = _gemv_tile_loads(
                x_row,
                codes_ptr,
                scales_ptr,
                n,
                n_mask,
                tile + 1,
                tile + 1 < last,
                n_blocks,
                codes_row_stride,
                scales_row_stride,
                GROUPS,
                EVEN_K,
                FAULT,
            )
            acc += _gemv_tile_sum(codes, scale, pairs, spread_mask, GROUPS, FAULT, PREPARED)
            codes, scale, pairs = next_codes, next_scale, next_pairs
    else:
        for tile in range(first, last):
            codes, scale, pairs = _gemv_tile_loads(
                x_row,
                codes_ptr,
                scales_ptr,
                n,
                n_mask,
                tile,
                True,
                n_blocks,
                codes_row_stride,
                scales_row_stride,
                GROUPS,
                EVEN_K,
                FAULT,
            )
            acc += _gemv_tile_sum(codes, scale, pairs, spread_mask, GROUPS, FAULT, PREPARED)
    return tl.sum(acc, axis=0)


@triton.jit
def _gemv_tile_loads(
    x_row,
    codes_ptr,
    scales_ptr,
    n,
    n_mask,
    tile,
    live,
    n_blocks,
    codes_row_stride,
    scales_row_stride,
    GROUPS: tl.constexpr,
    EVEN_K: tl.constexpr,
    FAULT: tl.constexpr,
):
    """K tile `tile` of the GEMV: codes as int32 words [GROUPS, BLOCK_N, 4] (word t of a block holds elements
    8t .. 8t + 7, one 128-bit load per block and row), scale bytes [GROUPS, BLOCK_N] and x as int32 words of
    bf16 pairs [GROUPS, 4, 4] (pair 4t + b meets byte b of code word t). `live` (a scalar) masks it all off."""
    word = tl.arange(0, 4)
    block = tile * GROUPS + tl.arange(0, GROUPS)
    scale_block = block
    if FAULT == 1:
        scale_block = tl.minimum(block + 1, n_blocks - 1)
    if FAULT == 3:
        scale_block = block + 1
    code_offsets = block[:, None, None] * 4 + n[None, :, None] * codes_row_stride + word[None, None, :]
    scale_offsets = scale_block[:, None] + n[None, :] * scales_row_stride
    x_offsets = block[:, None, None] * 16 + word[None, :, None] * 4 + word[None, None, :]
    if EVEN_K:
        in_k = (tl.arange(0, GROUPS) < GROUPS) & live  # folds to `live`: no per-block compare
    else:
        in_k = (block < n_blocks) & live
    codes = tl.load(codes_ptr + code_offsets, mask=in_k[:, None, None] & n_mask[None, :, None], other=0)
    scale = tl.load(scales_ptr + scale_offsets, mask=in_k[:, None] & n_mask[None, :], other=127)
    pairs = tl.load(x_row + x_offsets, mask=in_k[:, None, None], other=0)
    return codes, scale, pairs


@triton.jit
def _gemv_tile_sum(codes, scale, pairs, spread_mask, GROUPS: tl.constexpr, FAULT: tl.constexpr, PREPARED: tl.constexpr):
    """[GROUPS, BLOCK_N] fp32: each block's dot product with x, scaled (the operands of `_gemv_tile_loads`)."""
    # x * 2**64 meets w * 2**-126: exact products for 2**-77 <= |x| < 2**64 (see the module doc).
    even, odd = _x_halves(pairs)
    even, odd = even * 18446744073709551616.0, odd * 18446744073709551616.0
    even02, even13 = tl.split(tl.reshape(even, [GROUPS, 4, 2, 2]))  # split by bit 0 of the byte index
    odd02, odd13 = tl.split(tl.reshape(odd, [GROUPS, 4, 2, 2]))
    even0, even2 = tl.split(even02)
    even1, even3 = tl.split(even13)
    odd0, odd2 = tl.split(odd02)
    odd1, odd3 = tl.split(odd13)
    # Bytes 0 and 2 of each code word decode from one sign-spread word, bytes 1 and 3 from another (the word
    # shifted down a byte); then one FFMA chain per code word over its 8 elements, 3 adds over a block's words.
    spread02, spread13 = _sign_spread(codes, spread_mask), _sign_spread(codes >> 8, spread_mask)
    # Byte b's nibbles meet x elements (2b, 2b + 1) of the code word's 8; in the prepared layout
    # (`kernels.w4a16_mxfp4_layout`) bytes 0, 1 hold elements (0, 2), (4, 6) and bytes 2, 3 (1, 3), (5, 7).
    if PREPARED:
        lows, highs = (even0, even2, odd0, odd2), (even1, even3, odd1, odd3)
    else:
        lows, highs = (even0, even1, even2, even3), (odd0, odd1, odd2, odd3)
    partial = _byte_products(spread02, 22, lows[0], highs[0], tl.zeros_like(even0[:, None, :] * codes), FAULT)
    partial = _byte_products(spread13, 22, lows[1], highs[1], partial, FAULT)
    partial = _byte_products(spread02, 6, lows[2], highs[2], partial, FAULT)
    partial = _byte_products(spread13, 6, lows[3], highs[3], partial, FAULT)
    block_sum = tl.sum(partial, axis=2) * 4611686018427387904.0  # * 2**62: back to x * w
    return block_sum * _scale_values(scale.to(tl.uint32))


@triton.jit
def _sign_spread(words, spread_mask):
    """int32 code words -> words in which nibbles 0, 1, 4, 5 have their magnitude in place and their sign 6 bits
    above it (bits 9, 13, 25, 29, which belong to nibbles 2, 3, 6, 7: the rest of the word is garbage).

    Then `_spread_weight(spread, 22 - 4j)` decodes nibble j in 2 ops (shift, mask) against 3 for
    `_signed_nibble`, and the shift can go to the FMA pipe (IMAD.SHL). The GEMV is issue- and ALU-pipe bound
    (the ALU pipe has half the FMA pipes' lanes on sm_90): sm_90 SASS of its K loop went from ~2.4 ALU-pipe
    ops (SHF.R.S32 + LOP3 per weight) and ~4.8 instructions per weight to ~1.9 and ~4.5-4.7 (ptxas still
    puts about one shift in four on the ALU pipe). Cost: one shift and one LOP3 select per 4 weights.
    """
    # spread_mask = 0x00770077 arrives as a kernel argument: with a literal, LLVM folds the known-zero low bits
    # of `shifted` into a second constant (~C & ~0x3F) and ptxas emits two LOP3s instead of one.
    shifted = words << 6
    return shifted ^ ((words ^ shifted) & spread_mask)


@triton.jit
def _spread_weight(spread, SHIFT: tl.constexpr):
    """Nibble (22 - SHIFT) / 4 of a `_sign_spread` word -> fp32 E2M1 value * 2**-126: the shift brings its
    magnitude to bits 24:22 and its sign to 31, the mask keeps those (the bits of `_signed_nibble`)."""
    return ((spread << SHIFT) & -2118123520).to(tl.float32, bitcast=True)  # -2118123520 = 0x81C00000


@triton.jit
def _byte_products(spread, SHIFT: tl.constexpr, even, odd, acc, FAULT: tl.constexpr):
    """acc + W * x over one byte of every code word, from its `_sign_spread` word (the byte's low nibble at
    spread-nibble (22 - SHIFT) / 4, its high nibble one above): low nibble times `even`, high times `odd`
    (x * 2**64, [GROUPS, 4]), the weights decoded as E2M1 value * 2**-126."""
    low = _spread_weight(spread, SHIFT)
    high = _spread_weight(spread, SHIFT - 4)
    if FAULT == 2:
        low, high = high, low
    acc += low * even[:, None, :]
    acc += high * odd[:, None, :]
    return acc


@triton.jit
def _x_elements(x_ptr, m, x_row_stride, words, upper, in_k, EVEN_K: tl.constexpr):
    """x^T [len(words), BLOCK_M] bf16: of each int32 word (bf16 pair) `words` of rows m, the upper element where
    `upper` holds, else the lower; words past K (`in_k` false) read as 0."""
    offsets = m[None, :] * x_row_stride + words[:, None]
    if EVEN_K:
        pairs = tl.load(x_ptr + offsets)
    else:
        pairs = tl.load(x_ptr + offsets, mask=in_k[:, None], other=0)
    pairs = pairs.to(tl.uint32, bitcast=True)
    return tl.where(upper[:, None], pairs >> 16, pairs & 0xFFFF).to(tl.uint16).to(tl.bfloat16, bitcast=True)


@triton.jit
def _dot_kernel(
    x_ptr,
    codes_ptr,
    scales_ptr,
    out_ptr,
    M,
    N,
    n_blocks,
    tiles_per_split,
    x_row_stride,
    codes_row_stride,
    scales_row_stride,
    out_row_stride,
    out_split_stride,
    BLOCK_N: tl.constexpr,
    BLOCK_M: tl.constexpr,
    GROUPS: tl.constexpr,
    EVEN_K: tl.constexpr,
    OUT_FP32: tl.constexpr,
    FAULT: tl.constexpr,
    PACKED: tl.constexpr = False,
    PREPARED: tl.constexpr = False,
):
    # x_ptr: bf16 [M, K] (PACKED) or int32 words of bf16 pairs [M, K/2]; program (n tile, m tile, split); acc is
    # y^T's tile.
    pid_n, pid_m, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = n < N
    n = tl.where(n_mask, n, 0).to(tl.int64)
    m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    m_mask = m < M
    m = tl.where(m_mask, m, 0).to(tl.int64)
    HALF: tl.constexpr = GROUPS * 16  # words (element pairs) per K tile
    word = tl.arange(0, HALF)
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    first = split * tiles_per_split
    last = tl.minimum(first + tiles_per_split, tl.cdiv(n_blocks, GROUPS))
    if PACKED:
        # x_ptr: bf16 [M, K], read in K order (and permuted to the decoded tile's order unless PREPARED);
        # codes_ptr: int32 words; one dot a K tile.
        BK: tl.constexpr = GROUPS * 32
        for tile in range(first, last):
            w = _blocked_weights(
                codes_ptr, scales_ptr, n, n_mask, tile, codes_row_stride, scales_row_stride, n_blocks, GROUPS,
                EVEN_K, FAULT,
            )  # fmt: skip
            k = tile * BK + tl.arange(0, BK)
            x_offsets = m[:, None] * x_row_stride + k[None, :]  # [BLOCK_M, BK], read in K order
            if EVEN_K:
                x = tl.load(x_ptr + x_offsets)
            else:
                x = tl.load(x_ptr + x_offsets, mask=(k < n_blocks * 32)[None, :], other=0.0)
            if not PREPARED:  # prepared codes decode in K order (`kernels.w4a16_mxfp4_layout`)
                x = _in_word_k_order(x, BK)
            acc = tl.dot(w, tl.trans(x), acc)
    else:
        # x_ptr: int32 words (bf16 pairs); the even and odd halves of a K tile are two dots of depth BK / 2.
        for tile in range(first, last):
            block = tile * GROUPS + tl.arange(0, GROUPS)
            strides = (codes_row_stride, scales_row_stride)
            low, high = _weight_tile(codes_ptr, scales_ptr, n, n_mask, block, *strides, n_blocks, EVEN_K, FAULT, False)
            low = tl.reshape(low, [BLOCK_N, HALF]).to(tl.bfloat16)  # exact: every value is a bf16 value
            high = tl.reshape(high, [BLOCK_N, HALF]).to(tl.bfloat16)
            in_k = (tile * GROUPS + word // 16) < n_blocks
            if PREPARED:
                # Code byte i of a block (word t = i // 4, byte b = i % 4) holds elements 8t + (0, 4, 1, 5)[b] (low
                # nibble) and 8t + (2, 6, 3, 7)[b] (high): x words 4t + 2 (b % 2) and the next, half b // 2 of each.
                byte = word % 16
                first_word = tile * HALF + word - byte % 4 + (byte % 2) * 2
                upper = (byte % 4) // 2 == 1
                even = _x_elements(x_ptr, m, x_row_stride, first_word, upper, in_k, EVEN_K)
                odd = _x_elements(x_ptr, m, x_row_stride, first_word + 1, upper, in_k, EVEN_K)
            else:
                even = _x_elements(x_ptr, m, x_row_stride, tile * HALF + word, word < 0, in_k, EVEN_K)
                odd = _x_elements(x_ptr, m, x_row_stride, tile * HALF + word, word >= 0, in_k, EVEN_K)
            acc = tl.dot(low, even, acc)
            acc = tl.dot(high, odd, acc)
    out = out_ptr + split.to(tl.int64) * out_split_stride + m[None, :] * out_row_stride + n[:, None]
    mask = n_mask[:, None] & m_mask[None, :]
    store_partial(out, acc, mask, OUT_FP32)


def packed_decode(device: torch.device) -> bool:
    """Whether MXFP4 weight tiles are decoded by the packed PTX (`_packed_weights`: NVIDIA sm_90 and later) or
    in fp32 (`_tile_weights`: the interpreter, which runs no PTX, ROCm and older NVIDIA GPUs). Both give the
    same bytes."""
    return packed_ptx(device)


def launch_config(m: int, n: int, device: torch.device) -> tuple:
    """(kernel, BLOCK_N, BLOCK_M, GROUPS, SPLIT_K, warps, stages) for M rows and N outputs on `device`."""
    if runs_interpreted(device):
        table = _INTERPRETER_CONFIGS
    else:
        table = _GPU_CONFIGS_WIDE if n >= WIDE_N else _GPU_CONFIGS
    return next(row[1:] for row in table if row[0] is None or m <= row[0])


def launch(
    x: torch.Tensor,
    codes: torch.Tensor,
    scales: torch.Tensor,
    config: tuple | None = None,
    fault: str = "none",
    prepared: bool = False,
) -> torch.Tensor:
    """Validate, allocate and launch. `config` overrides the table (launch sweeps); `fault` plants a named bug
    (negative controls only); `prepared`: the codes are in `kernels.w4a16_mxfp4_layout`'s layout."""
    check_w4a16_args(x, codes, scales)
    check_device(x=x, codes=codes, scales=scales)
    for name, t in (("x", x), ("codes", codes), ("scales", scales)):
        if t.shape[1] > 1 and t.stride(1) != 1:
            raise ValueError(f"{name}: last dim must have stride 1, got strides {t.stride()}; call .contiguous()")
    # x is read as int32 words of bf16 pairs and the GEMV kernel reads codes as int32 words.
    for name, t, per_word in (("x", x, 2), ("codes", codes, 4)):
        if t.numel() and (t.stride(0) % per_word or t.data_ptr() % 4):
            raise ValueError(
                f"{name}: rows must start on 4-byte boundaries, got row stride {t.stride(0)} at "
                f"address {t.data_ptr():#x}; call .contiguous()"
            )
    m, k = x.shape
    n = codes.shape[0]
    y = torch.empty(m, n, dtype=torch.bfloat16, device=x.device)
    if m == 0 or n == 0:
        return y
    if k == 0:
        return y.zero_()
    kind, block_n, block_m, groups, split_k, warps, stages = config or launch_config(m, n, x.device)
    n_blocks = k // MX_BLOCK_SIZE
    split_k, tiles_per_split = launch_split(triton.cdiv(n_blocks, groups), split_k)
    out = y if split_k == 1 else torch.empty(split_k, m, n, dtype=torch.float32, device=x.device)
    words = x.view(torch.int32)  # [M, K/2] bf16 pairs
    common = dict(
        EVEN_K=n_blocks % groups == 0,
        OUT_FP32=split_k > 1,
        FAULT=FAULTS[fault],
        PREPARED=prepared,
        num_warps=warps,
        num_stages=stages,
    )
    if kind == "gemv":
        code_words = codes.view(torch.int32)
        strides = (words.stride(0), code_words.stride(0), scales.stride(0), n, m * n, SPREAD_MASK)
        # The GEMV's "stages" is its own: 2 = the one-tile register prefetch, 1 = none (Triton's pipeliner would
        # stage these loads through shared memory, which costs issue slots the decode needs).
        common["num_stages"] = 1
        _gemv_kernel[(triton.cdiv(n, block_n), m, split_k)](
            words,
            code_words,
            scales,
            out,
            n,
            n_blocks,
            tiles_per_split,
            *strides,
            BLOCK_N=block_n,
            GROUPS=groups,
            PREFETCH=stages > 1,
            **common,
        )
    else:
        # On sm_90+ the weights are decoded by packed instructions from the codes read as int32 words, and x is
        # read as bf16 elements in the decoded tile's K order; elsewhere x is read as bf16 pairs.
        packed = packed_decode(x.device)
        x_arg, code_units = (x, codes.view(torch.int32)) if packed else (words, codes)
        strides = (x_arg.stride(0), code_units.stride(0), scales.stride(0), n, m * n)
        _dot_kernel[(triton.cdiv(n, block_n), triton.cdiv(m, block_m), split_k)](
            x_arg,
            code_units,
            scales,
            out,
            m,
            n,
            n_blocks,
            tiles_per_split,
            *strides,
            BLOCK_N=block_n,
            BLOCK_M=block_m,
            GROUPS=groups,
            PACKED=packed,
            **common,
        )
    if split_k > 1:
        sum_splits(out, y)
    return y


@torch.library.custom_op("touchstone::w4a16_mxfp4_gemm", mutates_args=())
def _gemm_op(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    return launch(x, codes, scales)


@_gemm_op.register_fake
def _gemm_fake(x, codes, scales):
    check_w4a16_args(x, codes, scales)
    return x.new_empty(x.shape[0], codes.shape[0], dtype=torch.bfloat16)


def w4a16_mxfp4_gemm(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """Kernel twin of `reference.gemm.w4a16_mxfp4.w4a16_mxfp4_gemm_mirror` (bf16 [M, N])."""
    return torch.ops.touchstone.w4a16_mxfp4_gemm(x, codes, scales)


@torch.library.custom_op("touchstone::w4a16_mxfp4_gemm_prepared", mutates_args=())
def _prepared_op(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    return launch(x, codes, scales, prepared=True)


_prepared_op.register_fake(_gemm_fake)


def w4a16_mxfp4_gemm_prepared(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """`w4a16_mxfp4_gemm` with the codes in the layout `kernels.w4a16_mxfp4_layout.prepare_codes` makes once at
    load (the same bytes out: the mirror of `interchange_codes(codes)`)."""
    return torch.ops.touchstone.w4a16_mxfp4_gemm_prepared(x, codes, scales)
