"""The interpreter shim (suites/interpreter_shim.py): with it, Triton kernels under TRITON_INTERPRET=1 give
what GPU Triton gives; without it (`interpreter_shim.disabled()`), each upstream bug it works around shows.

The parity tests take the `device` fixture: on `--device cpu` they check the shimmed interpreter against
independent oracles (torch for bf16, ml_dtypes plus the sm_90 `cvt.rn.satfinite` rule for fp8); on
`--device cuda` the same tests check those oracles against the hardware. Tests of the shim's own machinery
run on cpu only.
"""

from __future__ import annotations

import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import torch
import triton
import triton.language as tl
from triton.runtime.errors import InterpreterError

from suites import interpreter_shim

ROOT = Path(__file__).resolve().parents[2]
FP8 = {  # name -> (torch dtype, ml_dtypes dtype, max finite)
    "e4nv": (torch.float8_e4m3fn, ml_dtypes.float8_e4m3fn, 448.0),
    "e5": (torch.float8_e5m2, ml_dtypes.float8_e5m2, 57344.0),
}


@triton.jit
def _convert_kernel(X, Y, n, ROUNDING: tl.constexpr, STORE_ONLY: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(X + offs, mask=offs < n)
    if STORE_ONLY:  # tl.store converts to the pointer's element type itself
        tl.store(Y + offs, x, mask=offs < n)
    else:
        tl.store(Y + offs, x.to(Y.dtype.element_ty, fp_downcast_rounding=ROUNDING), mask=offs < n)


@triton.jit
def _dot_kernel(A, B, C, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr):
    rm, rn, rk = tl.arange(0, M), tl.arange(0, N), tl.arange(0, K)
    a = tl.load(A + rm[:, None] * K + rk[None, :])
    b = tl.load(B + rk[:, None] * N + rn[None, :])
    tl.store(C + rm[:, None] * N + rn[None, :], tl.dot(a, b))


def convert(x: torch.Tensor, dtype: torch.dtype, device: str, rounding=None, store_only=False):
    """Run `_convert_kernel` over the 1-D tensor `x`; returns the result on the CPU. The interpreter costs
    about 1 ms a program whatever its size, so on cpu the whole tensor is one program."""
    x = x.to(device)
    y = torch.empty(x.shape, dtype=dtype, device=device)
    block = max(16, triton.next_power_of_2(x.numel())) if device == "cpu" else 1024
    grid = (triton.cdiv(x.numel(), block),)
    _convert_kernel[grid](x, y, x.numel(), ROUNDING=rounding, STORE_ONLY=store_only, BLOCK=block)
    return y.cpu()


def dot(a: torch.Tensor, b: torch.Tensor, device: str) -> torch.Tensor:
    (m, k), n = a.shape, b.shape[1]
    c = torch.empty((m, n), dtype=torch.float32, device=device)
    _dot_kernel[(1,)](a.to(device), b.to(device), c, M=m, N=n, K=k)
    return c.cpu()


def f32(bits) -> torch.Tensor:
    return torch.from_numpy(np.asarray(bits, dtype=np.uint32).view(np.float32).copy())


def bits_of(t: torch.Tensor) -> np.ndarray:
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()]).numpy()


def assert_same(got: torch.Tensor, want: torch.Tensor, inputs: torch.Tensor, what: str) -> None:
    """Bit-for-bit, except that a NaN only has to be a NaN."""
    g, w = got.float().numpy(), want.float().numpy()
    bad = ~((bits_of(got) == bits_of(want)) | (np.isnan(g) & np.isnan(w)))
    if bad.any():
        picked = zip(inputs[bad][:8].tolist(), g[bad][:8], w[bad][:8], strict=True)
        rows = [f"{x!r}: got {a!r}, want {b!r}" for x, a, b in picked]
        raise AssertionError(f"{what}: {bad.sum()} of {bad.size} differ, e.g.\n  " + "\n  ".join(rows))


def gpu_fp8(x: torch.Tensor, fmt: str) -> torch.Tensor:
    """Oracle for GPU Triton's x.to(fp8) on sm_90 (cvt.rn.satfinite): RTNE via ml_dtypes after clamping to
    +-max finite (that is the saturation, +-Inf included); every NaN becomes 0x7F."""
    torch_dtype, ml_dtype, fmax = FP8[fmt]
    v = x.float().numpy()
    with np.errstate(invalid="ignore"):  # NaN inputs
        bits = np.clip(v, -fmax, fmax).astype(ml_dtype).view(np.uint8)
    return torch.from_numpy(np.where(np.isnan(v), np.uint8(0x7F), bits)).view(torch_dtype)


def cpu_only(device: str) -> None:
    if device != "cpu":
        pytest.skip("checks the interpreter shim itself")


# ---------------------------------------------------------------- (a) tl.dot on bf16 and fp8 operands
@pytest.mark.parametrize("mnk", [(16, 16, 16), (32, 32, 64)], ids=["m16n16k16", "m32n32k64"])
def test_bf16_dot_matches_fp32_matmul(device, mnk):
    m, n, k = mnk
    gen = torch.Generator().manual_seed(m + k)
    if mnk == (16, 16, 16):  # small integers: every product and partial sum is exact
        a = torch.randint(-4, 5, (m, k), generator=gen).bfloat16()
        b = torch.randint(-4, 5, (k, n), generator=gen).bfloat16()
    else:
        a = torch.randn((m, k), generator=gen).bfloat16()
        b = torch.randn((k, n), generator=gen).bfloat16()
    got, ref = dot(a, b, device), a.float() @ b.float()
    # bf16 x bf16 products are exact in fp32; only the fp32 sums may round: |err| <= 2k * u * (|a| @ |b|).
    bound = 2 * k * 2.0**-24 * (a.float().abs() @ b.float().abs())
    assert ((got - ref).abs() <= bound).all(), f"max |err| {(got - ref).abs().max()}"
    if mnk == (16, 16, 16):
        assert torch.equal(got, ref)


@pytest.mark.parametrize("fmt", ["e4nv", "e5"])
def test_fp8_dot_decodes_operands_exactly(device, fmt):
    torch_dtype = FP8[fmt][0]
    a_codes = torch.arange(32 * 32).reshape(32, 32) % 4  # codes 0..3: zero and the three smallest subnormals
    a = a_codes.to(torch.uint8).view(torch_dtype)
    b = (torch.arange(32 * 32).reshape(32, 32) % 3 + 1).float().to(torch_dtype)  # 1, 2, 3
    assert torch.equal(dot(a, b, device), a.float() @ b.float())  # sums of <= 9-bit multiples: exact
    if fmt == "e4nv":  # 0x7F is NaN: its row must come out NaN (the bare interpreter decoded it as 480)
        a_codes[5, 7] = 0x7F
        got = dot(a_codes.to(torch.uint8).view(torch_dtype), b, device)
        assert got[5].isnan().all() and not got[torch.arange(32) != 5].isnan().any()


# ---------------------------------------------------------------- (b) fp32 -> bf16, cast and store
def bf16_midpoints() -> torch.Tensor:
    """Every finite bf16 value, the fp32 midpoint above it (a tie) and the fp32 values 1 ulp either side."""
    hi = np.arange(1 << 16, dtype=np.uint32)
    hi = hi[(hi >> 7 & 0xFF) != 0xFF] << 16
    return f32(np.concatenate([hi, hi | 0x8000, hi | 0x7FFF, hi | 0x8001]))


def fp32_specials_and_random(count: int = 4096) -> torch.Tensor:
    rng = np.random.default_rng(0)
    specials = [0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1e-45, -1e-45, 1.17e-38, 3.4e38, -3.4e38]
    special_bits = [0x7F800001, 0xFF800001, 0x7FC00000, 0x7F80FFFF, 0x00000001, 0x807FFFFF, 0x007FFFFF]
    any_bits = rng.integers(0, 1 << 32, count, dtype=np.uint64).astype(np.uint32)  # NaNs, subnormals, ...
    rand = np.concatenate([any_bits, rng.standard_normal(count).astype(np.float32).view(np.uint32)])
    return torch.cat([torch.tensor(specials, dtype=torch.float32), f32(special_bits), f32(rand)])


@pytest.mark.parametrize("store_only", [False, True], ids=["cast", "store"])
@pytest.mark.parametrize("inputs", ["midpoints", "random"])
def test_fp32_to_bf16_rounds_to_nearest_even(device, inputs, store_only):
    x = bf16_midpoints() if inputs == "midpoints" else fp32_specials_and_random()
    got = convert(x, torch.bfloat16, device, store_only=store_only)
    assert_same(got, x.to(torch.bfloat16), x, "fp32 -> bf16 vs torch RTNE")


@pytest.mark.parametrize("store_only", [False, True], ids=["cast", "store"])
def test_every_bf16_widens_exactly_to_fp32(device, store_only):
    x = torch.arange(2**16, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    got = convert(x, torch.float32, device, store_only=store_only)
    assert_same(got, x.float(), x, "bf16 -> fp32")


def test_fp32_to_bf16_rtz_truncates(device):
    x = torch.cat([bf16_midpoints(), fp32_specials_and_random()])
    u = bits_of(x).view(np.uint32)
    want = torch.from_numpy((u >> 16).astype(np.uint16).view(np.int16)).view(torch.bfloat16)
    want[x.isnan()] = float("nan")  # truncating a NaN may not make it Inf
    assert_same(convert(x, torch.bfloat16, device, rounding="rtz"), want, x, "fp32 -> bf16 rtz")


# ---------------------------------------------------------------- (c) conversions to and from fp8
NAMED = [0.487, 500.0, 448.0, 464.0, 465.0, 480.0, 57344.0, 61440.0, 1e6, np.inf, -np.inf, np.nan, -np.nan,
         1e-3, 2.0**-9, 2.0**-10, 1.5 * 2.0**-9, 2.5 * 2.0**-9, 2.0**-16, 2.0**-17, 1.5 * 2.0**-16, -0.0,
         0.0, 1.0625, 1.1875, -1.1875, 1.125, 1.375, -500.0, -465.0]  # fmt: skip
# Bytes worked out by hand from the rule (RTNE, saturate to max finite, NaN -> 0x7F), in NAMED order; an H200
# running Triton 3.6.0 produced exactly these (-NaN included) through `--device cuda`.
EXPECTED = {
    "e4nv": [0x30, 0x7E, 0x7E, 0x7E, 0x7E, 0x7E, 0x7E, 0x7E, 0x7E, 0x7E, 0xFE, 0x7F, 0x7F,
             0x01, 0x01, 0x00, 0x02, 0x02, 0x00, 0x00, 0x00, 0x80,
             0x00, 0x38, 0x3A, 0xBA, 0x39, 0x3B, 0xFE, 0xFE],
    "e5": [0x38, 0x60, 0x5F, 0x5F, 0x5F, 0x60, 0x7B, 0x7B, 0x7B, 0x7B, 0xFB, 0x7F, 0x7F,
           0x14, 0x18, 0x14, 0x1A, 0x1D, 0x01, 0x00, 0x02, 0x80,
           0x00, 0x3C, 0x3D, 0xBD, 0x3C, 0x3E, 0xE0, 0xDF],
}  # fmt: skip


@pytest.mark.parametrize("store_only", [False, True], ids=["cast", "store"])
@pytest.mark.parametrize("fmt", ["e4nv", "e5"])
def test_fp32_to_fp8_named_cases(device, fmt, store_only):
    x = torch.tensor(NAMED, dtype=torch.float32)
    got = convert(x, FP8[fmt][0], device, store_only=store_only)
    want = torch.tensor(EXPECTED[fmt], dtype=torch.uint8)
    assert np.array_equal(bits_of(gpu_fp8(x, fmt)), want.numpy()), "the oracle disagrees with the hand table"
    pairs = zip(NAMED, bits_of(got).tolist(), want.tolist(), strict=True)
    rows = [f"{v}: got {g:#04x}, want {w:#04x}" for v, g, w in pairs if g != w]
    assert not rows, f"fp32 -> fp8{fmt}:\n  " + "\n  ".join(rows)


def fp8_sweep(fmt: str) -> torch.Tensor:
    """fp32 values at and around every fp8 rounding boundary, in and beyond range, plus specials and noise."""
    vals = np.sort(np.arange(256, dtype=np.uint8).view(FP8[fmt][1]).astype(np.float64))
    vals = vals[np.isfinite(vals)]
    mids = ((vals[1:] + vals[:-1]) / 2).astype(np.float32)  # exact ties
    near = np.concatenate([np.nextafter(mids, np.float32(np.inf)), np.nextafter(mids, np.float32(-np.inf))])
    edges = np.concatenate([vals.astype(np.float32), mids, near])
    rng = np.random.default_rng(1)
    scaled = (rng.standard_normal(4096) * np.exp2(rng.uniform(-20, 18, 4096))).astype(np.float32)
    return torch.cat([torch.from_numpy(np.concatenate([edges, scaled])), fp32_specials_and_random(2048)])


@pytest.mark.parametrize("fmt", ["e4nv", "e5"])
def test_fp32_to_fp8_sweep(device, fmt):
    x = fp8_sweep(fmt)
    assert_same(convert(x, FP8[fmt][0], device), gpu_fp8(x, fmt), x, f"fp32 -> fp8{fmt}")


@pytest.mark.parametrize("src", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("fmt", ["e4nv", "e5"])
def test_fp16_bf16_to_fp8_exhaustive(device, src, fmt):
    x = torch.arange(1 << 16, dtype=torch.int32).to(torch.int16).view(src)  # every 16-bit pattern
    assert_same(convert(x, FP8[fmt][0], device), gpu_fp8(x.float(), fmt), x, f"{src} -> fp8{fmt}")


@pytest.mark.parametrize("dst", [torch.float32, torch.float16, torch.bfloat16], ids=["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("fmt", ["e4nv", "e5"])
def test_fp8_upcast_exhaustive(device, fmt, dst):
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    got = convert(codes.view(FP8[fmt][0]), dst, device)  # every fp8 code
    want = torch.from_numpy(codes.numpy().view(FP8[fmt][1]).astype(np.float32)).to(dst)
    quirk = (fmt, dst) == ("e5", torch.bfloat16)
    special = (codes & 0x7C) == 0x7C if quirk else torch.zeros(256, dtype=torch.bool)
    assert_same(got[~special], want[~special], codes[~special], f"fp8{fmt} -> {dst}")
    if quirk:  # sm_90 Triton 3.6 (measured on an H200) widens e5m2 Inf/NaN to finite bf16 values
        finite = torch.tensor([65536.0, 81920.0, 98304.0, 114688.0] * 2) * torch.tensor([1.0] * 4 + [-1.0] * 4)
        assert torch.equal(got[special].float(), finite), (
            f"fp8e5 Inf/NaN -> bf16 gave {got[special].tolist()}; if the GPU now keeps Inf/NaN, Triton fixed "
            "triton-lang/triton#11784: drop fp8e5_bits_to_f32_sm90_bf16 from the shim and this expectation"
        )


def test_fp32_to_fp8e5_rtz(device):
    x = fp8_sweep("e5")
    v = x.numpy()
    vals = np.arange(0x7C, dtype=np.uint8).view(ml_dtypes.float8_e5m2).astype(np.float32)  # 0 .. 57344
    codes = np.searchsorted(vals, np.abs(v), side="right") - 1  # largest magnitude <= |x|; overflow -> 0x7B
    codes = np.where(np.isinf(v), 0x7C, np.clip(codes, 0, 0x7B)) | np.where(np.signbit(v), 0x80, 0)
    want = torch.from_numpy(np.where(np.isnan(v), 0x7F, codes).astype(np.uint8)).view(torch.float8_e5m2)
    assert_same(convert(x, torch.float8_e5m2, device, rounding="rtz"), want, x, "fp32 -> fp8e5 rtz")


@pytest.mark.parametrize(
    ("src", "fmt"), [(torch.float32, "e4nv"), (torch.float16, "e5"), (torch.bfloat16, "e4nv")], ids=str
)
def test_fp8_rtz_that_gpu_cannot_compile_is_refused(device, src, fmt):
    cpu_only(device)  # on the GPU this is an LLVM fatal error that aborts the process
    with pytest.raises(InterpreterError, match=r"NotImplementedError.*'rtz'"):
        convert(torch.ones(4, dtype=src), FP8[fmt][0], device, rounding="rtz")


# ---------------------------------------------------------------- the upstream bugs are still there
def _probe_bf16_dot(device: str) -> str | None:
    a = torch.arange(256).reshape(16, 16).remainder(5).sub(2).bfloat16()
    got, want = dot(a, a, device), a.float() @ a.float()
    return None if torch.equal(got, want) else f"max |err| {(got - want).abs().max()}"


@triton.jit
def _fma_kernel(X, Y, Z, R, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x, y, z = tl.load(X + offs, mask=offs < n), tl.load(Y + offs, mask=offs < n), tl.load(Z + offs, mask=offs < n)
    tl.store(R + offs, tl.fma(x, y, z), mask=offs < n)


def fma(x: torch.Tensor, y: torch.Tensor, z: torch.Tensor, device: str) -> torch.Tensor:
    r = torch.empty(x.shape, dtype=torch.float32, device=device)
    block = max(16, triton.next_power_of_2(x.numel())) if device == "cpu" else 1024
    _fma_kernel[(triton.cdiv(x.numel(), block),)](x.to(device), y.to(device), z.to(device), r, x.numel(), BLOCK=block)
    return r.cpu()


def exact_fma(x: torch.Tensor, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """Oracle: the exact rational x * y + z, rounded once to fp32 (nearest, ties to even)."""
    out = []
    for a, b, c in zip(x.tolist(), y.tolist(), z.tolist(), strict=True):
        value = Fraction(a) * Fraction(b) + Fraction(c)
        r = np.float32(float(value))
        neighbours = (np.nextafter(r, np.float32(-np.inf)), r, np.nextafter(r, np.float32(np.inf)))
        odd = lambda v: int(np.float32(v).view(np.uint32)) & 1  # ties go to the even bit pattern
        out.append(min(neighbours, key=lambda v, value=value: (abs(Fraction(float(v)) - value), odd(v))))
    return torch.tensor(np.array(out, dtype=np.float32))


# Cancellation keeps the product's rounding residual (triton#11424); 4097 * 4097 = 16785409 is halfway between
# fp32 neighbours, so the tiny addend decides (triton#11610); 0.28125 * 0.8888889 rounds onto the E2M1 midpoint
# 0.25 if rounded first (kernels/nvfp4.py's double-rounding probe).
_FMA_CASES = ((1.4142135, 1.7320508, None), (4097.0, 4097.0, 2.0**-30), (0.28125, 0.8888889, 6291456.0))


def _fma_case_inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    x = torch.tensor([c[0] for c in _FMA_CASES], dtype=torch.float32)
    y = torch.tensor([c[1] for c in _FMA_CASES], dtype=torch.float32)
    z = torch.tensor([0.0 if c[2] is None else c[2] for c in _FMA_CASES])
    z[0] = -(x[0] * y[0])  # minus the fp32-rounded product
    return x, y, z


@pytest.mark.parametrize("inputs", ["named", "cancellation", "halfway"])
def test_fma_rounds_once(device, inputs):
    gen = torch.Generator().manual_seed(11)
    if inputs == "named":
        x, y, z = _fma_case_inputs()
    elif inputs == "cancellation":
        x, y = torch.randn(512, generator=gen), torch.randn(512, generator=gen) * 3
        z = -(x * y) + torch.randn(512, generator=gen) * 1e-6 * torch.randint(0, 2, (512,), generator=gen)
    else:  # integer products: many land exactly halfway between fp32 neighbours
        x = torch.randint(1, 2**13, (512,), generator=gen).float()
        y = torch.randint(1, 2**13, (512,), generator=gen).float()
        z = torch.randint(0, 2, (512,), generator=gen).float().mul(2).sub(1) * torch.exp2(
            -torch.randint(1, 40, (512,), generator=gen).float()
        )
    assert_same(fma(x, y, z, device), exact_fma(x, y, z), x, "tl.fma")


def _probe_fma_fused(device: str) -> str | None:
    x, y, z = _fma_case_inputs()
    got, want = fma(x, y, z, device), exact_fma(x, y, z)
    return None if np.array_equal(bits_of(got), bits_of(want)) else f"{got.tolist()} vs fused {want.tolist()}"


def _probe_bf16_round(device: str) -> str | None:
    x = f32([0x3F80C000, 0x3F818000, 0x3F80FFFF])  # above a tie, a tie to even (up), just below the next
    got, want = convert(x, torch.bfloat16, device), x.to(torch.bfloat16)
    return None if np.array_equal(bits_of(got), bits_of(want)) else f"{got.tolist()} vs RTNE {want.tolist()}"


def _probe_bf16_widen(device: str) -> str | None:
    x = torch.tensor([0x0001, 0x0003, -0x7FC0, 0x007F], dtype=torch.int16).view(torch.bfloat16)  # subnormals
    got = convert(x, torch.float32, device)
    return None if torch.equal(got.view(torch.int32), x.float().view(torch.int32)) else f"{got.tolist()}"


@triton.jit
def _strided_sum_kernel(X, Y, n, BLOCK: tl.constexpr):
    total = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, n, BLOCK):  # a loop over a runtime bound
        offs = start + tl.arange(0, BLOCK)
        total += tl.load(X + offs, mask=offs < n, other=0.0)
    tl.store(Y + tl.arange(0, BLOCK), total)


def _probe_scalar_index(device: str) -> str | None:
    x = torch.arange(40, dtype=torch.float32)
    y = torch.empty(16, device=device)
    try:
        _strided_sum_kernel[(1,)](x.to(device), y, 40, BLOCK=16)
    except Exception as err:  # the interpreter wraps the TypeError
        return f"{type(err).__name__}: {err}"
    want = torch.nn.functional.pad(x, (0, 8)).view(3, 16).sum(0)
    return None if torch.equal(y.cpu(), want) else f"{y.tolist()}"


def _probe_fp8_convert(device: str) -> str | None:
    x = torch.tensor([0.487, 500.0, np.inf, np.nan])
    got, want = convert(x, torch.float8_e4m3fn, device), gpu_fp8(x, "e4nv")
    nan_code = torch.tensor([0x7F], dtype=torch.uint8).view(torch.float8_e4m3fn)
    decoded = convert(nan_code, torch.float32, device)
    if np.array_equal(bits_of(got), bits_of(want)) and decoded.isnan().all():
        return None
    return f"{[hex(b) for b in bits_of(got)]} vs {[hex(b) for b in bits_of(want)]}; 0x7F -> {decoded.item()}"


PROBES = {
    "bf16_dot": _probe_bf16_dot,
    "bf16_round": _probe_bf16_round,
    "bf16_widen": _probe_bf16_widen,
    "scalar_index": _probe_scalar_index,
    "fp8_convert": _probe_fp8_convert,
    "fma_fused": _probe_fma_fused,
}
BUGS = {
    "bf16_dot": "tl.dot on bf16 operands",
    "bf16_round": "fp32->bf16 rounding (truncation)",
    "bf16_widen": "bf16->fp32 widening of subnormals",
    "scalar_index": "loops over a runtime bound under numpy >= 2.4",
    "fp8_convert": "fp32<->fp8 conversions",
    "fma_fused": "the unfused fp32 tl.fma",
}


@pytest.mark.parametrize("name", [shim.name for shim in interpreter_shim.SHIMS])
def test_upstream_bug_still_present(device, name):
    cpu_only(device)
    assert PROBES[name](device) is None, "the shimmed interpreter is wrong"
    with interpreter_shim.disabled():
        wrong = PROBES[name](device)
    assert wrong is not None, f"upstream fixed {BUGS[name]}: remove shim {name} (and this test's entry)"


# ---------------------------------------------------------------- the shim's own machinery
def test_install_uninstall_disabled_restore_the_originals(device):
    cpu_only(device)
    attrs = sorted({attr for shim in interpreter_shim.SHIMS for attr, _ in shim.patches})
    was_installed = interpreter_shim.installed()
    try:
        interpreter_shim.uninstall()
        interpreter_shim.uninstall()  # a second uninstall is a no-op
        originals = {attr: interpreter_shim.current(attr) for attr in attrs}
        for attr, fn in originals.items():  # the real thing, defined in triton's interpreter.py
            assert fn.__module__ == "triton.runtime.interpreter" and not hasattr(fn, "__touchstone_shim__")
            assert fn.__code__.co_filename.endswith("interpreter.py"), attr
        interpreter_shim.install()
        shimmed = {attr: interpreter_shim.current(attr) for attr in attrs}
        assert all(shimmed[a] is not originals[a] for a in attrs)
        assert all(hasattr(fn, "__touchstone_shim__") for fn in shimmed.values())
        interpreter_shim.install()  # idempotent: nothing wrapped twice
        assert {attr: interpreter_shim.current(attr) for attr in attrs} == shimmed
        with interpreter_shim.disabled():
            assert {attr: interpreter_shim.current(attr) for attr in attrs} == originals
            with interpreter_shim.disabled():
                pass
            assert {attr: interpreter_shim.current(attr) for attr in attrs} == originals  # nested: still bare
        assert {attr: interpreter_shim.current(attr) for attr in attrs} == shimmed
        with pytest.raises(RuntimeError), interpreter_shim.disabled():
            raise RuntimeError
        assert {attr: interpreter_shim.current(attr) for attr in attrs} == shimmed  # restored after an exception too
        interpreter_shim.uninstall()
        assert {attr: interpreter_shim.current(attr) for attr in attrs} == originals
    finally:
        (interpreter_shim.install if was_installed else interpreter_shim.uninstall)()


def test_shim_records_are_complete(device):
    cpu_only(device)
    names = [shim.name for shim in interpreter_shim.SHIMS]
    assert len(set(names)) == len(names) == len(PROBES) and set(names) == set(PROBES)
    for shim in interpreter_shim.SHIMS:
        assert shim.fixes and shim.remove_when and shim.patches, shim.name
        assert "triton-lang/triton#" in shim.upstream, shim.name
        for attr, _ in shim.patches:
            assert callable(interpreter_shim.current(attr)), f"{shim.name}: no {attr}"


def test_importing_the_shim_does_not_import_kernels(device):
    cpu_only(device)
    code = [
        "import sys, suites.interpreter_shim",
        "sys.exit('kernels' in {name.split('.')[0] for name in sys.modules})",
    ]
    assert subprocess.run([sys.executable, "-c", "; ".join(code)], cwd=ROOT).returncode == 0
