"""A numpy interpreter for the few PTX instructions of the kernels' inline assembly, so the CPU tier checks the
very text a GPU runs (the Triton interpreter runs no PTX).

Instructions: mov.b32, shl.b32, shr.u32, shf.r.wrap.b32, and.b32, lop3.b32 and mul.rn.bf16x2, with operands
`$N` (Triton's numbered asm arguments), names declared by `.reg` and integer literals (decimal or 0x hex); and for
the FP8-cache decode's blocks (kernels/paged_decode_fp8_mma.py): mov.b32 / mov.f32 (a `{lo, hi}` destination
splits a word into its 16-bit halves; `0f` + 8 hex digits is an f32 literal), mul.rn.f32, prmt.b32 (the default
mode: byte i of the result is byte sel[4i + 2 : 4i] of {b, a}), cvt.rn.f16x2.e4m3x2 (two E4M3 codes of a 16-bit
value, low byte to the low half), cvt.rn.f16x2.f32 d, a, b (a to the high half, b to the low, each rounded to
nearest even), and the warp-wide mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32, movmatrix.sync.aligned.m8n8
.trans.b16 and shfl.sync.bfly.b32 over each 32 consecutive lanes, in the PTX ISA's fragment layouts (lane l: g = l
// 4, c = l % 4; A registers (row g, k 2c..2c+1), (g + 8, 2c..), (g, 2c + 8..), (g + 8, 2c + 8..); B (k 2c..2c+1,
column g), (2c + 8.., g); C/D (g, 2c), (g, 2c + 1), (g + 8, 2c), (g + 8, 2c + 1)). The MMA sums exact products in
float64 and rounds once to float32: the same value as the tensor cores wherever their fp32 sums are exact (the
suites' operands are small integers).
Semantics from the PTX ISA: shifts by 32 or more give 0; shf.r.wrap.b32 d, a, b, n is the low word of the 64-bit b:a
shifted right by n mod 32 (with a = b, a rotation); lop3's immediate is the truth table of f(a, b, c) indexed by
(a << 2) | (b << 1) | c (a = 0xF0, b = 0xCC, c = 0xAA); mul.rn.bf16x2 multiplies the two bf16 halves of each
operand independently, rounding to nearest even (here in float32, then to bf16, which is exact for the
decoders' products: a few significant bits times a power of two). Registers are uint32 numpy arrays, one
lane per element, so one call runs the block over every input at once.
"""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np

_LINE = re.compile(r"^([a-z0-9.]+)\s+(.*);$")


def _bf16x2_mul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    halves = []
    for shift in (0, 16):
        x = ((a >> shift) & 0xFFFF).astype(np.uint16).view(ml_dtypes.bfloat16).astype(np.float32)
        y = ((b >> shift) & 0xFFFF).astype(np.uint16).view(ml_dtypes.bfloat16).astype(np.float32)
        with np.errstate(over="ignore", invalid="ignore"):  # Inf and NaN are results like any other
            product = x * y
        halves.append(product.astype(ml_dtypes.bfloat16).view(np.uint16).astype(np.uint32))
    return halves[0] | (halves[1] << 16)


def _lop3(a: np.ndarray, b: np.ndarray, c: np.ndarray, lut: int) -> np.ndarray:
    out = np.zeros_like(a)
    for index in range(8):
        if lut >> index & 1:
            term = a if index & 4 else ~a
            term = term & (b if index & 2 else ~b)
            out |= term & (c if index & 1 else ~c)
    return out


def _operands(text: str) -> list[str | list[str]]:
    """Top-level comma-separated operands; a `{a, b, ...}` group is a list of names."""
    out, depth, token = [], 0, ""
    for ch in text:
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(token.strip())
            token = ""
        else:
            token += ch
    out.append(token.strip())
    return [[t.strip() for t in o[1:-1].split(",")] if o.startswith("{") else o for o in out]


def _f32(bits: np.ndarray) -> np.ndarray:
    return bits.astype(np.uint32).view(np.float32)


def _f16_pair(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Two float arrays rounded (to nearest even) to fp16, packed low | high << 16."""
    with np.errstate(over="ignore", invalid="ignore"):
        lo16 = np.asarray(lo, np.float32).astype(np.float16).view(np.uint16).astype(np.uint32)
        hi16 = np.asarray(hi, np.float32).astype(np.float16).view(np.uint16).astype(np.uint32)
    return lo16 | (hi16 << 16)


def _halves_f16(word: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    lo = (word & 0xFFFF).astype(np.uint16).view(np.float16).astype(np.float64)
    hi = (word >> 16).astype(np.uint16).view(np.float16).astype(np.float64)
    return lo, hi


def _warps(x: np.ndarray) -> np.ndarray:
    if x.shape[-1] % 32:
        raise ValueError(f"asm: a warp-wide instruction needs lanes in whole warps, got {x.shape[-1]}")
    return x.reshape(-1, 32)


def _mma_m16n8k16(a: list[np.ndarray], b: list[np.ndarray], c: list[np.ndarray]) -> list[np.ndarray]:
    """D = A B + C per warp, fragments in and out as the module docstring lays them."""
    lane = np.arange(32)
    g, k = lane // 4, 2 * (lane % 4)
    w = _warps(a[0]).shape[0]
    big_a, big_b = np.zeros((w, 16, 16)), np.zeros((w, 16, 8))
    for reg, (row, col) in zip(a, ((g, k), (g + 8, k), (g, k + 8), (g + 8, k + 8)), strict=True):
        lo, hi = _halves_f16(_warps(reg))
        big_a[:, row, col], big_a[:, row, col + 1] = lo, hi
    for reg, rows in zip(b, (k, k + 8), strict=True):
        lo, hi = _halves_f16(_warps(reg))
        big_b[:, rows, g], big_b[:, rows + 1, g] = lo, hi
    product = big_a @ big_b
    out = []
    for reg, (row, col) in zip(c, ((g, k), (g, k + 1), (g + 8, k), (g + 8, k + 1)), strict=True):
        total = product[:, row, col] + _f32(_warps(reg)).astype(np.float64)
        out.append(total.astype(np.float32).view(np.uint32).reshape(reg.shape))
    return out


def _movmatrix_trans(a: np.ndarray) -> np.ndarray:
    """An 8 x 8 b16 matrix per warp (lane l holds row l // 4, columns 2 (l % 4) and + 1), transposed."""
    lane = np.arange(32)
    g, k = lane // 4, 2 * (lane % 4)
    words = _warps(a)
    m = np.zeros((words.shape[0], 8, 8), np.uint32)
    m[:, g, k], m[:, g, k + 1] = words & 0xFFFF, words >> 16
    t = m.transpose(0, 2, 1)
    return (t[:, g, k] | (t[:, g, k + 1] << 16)).reshape(a.shape)


def _prmt(a: np.ndarray, b: np.ndarray, sel: int) -> np.ndarray:
    both = a.astype(np.uint64) | (b.astype(np.uint64) << np.uint64(32))
    out = np.zeros_like(a)
    for i in range(4):
        nibble = sel >> (4 * i) & 0xF
        if nibble & 8:
            raise ValueError("asm: prmt's sign-replicating selectors are not in this interpreter's subset")
        byte = (both >> np.uint64(8 * nibble)) & np.uint64(0xFF)
        out |= byte.astype(np.uint32) << np.uint32(8 * i)
    return out


def _e4m3x2_to_f16x2(h: np.ndarray) -> np.ndarray:
    codes = (h & 0xFFFF).astype(np.uint16).view(np.uint8).reshape(*h.shape, 2)
    values = codes.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    return _f16_pair(values[..., 0], values[..., 1])


def run(asm: str, args: dict[int, np.ndarray]) -> dict[int, np.ndarray]:
    """Run `asm` with the `$N` registers in `args` (uint32 arrays, f32 as their bits); returns every `$N` register
    afterwards."""
    regs: dict[str, np.ndarray] = {f"${k}": np.asarray(v, dtype=np.uint32) for k, v in args.items()}
    shape = next(iter(regs.values())).shape

    def value(token: str) -> np.ndarray:
        token = token.strip()
        if token in regs:
            return regs[token]
        if re.fullmatch(r"0f[0-9a-fA-F]{8}", token):
            return np.full(shape, int(token[2:], 16), dtype=np.uint32)
        if re.fullmatch(r"-?(0x[0-9a-fA-F]+|\d+)", token):
            return np.full(shape, int(token, 0) & 0xFFFFFFFF, dtype=np.uint32)
        raise ValueError(f"asm: register {token!r} read before it is written")

    for raw in asm.splitlines():
        line = raw.strip()
        if not line or line in "{}" or line.startswith(".reg") or line.startswith("//"):
            continue
        match = _LINE.match(line)
        if match is None:
            raise ValueError(f"asm: cannot parse {line!r}")
        op, operands = match.group(1), _operands(match.group(2))
        dest, sources = operands[0], operands[1:]
        if op.startswith("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"):
            a, b, c = ([value(t) for t in group] for group in sources)
            for name, result in zip(dest, _mma_m16n8k16(a, b, c), strict=True):
                regs[name] = result
            continue
        if isinstance(dest, list):  # mov.b32 {lo, hi}, word
            if op != "mov.b32":
                raise ValueError(f"asm: a {{lo, hi}} destination is in this subset for mov.b32 only, not {op}")
            word = value(sources[0])
            regs[dest[0]], regs[dest[1]] = word & 0xFFFF, word >> 16
            continue
        if op in ("mov.b32", "mov.f32"):
            result = value(sources[0])
        elif op in ("shl.b32", "shr.u32"):
            a, n = value(sources[0]), int(sources[1], 0)
            result = (
                np.zeros(shape, np.uint32) if n >= 32 else (a << np.uint32(n) if op == "shl.b32" else a >> np.uint32(n))
            )
        elif op == "shf.r.wrap.b32":
            lo, hi, n = value(sources[0]), value(sources[1]), int(sources[2], 0) % 32
            both = lo.astype(np.uint64) | (hi.astype(np.uint64) << np.uint64(32))
            result = ((both >> np.uint64(n)) & np.uint64(0xFFFFFFFF)).astype(np.uint32)
        elif op == "and.b32":
            result = value(sources[0]) & value(sources[1])
        elif op == "lop3.b32":
            result = _lop3(value(sources[0]), value(sources[1]), value(sources[2]), int(sources[3], 0))
        elif op == "mul.rn.bf16x2":
            result = _bf16x2_mul(value(sources[0]), value(sources[1]))
        elif op == "mul.rn.f32":
            with np.errstate(over="ignore", invalid="ignore"):
                result = (_f32(value(sources[0])) * _f32(value(sources[1]))).view(np.uint32)
        elif op == "prmt.b32":
            result = _prmt(value(sources[0]), value(sources[1]), int(sources[2], 0))
        elif op == "cvt.rn.f16x2.e4m3x2":
            result = _e4m3x2_to_f16x2(value(sources[0]))
        elif op == "cvt.rn.f16x2.f32":
            result = _f16_pair(_f32(value(sources[1])), _f32(value(sources[0])))
        elif op == "movmatrix.sync.aligned.m8n8.trans.b16":
            result = _movmatrix_trans(value(sources[0]))
        elif op == "shfl.sync.bfly.b32":
            lanes = np.arange(32) ^ int(sources[1], 0)
            result = _warps(value(sources[0]))[:, lanes].reshape(shape)
        else:
            raise ValueError(f"asm: {op} is not in this interpreter's subset")
        regs[dest] = result.astype(np.uint32)
    return {int(k[1:]): v for k, v in regs.items() if k.startswith("$")}
