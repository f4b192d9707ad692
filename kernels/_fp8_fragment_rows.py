"""16 rows of an E4M3 weight matrix times one E4M3 activation row, on tensor cores straight from the weights' bytes:
the K loop of `kernels.moe_gemv`'s block-FP8 GEMV on NVIDIA sm_90+ (`kernels._packed_ptx.packed_ptx`).

Why no prepared layout (unlike `kernels.mxfp4_fragment_layout`): a dot product does not care in which order its K
elements meet, so long as both operands use the same order. `mma.sync.m16n8k32` with E4M3 operands gives lane
(g, c) of a warp A registers holding rows g and g + 8 at logical k 4c .. 4c + 3 and 16 + 4c .. 16 + 4c + 3, and B
registers holding the same logical k of column g. Over a 128-wide scale block (four MMAs, j = 0 .. 3) the lane
meets 8 groups of 4 logical k; mapping logical group (j, h) to physical bytes 32c + 4 (2j + h) gives every lane
one contiguous 32 bytes of its two rows and of the activation row a block: two 16-byte loads a row, no decode, no
conversion. All 8 B columns hold the same activation row (one token an assignment), so every column of the result
is the same dot product.

Per lane and block: 4 + 2 16-byte loads (weights, activation), 4 MMAs into a zeroed fp32 fragment (the block's
sum of exact E4M3 products, in the tensor core's accumulation), then acc = acc + sum * (a_scale * w_scale), as
`reference.gemm.block_fp8.block_fp8_gemm_mirror` adds its blocks. WARPS warps take blocks in turns of U, one turn
of loads in flight ahead of the one computed (register prefetch), and add their partials at the end.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernels._tiles import mma_lanes, split4

MMA = "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32"
SCALE_K: tl.constexpr = tl.constexpr(128)  # block FP8's K block (one activation and one weight scale)
WORDS: tl.constexpr = tl.constexpr(4)  # int32 words of a 16-byte load


def _block_ptx() -> str:
    """PTX of one 128-wide block for one lane. Operands: $0 .. $3 the new accumulators (row g at columns 2c and
    2c + 1, row g + 8 at the same); inputs row g's 8 words ($4 .. $11), row g + 8's ($12 .. $19), the lane's
    activation row's ($20 .. $27), the four accumulators' scales a_s x w_s ($28 .. $31), the accumulators
    ($32 .. $35)."""
    g, h, x, scales, accs = 4, 12, 20, 28, 32
    s = "{\n.reg .f32 d<4>, o<4>, z, t;\nmov.f32 z, 0f00000000;\n"
    for j in range(4):
        acc = "{z,z,z,z}" if j == 0 else "{d0,d1,d2,d3}"
        a = f"${g + 2 * j},${h + 2 * j},${g + 2 * j + 1},${h + 2 * j + 1}"
        s += f"{MMA} {{d0,d1,d2,d3}}, {{{a}}}, {{${x + 2 * j},${x + 2 * j + 1}}}, {acc};\n"
    for i in range(4):  # acc = acc + sum * (a_s * w_s): the mirror's two roundings
        s += f"mul.rn.f32 t, d{i}, ${scales + i};\nadd.rn.f32 o{i}, ${accs + i}, t;\n"
    # outputs written last: an output may share a register with an input the asm still reads (no early-clobber)
    return s + "".join(f"mov.f32 ${i}, o{i};\n" for i in range(4)) + "}"


BLOCK_PTX = tl.constexpr(_block_ptx())


@triton.jit
def _words(ptr, at):
    """The 8 int32 words (32 bytes) at word offsets at .. at + 7 of every lane, as 8 [T] tensors."""
    four = tl.arange(0, WORDS)[None, :]
    w0, w1, w2, w3 = split4(tl.load(ptr + at[:, None] + four))
    w4, w5, w6, w7 = split4(tl.load(ptr + at[:, None] + WORDS + four))
    return w0, w1, w2, w3, w4, w5, w6, w7


@triton.jit
def _block_loads(
    x_words, x_at, a_scales_0, a_scales_1, w_words, w_scales, row_g, row_h, c, block, live, n_blocks, n_row_blocks,
    stride_wn, stride_wsn, stride_ask, FAULT: tl.constexpr,
):  # fmt: skip
    """Block `block` ([T], one a warp; `live` [T] False: a block past the end, its scales 0 so it adds nothing):
    the lane's 32 bytes of rows g and g + 8 and of its activation row (word offset x_at), and the scales of its
    four accumulators (a_scales_0 / _1: the activation scale rows of columns 2c and 2c + 1)."""
    kb = tl.where(live, block, 0)
    at = kb.to(tl.int64) * (SCALE_K // 4) + 8 * c  # word offset of the lane's 32 bytes in a row
    rg = _words(w_words, row_g * stride_wn + at)
    rh = _words(w_words, row_h * stride_wn + at)
    x = _words(x_words, x_at + at)
    kb_w = kb
    if FAULT == 3:  # "weight_scale_next_k_block": block kb scaled by kb + 1's weight scale (wrapping)
        kb_w = (kb + 1) % n_blocks
    nb_g, nb_h = row_g // SCALE_K, row_h // SCALE_K
    if FAULT == 5:  # "weight_scale_next_n_block": rows scaled by the next 128-row block's scale (wrapping)
        nb_g, nb_h = (nb_g + 1) % n_row_blocks, (nb_h + 1) % n_row_blocks
    a_0 = tl.load(a_scales_0 + kb * stride_ask, mask=live, other=0.0)
    a_1 = tl.load(a_scales_1 + kb * stride_ask, mask=live, other=0.0)
    w_g = tl.load(w_scales + nb_g * stride_wsn + kb_w, mask=live, other=0.0)
    w_h = tl.load(w_scales + nb_h * stride_wsn + kb_w, mask=live, other=0.0)
    return rg, rh, x, a_0 * w_g, a_1 * w_g, a_0 * w_h, a_1 * w_h


@triton.jit
def _block(loads, acc):
    rg, rh, x, s0, s1, s2, s3 = loads
    return tl.inline_asm_elementwise(
        BLOCK_PTX,
        "=f,=f,=f,=f," + "r," * 24 + "f," * 7 + "f",
        [
            rg[0],
            rg[1],
            rg[2],
            rg[3],
            rg[4],
            rg[5],
            rg[6],
            rg[7],
            rh[0],
            rh[1],
            rh[2],
            rh[3],
            rh[4],
            rh[5],
            rh[6],
            rh[7],
            x[0],
            x[1],
            x[2],
            x[3],
            x[4],
            x[5],
            x[6],
            x[7],
            s0,
            s1,
            s2,
            s3,
            acc[0],
            acc[1],
            acc[2],
            acc[3],
        ],
        dtype=(tl.float32, tl.float32, tl.float32, tl.float32),
        is_pure=True,
        pack=1,
    )


@triton.jit
def fp8_fragment_tile(
    x_words, x_stride, tok_g, a_scales, stride_asm, stride_ask, tok_0, tok_1, w_words, w_scales, first, end,
    n_blocks, n_row_blocks, stride_wn, stride_wsn, WARPS: tl.constexpr, U: tl.constexpr, FAULT: tl.constexpr,
):  # fmt: skip
    """Per lane (g, c) of the program's warp-summed result ([32] each, lane = 4g + c): the dot products of rows
    first + g and first + 8 + g (those below `end`; the others read row 0 and are not meaningful) of the E4M3
    weights at `w_words` (int32 words, row stride `stride_wn` words; `w_scales` fp32 [n_row_blocks, n_blocks], row
    stride `stride_wsn`) with activation rows tok_0 and tok_1 (the MMA's columns 2c and 2c + 1): (row g x col 2c,
    row g x col 2c + 1, row g + 8 x col 2c, row g + 8 x col 2c + 1). Column g of the MMA reads activation row tok_g
    ([T] per lane: x at `x_words`, row stride `x_stride` words) and tok_0 / tok_1 ([T]) name the rows whose scales
    (`a_scales` fp32, strides stride_asm, stride_ask) the columns take: the caller keeps them consistent (column n
    is row tok_g of lanes with g = n). Each 128-wide block's sum is scaled by a_scale x w_scale and added in fp32.
    Warp w takes blocks wU .. wU + U - 1, then (w + WARPS)U .., U 1 or 2."""
    T: tl.constexpr = 32 * WARPS
    _, warp, g, c = mma_lanes(WARPS)
    row_g = first + g
    row_h = first + 8 + g
    row_g = tl.where(row_g < end, row_g, 0).to(tl.int64)
    row_h = tl.where(row_h < end, row_h, 0).to(tl.int64)
    x_at = tok_g.to(tl.int64) * x_stride
    a_0 = a_scales + tok_0.to(tl.int64) * stride_asm
    a_1 = a_scales + tok_1.to(tl.int64) * stride_asm
    zero = tl.zeros([T], dtype=tl.float32)
    acc = (zero, zero, zero, zero)
    where = (x_words, x_at, a_0, a_1, w_words, w_scales, row_g, row_h, c)
    strides = (n_blocks, n_row_blocks, stride_wn, stride_wsn, stride_ask)
    turns = tl.cdiv(n_blocks, WARPS * U)
    block = warp * U
    ahead0 = _block_loads(*where, block, block < n_blocks, *strides, FAULT)
    if U == 2:
        ahead1 = _block_loads(*where, block + 1, block + 1 < n_blocks, *strides, FAULT)
    for i in range(0, turns):
        now0 = ahead0
        block = ((i + 1) * WARPS + warp) * U
        ahead0 = _block_loads(*where, block, block < n_blocks, *strides, FAULT)
        if U == 2:
            now1 = ahead1
            ahead1 = _block_loads(*where, block + 1, block + 1 < n_blocks, *strides, FAULT)
        acc = _block(now0, acc)
        if U == 2:
            acc = _block(now1, acc)
    # the warps' partials meet (shared memory)
    return (
        tl.sum(tl.reshape(acc[0], [WARPS, 32]), axis=0),
        tl.sum(tl.reshape(acc[1], [WARPS, 32]), axis=0),
        tl.sum(tl.reshape(acc[2], [WARPS, 32]), axis=0),
        tl.sum(tl.reshape(acc[3], [WARPS, 32]), axis=0),
    )


@triton.jit
def fp8_fragment_rows(
    a_words, a_scales_row, w_words, w_scales, first, end, n_blocks, stride_wn, stride_wsn,
    WARPS: tl.constexpr, U: tl.constexpr, FAULT: tl.constexpr,
):  # fmt: skip
    """fp32 [16]: rows first .. first + 15 (those below `end`) times the one E4M3 activation row at `a_words` (its
    scales at `a_scales_row`, contiguous): `fp8_fragment_tile` with every column on that row, lane c = 0's
    column taken."""
    T: tl.constexpr = 32 * WARPS
    same = tl.zeros([T], dtype=tl.int32)
    acc_g, _, acc_h, _ = fp8_fragment_tile(
        a_words, 0, same, a_scales_row, 0, 1, same, same, w_words, w_scales, first, end, n_blocks,
        tl.cdiv(end, SCALE_K), stride_wn, stride_wsn, WARPS, U, FAULT,
    )  # fmt: skip
    first_lane = (tl.arange(0, 4) == 0)[None, :]
    lo = tl.sum(tl.where(first_lane, tl.reshape(acc_g, [8, 4]), 0.0), axis=1)
    hi = tl.sum(tl.where(first_lane, tl.reshape(acc_h, [8, 4]), 0.0), axis=1)
    return tl.reshape(tl.permute(tl.join(lo, hi), [1, 0]), [16])
