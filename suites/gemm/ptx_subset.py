"""A numpy interpreter for the few PTX instructions of the kernels' inline-assembly decoders, so the CPU tier
checks the very text a GPU runs (the Triton interpreter runs no PTX).

Instructions: mov.b32, shl.b32, shr.u32, shf.r.wrap.b32, and.b32, lop3.b32 and mul.rn.bf16x2, with operands
`$N` (Triton's numbered asm arguments), names declared by `.reg .b32` and integer literals (decimal or 0x hex).
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


def run(asm: str, args: dict[int, np.ndarray]) -> dict[int, np.ndarray]:
    """Run `asm` with the `$N` registers in `args` (uint32 arrays); returns every `$N` register afterwards."""
    regs: dict[str, np.ndarray] = {f"${k}": np.asarray(v, dtype=np.uint32) for k, v in args.items()}
    shape = next(iter(regs.values())).shape

    def value(token: str) -> np.ndarray:
        token = token.strip()
        if token in regs:
            return regs[token]
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
        op, operands = match.group(1), [t.strip() for t in match.group(2).split(",")]
        dest, sources = operands[0], operands[1:]
        if op == "mov.b32":
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
        else:
            raise ValueError(f"asm: {op} is not in this interpreter's subset")
        regs[dest] = result.astype(np.uint32)
    return {int(k[1:]): v for k, v in regs.items() if k.startswith("$")}
