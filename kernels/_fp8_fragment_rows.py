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

MMA = "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32"
SCALE_K: tl.constexpr = tl.constexpr(128)  # block FP8's K block (one activation and one weight scale)
WORDS: tl.constexpr = tl.constexpr(4)  # int32 words of a 16-byte load


def _block_ptx() -> str:
    """PTX of one 128-wide block for one lane. Operands: $0, $1 the new accumulators of rows g and g + 8; inputs
    row g's 8 words ($2 .. $9), row g + 8's ($10 .. $17), the activation's ($18 .. $25), the rows' scales a_s x
    w_s ($26, $27), the accumulators ($28, $29)."""
    g, h, x = 2, 10, 18
    s = "{\n.reg .f32 d<4>, z, t;\nmov.f32 z, 0f00000000;\n"
    for j in range(4):
        acc = "{z,z,z,z}" if j == 0 else "{d0,d1,d2,d3}"
        a = f"${g + 2 * j},${h + 2 * j},${g + 2 * j + 1},${h + 2 * j + 1}"
        s += f"{MMA} {{d0,d1,d2,d3}}, {{{a}}}, {{${x + 2 * j},${x + 2 * j + 1}}}, {acc};\n"
    s += "mul.rn.f32 t, d0, $26;\nadd.rn.f32 $0, $28, t;\nmul.rn.f32 t, d2, $27;\nadd.rn.f32 $1, $29, t;\n"
    return s + "}"


BLOCK_PTX = tl.constexpr(_block_ptx())


@triton.jit
def _split4(v):
    """[T, 4] -> its four columns, each [T]."""
    even, odd = tl.split(tl.reshape(v, [v.shape[0], 2, 2]))
    v0, v2 = tl.split(even)
    v1, v3 = tl.split(odd)
    return v0, v1, v2, v3


@triton.jit
def _words(ptr, at):
    """The 8 int32 words (32 bytes) at word offsets at .. at + 7 of every lane, as 8 [T] tensors."""
    four = tl.arange(0, WORDS)[None, :]
    w0, w1, w2, w3 = _split4(tl.load(ptr + at[:, None] + four))
    w4, w5, w6, w7 = _split4(tl.load(ptr + at[:, None] + WORDS + four))
    return w0, w1, w2, w3, w4, w5, w6, w7


@triton.jit
def _block_loads(
    a_words, a_scales_row, w_words, w_scales, row_g, row_h, c, block, live, n_blocks, stride_wn, stride_wsn,
    FAULT: tl.constexpr,
):  # fmt: skip
    """Block `block` ([T], one a warp; `live` [T] False: a block past the end, its scales 0 so it adds nothing):
    the lane's 32 bytes of rows g and g + 8 and of the activation, and the two rows' scales."""
    kb = tl.where(live, block, 0)
    at = kb.to(tl.int64) * (SCALE_K // 4) + 8 * c  # word offset of the lane's 32 bytes in a row
    rg = _words(w_words, row_g * stride_wn + at)
    rh = _words(w_words, row_h * stride_wn + at)
    x = _words(a_words, at)
    kb_w = kb
    if FAULT == 3:  # "weight_scale_next_k_block": block kb scaled by kb + 1's weight scale (wrapping)
        kb_w = (kb + 1) % n_blocks
    a_s = tl.load(a_scales_row + kb, mask=live, other=0.0)
    s_g = a_s * tl.load(w_scales + (row_g // SCALE_K) * stride_wsn + kb_w, mask=live, other=0.0)
    s_h = a_s * tl.load(w_scales + (row_h // SCALE_K) * stride_wsn + kb_w, mask=live, other=0.0)
    return rg, rh, x, s_g, s_h


@triton.jit
def _block(loads, acc_g, acc_h):
    rg, rh, x, s_g, s_h = loads
    return tl.inline_asm_elementwise(
        BLOCK_PTX,
        "=f,=f," + "r," * 24 + "f,f,f,f",
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
            s_g,
            s_h,
            acc_g,
            acc_h,
        ],
        dtype=(tl.float32, tl.float32),
        is_pure=True,
        pack=1,
    )


@triton.jit
def fp8_fragment_rows(
    a_words, a_scales_row, w_words, w_scales, first, end, n_blocks, stride_wn, stride_wsn,
    WARPS: tl.constexpr, U: tl.constexpr, FAULT: tl.constexpr,
):  # fmt: skip
    """fp32 [16]: rows first .. first + 15 (those below `end`; the others read row 0 and are not meaningful) of the
    E4M3 weights at `w_words` (int32 words, row stride `stride_wn` words) times the E4M3 activation row at `a_words`
    over all n_blocks 128-wide blocks, each block's sum scaled by a_scale x w_scale (`w_scales` fp32 [ceil(N / 128),
    n_blocks], row stride `stride_wsn`). Warp w takes blocks wU .. wU + U - 1, then (w + WARPS)U .., U 1 or 2."""
    T: tl.constexpr = 32 * WARPS
    t = tl.arange(0, T)
    lane = t % 32
    warp = t // 32
    g = lane // 4
    c = lane % 4
    row_g = first + g
    row_h = first + 8 + g
    row_g = tl.where(row_g < end, row_g, 0).to(tl.int64)
    row_h = tl.where(row_h < end, row_h, 0).to(tl.int64)
    acc_g = tl.zeros([T], dtype=tl.float32)
    acc_h = tl.zeros([T], dtype=tl.float32)
    where = (a_words, a_scales_row, w_words, w_scales, row_g, row_h, c)
    strides = (n_blocks, stride_wn, stride_wsn)
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
        acc_g, acc_h = _block(now0, acc_g, acc_h)
        if U == 2:
            acc_g, acc_h = _block(now1, acc_g, acc_h)
    # the warps' partials meet (shared memory); every lane of a row holds the same sum, lane c = 0's is taken
    sum_g = tl.reshape(tl.sum(tl.reshape(acc_g, [WARPS, 32]), axis=0), [8, 4])
    sum_h = tl.reshape(tl.sum(tl.reshape(acc_h, [WARPS, 32]), axis=0), [8, 4])
    first_lane = (tl.arange(0, 4) == 0)[None, :]
    lo = tl.sum(tl.where(first_lane, sum_g, 0.0), axis=1)
    hi = tl.sum(tl.where(first_lane, sum_h, 0.0), axis=1)
    return tl.reshape(tl.permute(tl.join(lo, hi), [1, 0]), [16])
