"""Paged decode over an FP8 cache with the codes going to the tensor cores from the registers they were loaded into:
`kernels.paged_decode`'s split kernel for FP8 caches on NVIDIA sm_90+ (`kernels._packed_ptx`), head size 128 and
GQA groups of up to 8, in Triton with inline PTX (`mma.sync.m16n8k16` f16, `movmatrix`, `prmt`). Same arguments,
same outputs and the same arithmetic as that kernel (`reference.attention.paged.paged_decode_mirror`'s contract).

Why: Triton's `tl.dot` takes both operands through shared memory in its own layout, so the generic kernel's FP8
codes cross shared memory four times a tile (in, out as words, back as fp16, out for the MMA) and its M of 16
query rows holds a group of 4 (3/4 of each MMA and softmax wasted); on the H200 it reads the codes at 0.66x memcpy.
Here each lane loads exactly the bytes of its MMA fragments, converts them in registers and never touches shared
memory in the loop.

Layout. Thread tensors have one element a thread (shape [32 * WARPS]); lane (g, c) = (lane // 4, lane % 4) of the
`mma.sync` fragment layouts. A warp takes 16 tokens at a time (SUB sub-tiles of 16 an iteration, the warps in turns):
- Scores, tokens as M: S^T [16 tokens, 8 heads] = K [16, 128] . q^T [128, 8] in 8 k16 MMAs. A dot product does not
  care in which order its terms meet, so long as both operands use the same order: logical k (2c, 2c + 1, 2c + 8,
  2c + 9) of k16 chunk j is physical d 32c + 4j + (0, 1, 2, 3), and each lane reads its two token rows (g, g + 8) as
  32 contiguous bytes each, converts them with one `cvt.rn.f16x2.e4m3x2` a code pair, and holds q's matching 32
  elements (fp16 pairs) as the B fragments, loaded once. The group's heads are the MMA's 8 columns (padding heads
  past the group compute zeros). The C fragment holds S^T at tokens (g, g + 8) and heads (2c, 2c + 1).
- Softmax per head along tokens: maxima and sums over the 8 lanes of a column (shuffles over lane bits 2..4).
- P^T to B fragments: p times its token's V scale, rounded to fp16 (two `cvt.rn.f16x2.f32`), then `movmatrix.trans`
  twice turns the C fragment (tokens as rows) into the B fragment of the next MMA (tokens as k).
- O^T [128 d, 8 heads] += V^T [128, 16 tokens] . P^T [16, 8] in 8 m16 MMAs; rows of M-tile i are physical d
  16g + 2i (row g) and 16g + 2i + 1 (row g + 8), so each lane reads 16 contiguous bytes of each of its four tokens
  (2c, 2c + 1, 2c + 8, 2c + 9) and two `prmt` a tile pair the bytes of two tokens into one code pair per d.
- At the end the warps' (m, l, acc) combine through shared memory (Triton reductions), and each lane stores d
  16g .. 16g + 15 of heads 2c and 2c + 1.

Arithmetic, as the generic kernel's: q (bf16) scaled by the power of two that puts its group's largest |q| in
[2**14, 2**15) and rounded to fp16 (exact for a model's q), exact fp16 products summed in fp32 by the tensor cores,
the score times q's power back, then its K scale, then the softmax scale (log2 e folded in); p = 2^(s - m) in fp32
against the running maximum of each iteration's SUB * 16 tokens; p * (v_scale * down) rounded to fp16, down the
power of two that puts the iteration's largest V scale in [2**14, 2**15); the MMA sums (that) x code in fp32. The
accumulator is kept in units of that power of two and rescaled (exactly, by powers of two and the softmax's alpha)
when it changes. Only the order of the fp32 sums differs from the generic kernel, inside the ("paged_decode", dtype)
rows of kernels.tolerances.
"""

# ruff: noqa: RUF005 -- Triton's JIT builds tuples by concatenation: it has no starred items in a tuple display.
from __future__ import annotations

import triton
import triton.language as tl

from kernels._e4m3 import fp16_range
from kernels._paged import split_of_program
from kernels._pdl import wait_then_release
from kernels._tiles import mma_lanes, split4

HEAD = 128  # the only head size this kernel takes (4 lanes x 32 bytes of a K row; 8 lanes x 16 bytes of a V row)
MAX_GROUP = 8  # query heads a KV head: the MMA's 8 columns
HEAD_SIZE = tl.constexpr(HEAD)  # the same, for the kernel (partials are [.., HEAD] fp32 rows)
MMA = "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"


def _qk_ptx() -> str:
    """S^T of one sub-tile for one lane. Operands: $0 .. $3 the scores (token g: heads 2c, 2c + 1; token g + 8: the
    same); inputs token g's 8 words ($4 .. $11), token g + 8's ($12 .. $19), q's 16 fp16-pair words ($20 .. $35)."""
    s = "{\n.reg .b16 l<2>, h<2>;\n.reg .b32 a<4>;\n.reg .f32 d<4>, z;\nmov.f32 z, 0f00000000;\n"
    for j in range(8):
        s += f"mov.b32 {{l0, h0}}, ${4 + j};\nmov.b32 {{l1, h1}}, ${12 + j};\n"
        s += "cvt.rn.f16x2.e4m3x2 a0, l0;\ncvt.rn.f16x2.e4m3x2 a1, l1;\n"
        s += "cvt.rn.f16x2.e4m3x2 a2, h0;\ncvt.rn.f16x2.e4m3x2 a3, h1;\n"
        acc = "{z,z,z,z}" if j == 0 else "{d0,d1,d2,d3}"
        s += f"{MMA} {{d0,d1,d2,d3}}, {{a0,a1,a2,a3}}, {{${20 + 2 * j},${21 + 2 * j}}}, {acc};\n"
    return s + "".join(f"mov.f32 ${i}, d{i};\n" for i in range(4)) + "}"


def _pv_ptx() -> str:
    """M-tiles 2w and 2w + 1 of O^T += V^T . P^T for one lane. Operands: $0 .. $7 the new accumulators (tile 2w's
    four, then 2w + 1's: rows g, g + 8 x heads 2c, 2c + 1 as the C fragment orders them); inputs word w of tokens
    2c, 2c + 1, 2c + 8, 2c + 9 ($8 .. $11), P^T's B fragment ($12, $13), the accumulators ($14 .. $21)."""
    s = "{\n.reg .b32 u, v, a<4>;\n.reg .b16 ul, uh, vl, vh;\n.reg .f32 o<8>;\n"
    for e, sel in ((0, "0x5140"), (1, "0x7362")):  # bytes (2e, 2e + 1) of both tokens of a pair: d rows g, g + 8
        s += f"prmt.b32 u, $8, $9, {sel};\nprmt.b32 v, $10, $11, {sel};\n"
        s += "mov.b32 {ul, uh}, u;\nmov.b32 {vl, vh}, v;\n"
        s += "cvt.rn.f16x2.e4m3x2 a0, ul;\ncvt.rn.f16x2.e4m3x2 a1, uh;\n"
        s += "cvt.rn.f16x2.e4m3x2 a2, vl;\ncvt.rn.f16x2.e4m3x2 a3, vh;\n"
        out = ",".join(f"o{4 * e + i}" for i in range(4))
        acc = ",".join(f"${14 + 4 * e + i}" for i in range(4))
        s += f"{MMA} {{{out}}}, {{a0,a1,a2,a3}}, {{$12,$13}}, {{{acc}}};\n"
    return s + "".join(f"mov.f32 ${i}, o{i};\n" for i in range(8)) + "}"


QK_PTX = tl.constexpr(_qk_ptx())
PV_PTX = tl.constexpr(_pv_ptx())
# P^T's B fragment: (p at token g, heads 2c, 2c + 1) and (token g + 8) as fp16 pairs, each 8 x 8 block transposed.
P_PTX = tl.constexpr(
    "{\n.reg .b32 x, y;\ncvt.rn.f16x2.f32 x, $3, $2;\ncvt.rn.f16x2.f32 y, $5, $4;\n"
    "movmatrix.sync.aligned.m8n8.trans.b16 $0, x;\nmovmatrix.sync.aligned.m8n8.trans.b16 $1, y;\n}"
)
# A bf16 pair times a power of two, rounded to an fp16 pair (low element in the low half).
Q_PTX = tl.constexpr(
    "{\n.reg .b32 t;\n.reg .f32 lo, hi;\nshl.b32 t, $1, 16;\nmov.b32 lo, t;\nand.b32 t, $1, 0xFFFF0000;\n"
    "mov.b32 hi, t;\nmul.rn.f32 lo, lo, $2;\nmul.rn.f32 hi, hi, $2;\ncvt.rn.f16x2.f32 $0, hi, lo;\n}"
)


@triton.jit
def _shfl_max(v, WHOLE_WARP: tl.constexpr):
    """v's maximum over the 8 lanes g of each fragment column c, or over the whole warp."""
    if WHOLE_WARP:
        v = tl.maximum(v, _shfl(v, 1))
        v = tl.maximum(v, _shfl(v, 2))
    v = tl.maximum(v, _shfl(v, 4))
    v = tl.maximum(v, _shfl(v, 8))
    return tl.maximum(v, _shfl(v, 16))


@triton.jit
def _shfl(v, MASK: tl.constexpr):
    """v of lane (lane ^ MASK), every lane of the warp taking part."""
    return tl.inline_asm_elementwise(
        f"shfl.sync.bfly.b32 $0, $1, {MASK}, 0x1f, 0xffffffff;", "=r,r", [v], dtype=v.dtype, is_pure=True, pack=1
    )


@triton.jit
def _column_sum(v):
    """v summed over the 8 lanes g of each column c."""
    v = v + _shfl(v, 4)
    v = v + _shfl(v, 8)
    return v + _shfl(v, 16)


@triton.jit
def _lane_words(ptr, at, live, QUADS: tl.constexpr):
    """4 * QUADS int32 words at word offsets at .. of every lane ([T]), 0 where not `live`: QUADS 16-byte loads."""
    four = tl.arange(0, 4)[None, :]
    words = ()
    for i in tl.static_range(QUADS):
        words = words + split4(tl.load(ptr + at[:, None] + 4 * i + four, mask=live[:, None], other=0))
    return words


@triton.jit
def _sub_loads(
    k_words, v_words, ks_ptr, vs_ptr, table_row, t0, end, lanes, strides, BLOCK_SIZE: tl.constexpr,
    FAULT: tl.constexpr,
):  # fmt: skip
    """Everything a lane reads for the 16 tokens from t0 (one cache block holds them: BLOCK_SIZE is a multiple of 16):
    K rows g and g + 8 (its 32 bytes each), V rows 2c, 2c + 1, 2c + 8, 2c + 9 (its 16 bytes each), the K and V scales
    of tokens g and g + 8, and whether tokens g and g + 8 are read. `lanes`: the lane's offsets within a block
    (`_lane_offsets`)."""
    kb, kp, vb, vp, ksb, ksp, vsb, vsp = strides
    g, c, k_off, v_offs, ks_off, vs_off = lanes
    logical = t0 // BLOCK_SIZE
    if FAULT == 1:  # "block_table_off_by_one"
        logical += 1
    block = tl.load(table_row + logical, mask=t0 < end, other=0).to(tl.int64)
    pos = t0 % BLOCK_SIZE
    live_g = t0 + g < end
    live_h = t0 + g + 8 < end
    k_at = block * kb + pos * kp + k_off
    k_g = _lane_words(k_words, k_at, live_g, 2)
    k_h = _lane_words(k_words, k_at + 8 * kp, live_h, 2)
    v_at = block * vb + pos * vp
    v_rows = ()
    for r in tl.static_range(4):
        live = t0 + 2 * c + (r % 2) + 8 * (r // 2) < end
        v_rows = v_rows + (_lane_words(v_words, v_at + v_offs[r], live, 1),)
    ks_at = ks_ptr + block * ksb + pos * ksp + ks_off
    vs_at = vs_ptr + block * vsb + pos * vsp + vs_off
    ks_g = tl.load(ks_at, mask=live_g, other=0.0)
    ks_h = tl.load(ks_at + 8 * ksp, mask=live_h, other=0.0)
    vs_g = tl.load(vs_at, mask=live_g, other=0.0)
    vs_h = tl.load(vs_at + 8 * vsp, mask=live_h, other=0.0)
    return k_g, k_h, v_rows, ks_g, ks_h, vs_g, vs_h, live_g, live_h


@triton.jit
def _lane_offsets(g, c, kv_head, k_pos, k_head, v_pos, v_head, ks_pos, ks_head, vs_pos, vs_head):
    """The lane's offsets within a cache block, hoisted out of the loop: K row g's 32 bytes (words), V rows 2c, 2c + 1,
    2c + 8, 2c + 9's 16 bytes (words), the scales of token g."""
    v_offs = ()
    for r in tl.static_range(4):
        v_offs = v_offs + ((2 * c + (r % 2) + 8 * (r // 2)) * v_pos + kv_head * v_head + 4 * g,)
    k_off = g * k_pos + kv_head * k_head + 8 * c
    return g, c, k_off, v_offs, g * ks_pos + kv_head * ks_head, g * vs_pos + kv_head * vs_head


@triton.jit
def _iteration_loads(
    k_words, v_words, ks_ptr, vs_ptr, table_row, t0, end, lanes, strides, SUB: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, FAULT: tl.constexpr,
):  # fmt: skip
    """`_sub_loads` of the SUB sub-tiles from t0."""
    subs = ()
    for s in tl.static_range(SUB):
        here = (k_words, v_words, ks_ptr, vs_ptr, table_row, t0 + 16 * s, end, lanes, strides)
        subs = subs + (_sub_loads(*here, BLOCK_SIZE, FAULT),)
    return subs


@triton.jit
def _scores(sub, q_words, q_up, qk_scale):
    """The sub-tile's 4 scores of this lane in the log2 domain (-inf for tokens not read)."""
    k_g, k_h, _, ks_g, ks_h, _, _, live_g, live_h = sub
    d0, d1, d2, d3 = tl.inline_asm_elementwise(
        QK_PTX, "=f,=f,=f,=f" + ",r" * 32, k_g + k_h + q_words, dtype=(tl.float32,) * 4, is_pure=True, pack=1
    )
    s0 = tl.where(live_g, d0 * q_up * ks_g * qk_scale, float("-inf"))
    s1 = tl.where(live_g, d1 * q_up * ks_g * qk_scale, float("-inf"))
    s2 = tl.where(live_h, d2 * q_up * ks_h * qk_scale, float("-inf"))
    s3 = tl.where(live_h, d3 * q_up * ks_h * qk_scale, float("-inf"))
    return s0, s1, s2, s3


@triton.jit
def _iteration(subs, q_words, q_up, qk_scale, state, SUB: tl.constexpr):
    """One iteration's online-softmax step: state (m_a, m_b, l_a, l_b, unit, acc) -> the next. m and l per head
    (a: 2c, b: 2c + 1), acc the 32 O^T accumulators in units of `unit` (a power of two: true = acc * unit)."""
    m_a, m_b, l_a, l_b, unit, acc = state
    scores = ()
    top_a = tl.full(m_a.shape, float("-inf"), tl.float32)
    top_b = top_a
    v_top = tl.zeros(m_a.shape, tl.float32)
    for s in tl.static_range(SUB):
        s0, s1, s2, s3 = _scores(subs[s], q_words, q_up, qk_scale)
        scores = scores + ((s0, s1, s2, s3),)
        top_a = tl.maximum(top_a, tl.maximum(s0, s2))
        top_b = tl.maximum(top_b, tl.maximum(s1, s3))
        v_top = tl.maximum(v_top, tl.maximum(subs[s][5], subs[s][6]))
    top_a = _shfl_max(top_a, False)
    top_b = _shfl_max(top_b, False)
    v_top = _shfl_max(v_top, False)
    down, up = fp16_range(v_top)
    # No token read (or every V scale 0): keep the units, so the accumulator is not rescaled for nothing.
    up = tl.where(v_top > 0.0, up, unit)
    down = tl.where(v_top > 0.0, down, 1.0 / unit)
    new_a = tl.maximum(m_a, top_a)
    new_b = tl.maximum(m_b, top_b)
    use_a = tl.where(new_a == float("-inf"), 0.0, new_a)  # no score yet: p = 2^-inf = 0, alpha 0 on zeros
    use_b = tl.where(new_b == float("-inf"), 0.0, new_b)
    alpha_a = tl.exp2(m_a - use_a)
    alpha_b = tl.exp2(m_b - use_b)
    f_a = alpha_a * (unit / up)  # unit / up: a power of two, exact
    f_b = alpha_b * (unit / up)
    scaled = ()
    for i in tl.static_range(32):
        scaled = scaled + (acc[i] * (f_a if i % 2 == 0 else f_b),)
    acc = scaled
    l_a = l_a * alpha_a
    l_b = l_b * alpha_b
    for s in tl.static_range(SUB):
        s0, s1, s2, s3 = scores[s]
        vs_g = subs[s][5] * down
        vs_h = subs[s][6] * down
        p0 = tl.exp2(s0 - use_a)
        p1 = tl.exp2(s1 - use_b)
        p2 = tl.exp2(s2 - use_a)
        p3 = tl.exp2(s3 - use_b)
        l_a = l_a + (p0 + p2)
        l_b = l_b + (p1 + p3)
        p_lo, p_hi = tl.inline_asm_elementwise(
            P_PTX, "=r,=r,f,f,f,f", [p0 * vs_g, p1 * vs_g, p2 * vs_h, p3 * vs_h],
            dtype=(tl.int32, tl.int32), is_pure=True, pack=1,
        )  # fmt: skip
        v_rows = subs[s][2]
        new = ()
        for w in tl.static_range(4):
            operands = (v_rows[0][w], v_rows[1][w], v_rows[2][w], v_rows[3][w], p_lo, p_hi)
            for t in tl.static_range(8):
                operands = operands + (acc[8 * w + t],)
            new = new + tl.inline_asm_elementwise(
                PV_PTX, "=f,=f,=f,=f,=f,=f,=f,=f" + ",r" * 6 + ",f" * 8, operands, dtype=(tl.float32,) * 8,
                is_pure=True, pack=1,
            )  # fmt: skip
        acc = new
    return new_a, new_b, l_a, l_b, up, acc


@triton.jit
def _q_fragment(q_ptr, seq, kv_head, g, c, q_seq_stride, q_head_stride, GROUP: tl.constexpr):
    """q's B fragments for this lane (16 words: fp16 pairs of head g at d 32c .. 32c + 31) and the power of two the
    scores take back (1 for an fp16 q; a bf16 q is scaled into fp16's range, `fp16_range` of the group's largest)."""
    q_words = q_ptr.to(tl.pointer_type(tl.int32), bitcast=True)
    live = g < GROUP
    at = (seq * q_seq_stride + (kv_head * GROUP + g) * q_head_stride) // 2 + 16 * c
    w = _lane_words(q_words, at, live, 2) + _lane_words(q_words, at + 8, live, 2)
    up = tl.full(g.shape, 1.0, tl.float32)
    if q_ptr.dtype.element_ty == tl.bfloat16:
        top = tl.zeros(g.shape, tl.float32)
        for i in tl.static_range(16):
            lo = (w[i] << 16).to(tl.float32, bitcast=True)
            hi = (w[i] & -65536).to(tl.float32, bitcast=True)
            top = tl.maximum(top, tl.maximum(tl.abs(lo), tl.abs(hi)))
        down, up = fp16_range(_shfl_max(top, True))
        fp16 = ()
        for i in tl.static_range(16):
            fp16 = fp16 + (tl.inline_asm_elementwise(Q_PTX, "=r,r,f", [w[i], down], tl.int32, True, 1),)
        w = fp16
    return w, up


@triton.jit
def _store_heads(out_ptr, seq, kv_head, res, out_seq_stride, out_head_stride, GROUP: tl.constexpr):
    """The 32 results of each lane (32 lanes: [32] each; d 16g + 2i + r // 2 of head 2c + r % 2 for res[4i + r])."""
    lane = tl.arange(0, 32)
    g, c = lane // 4, lane % 4
    base = out_ptr + seq * out_seq_stride + (kv_head * GROUP + 2 * c) * out_head_stride + 16 * g
    for k in tl.static_range(32):
        head = 2 * c + (k % 4) % 2
        at = base + ((k % 4) % 2) * out_head_stride + 2 * (k // 4) + (k % 4) // 2
        tl.store(at, res[k].to(out_ptr.dtype.element_ty), mask=head < GROUP)


@triton.jit(do_not_specialize=("num_splits", "table_stride"))
def fp8_mma_split_kernel(
    q_ptr, k_ptr, v_ptr, table_ptr, seq_lens_ptr, acc_ptr, ml_ptr, out_ptr, qk_scale, num_splits,
    out_seq_stride, out_head_stride, q_seq_stride, q_head_stride,
    k_block_stride, k_pos_stride, k_head_stride, v_block_stride, v_pos_stride, v_head_stride, table_stride,
    ks_ptr, vs_ptr, ks_block_stride, ks_pos_stride, ks_head_stride, vs_block_stride, vs_pos_stride, vs_head_stride,
    GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr, WARPS: tl.constexpr, SUB: tl.constexpr, FAULT: tl.constexpr,
    DIRECT: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    # k/v strides in 32-bit words; program (sequence, KV head, split), as `kernels.paged_decode._split_kernel`.
    wait_then_release(PDL)  # kernels._pdl: before any read of an earlier kernel's output
    seq, kv_head, split, length, first, last = split_of_program(seq_lens_ptr, num_splits, BLOCK_SIZE)
    t_first = first * BLOCK_SIZE
    end = tl.minimum(last * BLOCK_SIZE, length)
    _, warp, g, c = mma_lanes(WARPS)
    q_words, q_up = _q_fragment(q_ptr, seq, kv_head, g, c, q_seq_stride, q_head_stride, GROUP)
    k_words = k_ptr.to(tl.pointer_type(tl.int32), bitcast=True)
    v_words = v_ptr.to(tl.pointer_type(tl.int32), bitcast=True)
    table_row = table_ptr + seq * table_stride
    strides = (
        k_block_stride, k_pos_stride, v_block_stride, v_pos_stride,
        ks_block_stride, ks_pos_stride, vs_block_stride, vs_pos_stride,
    )  # fmt: skip
    lanes = _lane_offsets(
        g, c, kv_head, k_pos_stride, k_head_stride, v_pos_stride, v_head_stride, ks_pos_stride, ks_head_stride,
        vs_pos_stride, vs_head_stride,
    )  # fmt: skip
    where = (k_words, v_words, ks_ptr, vs_ptr, table_row)
    TOKENS: tl.constexpr = 16 * SUB
    turns = tl.cdiv(tl.cdiv(end - t_first, TOKENS), WARPS)
    zero = tl.zeros(g.shape, tl.float32)
    ninf = tl.full(g.shape, float("-inf"), tl.float32)
    state = (ninf, ninf, zero, zero, zero + 1.0, (zero,) * 32)
    ahead = _iteration_loads(*where, t_first + warp * TOKENS, end, lanes, strides, SUB, BLOCK_SIZE, FAULT)
    for i in range(0, turns):
        now = ahead
        t_next = t_first + ((i + 1) * WARPS + warp) * TOKENS
        ahead = _iteration_loads(*where, t_next, end, lanes, strides, SUB, BLOCK_SIZE, FAULT)
        state = _iteration(now, q_words, q_up, qk_scale, state, SUB)
    m_a, m_b, l_a, l_b, unit, acc = state
    l_a = _column_sum(l_a)
    l_b = _column_sum(l_b)
    # The warps' partials, combined: weights 2^(m_w - M) (0 for a warp that read nothing), acc in true units.
    big_a = tl.max(tl.reshape(m_a, [WARPS, 32]), axis=0)
    big_b = tl.max(tl.reshape(m_b, [WARPS, 32]), axis=0)
    big_a = tl.where(big_a == float("-inf"), 0.0, big_a)
    big_b = tl.where(big_b == float("-inf"), 0.0, big_b)
    w_a = tl.exp2(tl.reshape(m_a, [WARPS, 32]) - big_a[None, :])
    w_b = tl.exp2(tl.reshape(m_b, [WARPS, 32]) - big_b[None, :])
    sum_a = tl.sum(w_a * tl.reshape(l_a, [WARPS, 32]), axis=0)
    sum_b = tl.sum(w_b * tl.reshape(l_b, [WARPS, 32]), axis=0)
    u = tl.reshape(unit, [WARPS, 32])
    res = ()
    for k in tl.static_range(32):
        res = res + (tl.sum((w_a if k % 2 == 0 else w_b) * (tl.reshape(acc[k], [WARPS, 32]) * u), axis=0),)
    if DIRECT:  # one split: out = acc / l (IEEE division), 0 where l = 0, as the generic kernel
        out = ()
        for k in tl.static_range(32):
            den = sum_a if k % 2 == 0 else sum_b
            out = out + (tl.where(den == 0.0, 0.0, tl.div_rn(res[k], tl.full(res[k].shape, 1.0, tl.float32) * den)),)
        _store_heads(out_ptr, seq, kv_head, out, out_seq_stride, out_head_stride, GROUP)
        return
    # [B, Hq, num_splits, HEAD] partials and [.., 2] (m, l), as the generic kernel writes them for the combine
    lane = tl.arange(0, 32)
    lg, lc = lane // 4, lane % 4
    for h in tl.static_range(2):
        head = kv_head * GROUP + 2 * lc + h
        row = (seq * tl.num_programs(1) * GROUP + head) * num_splits + split
        ok = 2 * lc + h < GROUP
        for k in tl.static_range(16):
            d = 16 * lg + 2 * (k // 2) + k % 2
            tl.store(acc_ptr + row * HEAD_SIZE + d, res[4 * (k // 2) + 2 * (k % 2) + h], mask=ok)
        tl.store(ml_ptr + row * 2, big_a if h == 0 else big_b, mask=ok)
        tl.store(ml_ptr + row * 2 + 1, sum_a if h == 0 else sum_b, mask=ok)
