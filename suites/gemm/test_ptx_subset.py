"""The numpy PTX interpreter that checks the packed MXFP4 decode (suites/ptx_subset.py), against values
worked out from the PTX ISA's definitions: lop3's truth-table immediates, shifts at and past the register
width, and bf16x2 multiplies that must round (to nearest, ties to even), overflow, or meet NaN."""

from __future__ import annotations

import numpy as np
import pytest

from suites import ptx_subset

A, B, C = 0xF0F0_1234, 0xCCCC_5678, 0xAAAA_9ABC


def one(asm: str, **regs: int) -> int:
    args = {int(k[1:]): np.array([v], dtype=np.uint32) for k, v in regs.items()}
    return int(ptx_subset.run(asm, args)[0][0])


@pytest.mark.parametrize(
    ("lut", "want"),
    [
        (0xE4, (C & A) | (~C & B)),  # c ? a : b, the decode's select
        (0x96, A ^ B ^ C),
        (0x80, A & B & C),
        (0xFE, A | B | C),
        (0x00, 0),
        (0xFF, 0xFFFFFFFF),
    ],
)
def test_lop3_truth_tables(lut, want):
    assert one(f"lop3.b32 $0, $1, $2, $3, {lut:#x};", r1=A, r2=B, r3=C) == want & 0xFFFFFFFF


@pytest.mark.parametrize(
    ("op", "n", "want"),
    [("shl.b32", 4, 0x0F0_12340), ("shr.u32", 4, 0x0F0F_0123), ("shl.b32", 32, 0), ("shr.u32", 40, 0)],
)
def test_shifts(op, n, want):
    assert one(f"{op} $0, $1, {n};", r1=A) == want & 0xFFFFFFFF


@pytest.mark.parametrize(
    ("a", "b", "want"),
    [
        (0x3F80_4000, 0x4040_3FC0, 0x4040_4040),  # (1, 2) * (3, 1.5) = (3, 3)
        (0x3F81_3F81, 0x3F81_3F80, 0x3F82_3F81),  # 1.0078125**2 = 1.01568..: rounds to 1.015625 (0x3F82)
        (0x7F00_0000, 0x4000_0000, 0x7F80_0000),  # 2**127 * 2 overflows to +Inf; 0 * 0 = 0 in the low half
        (0x7FC0_3F80, 0x3F80_7FC0, 0x7FC0_7FC0),  # NaN in either operand gives NaN
        (0x0001_8000, 0x4000_3F80, 0x0002_8000),  # a subnormal doubles exactly; -0 * 1 = -0
    ],
)
def test_bf16x2_multiply_rounds_each_half(a, b, want):
    got = one("mul.rn.bf16x2 $0, $1, $2;", r1=a, r2=b)
    for shift in (0, 16):
        g, w = got >> shift & 0xFFFF, want >> shift & 0xFFFF
        assert g == w or ((g & 0x7FFF) > 0x7F80 and (w & 0x7FFF) > 0x7F80), f"{got:#010x} != {want:#010x}"


def test_named_registers_and_unknown_instructions():
    assert one(".reg .b32 t;\nmov.b32 t, 0x12;\nand.b32 $0, t, $1;", r1=0x10) == 0x10
    with pytest.raises(ValueError, match="not in this interpreter's subset"):
        one("add.u32 $0, $1, 1;", r1=1)
    with pytest.raises(ValueError, match="read before it is written"):
        one("and.b32 $0, t, $1;", r1=1)


def test_prmt_picks_bytes_of_b_a():
    """Selector nibble i names the byte of {b, a} (a's bytes 0..3, b's 4..7) that lands in byte i."""
    assert one("prmt.b32 $0, $1, $2, 0x5140;", r1=0x44332211, r2=0x88776655) == 0x66225511
    assert one("prmt.b32 $0, $1, $2, 0x7362;", r1=0x44332211, r2=0x88776655) == 0x88447733


def test_fp16_pair_conversions():
    """cvt.rn.f16x2.f32 d, a, b puts a in the high half; cvt.rn.f16x2.e4m3x2 puts the low code in the low half
    (E4M3 0x38 is 1.0, 0x40 is 2.0; fp16 0x3C00 and 0x4000); an f32 literal is 0f and its 8 hex digits."""
    asm = "mov.f32 $3, 0f3F800000;\ncvt.rn.f16x2.f32 $0, $1, $3;"
    assert one(asm, r1=0x40000000, r3=0) == 0x40003C00
    assert one("cvt.rn.f16x2.e4m3x2 $0, $1;", r1=0x4038) == 0x40003C00


def test_warp_instructions_follow_the_fragment_layouts():
    """movmatrix: lane l's (row l // 4, columns 2 (l % 4), + 1) of the transpose; mma.sync m16n8k16 with A = I
    (rows 0..15) gives D = B's first 16 rows (k) back as rows; shfl.sync.bfly swaps lanes l and l ^ mask."""
    lane = np.arange(32)
    g, k = lane // 4, 2 * (lane % 4)
    m = np.arange(64).reshape(8, 8)  # element (r, c) = 8r + c
    words = (m[g, k] | (m[g, k + 1] << 16)).astype(np.uint32)
    out = ptx_subset.run("movmatrix.sync.aligned.m8n8.trans.b16 $0, $1;", {0: words, 1: words})[0]
    assert np.array_equal(out & 0xFFFF, m.T[g, k]) and np.array_equal(out >> 16, m.T[g, k + 1])
    shuffled = ptx_subset.run("shfl.sync.bfly.b32 $0, $1, 4, 0x1f, 0xffffffff;", {0: lane, 1: lane})[0]
    assert np.array_equal(shuffled, lane ^ 4)

    def f16(x):
        return np.asarray(x, np.float16).view(np.uint16).astype(np.uint32)

    eye = [f16(g == k) | f16(g == k + 1) << 16, f16(g + 8 == k) | f16(g + 8 == k + 1) << 16]
    eye += [f16(g == k + 8) | f16(g == k + 9) << 16, f16(g + 8 == k + 8) | f16(g + 8 == k + 9) << 16]
    b = np.arange(16 * 8).reshape(16, 8) % 7  # B[k, n]
    frag_b = [f16(b[k, g]) | f16(b[k + 1, g]) << 16, f16(b[k + 8, g]) | f16(b[k + 9, g]) << 16]
    args = dict(enumerate([*eye, *frag_b], start=4))
    args |= {i: np.zeros(32, np.uint32) for i in (*range(4), *range(10, 14))}
    mma = "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {$0,$1,$2,$3}, {$4,$5,$6,$7}, {$8,$9}, {$10,$11,$12,$13};"
    d = ptx_subset.run(mma, args)
    for i, (row, col) in enumerate(((g, k), (g, k + 1), (g + 8, k), (g + 8, k + 1))):
        assert np.array_equal(d[i].view(np.float32), b[row, col].astype(np.float32)), f"D register {i}"
