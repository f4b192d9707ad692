"""The numpy PTX interpreter that checks the packed MXFP4 decode (suites/gemm/ptx_subset.py), against values
worked out from the PTX ISA's definitions: lop3's truth-table immediates, shifts at and past the register
width, and bf16x2 multiplies that must round (to nearest, ties to even), overflow, or meet NaN."""

from __future__ import annotations

import numpy as np
import pytest

from suites.gemm import ptx_subset

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
