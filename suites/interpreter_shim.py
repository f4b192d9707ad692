"""Interpreter shim: make `TRITON_INTERPRET=1` compute what GPU Triton (sm_90, Triton 3.6) computes.

The CPU test tier runs Triton kernels under `triton/runtime/interpreter.py`, which gets six things wrong
(seen in Triton 3.6.0; the bf16 dot, bf16 rounding and fp8 ones in 3.9.0 too). Each fix is a named `Shim`
record wrapping methods of the interpreter's own `InterpreterBuilder` (or, named "interpreter.<name>",
functions of the interpreter module), so it reaches interpreter mode only: compiled kernels never touch
them.
suites/conftest.py calls `install()` for `--device cpu`; `disabled()` takes every shim out for a block.

GPU semantics matched, and where each fact comes from:
- Every fp downcast rounds RTNE unless `fp_downcast_rounding='rtz'`: `TritonSemantic.cast`
  (triton/language/semantic.py) sets RTNE when the argument is None.
- fp32->bf16: `.to()`/store lower to `arith.truncf` (round to nearest even); an explicit mode goes to
  `llvm.nvvm.f2bf16.rn`/`.rz` in `FpToFpOpConversion` (third_party/nvidia/lib/TritonNVIDIAGPUToLLVM/
  ElementwiseOpToLLVM.cpp; its PTX strings are in 3.6.0's libtriton.so). NaN stays NaN.
- fp32->fp8e4nv/fp8e5, RTNE, sm_90: one `cvt.rn.satfinite.{e4m3x2,e5m2x2}.f32` (same file,
  `getConversionFunc`; `useFP16IntermediateSrc` is false for cc >= 90); fp16 uses the `.f16x2` form and
  bf16 goes `cvt.f32.bf16` first: every source is widened exactly to fp32, then one rule applies.
- That rule, `.rn.satfinite` (NVIDIA cuda_fp8.hpp emits this PTX for `__NV_SATFINITE` on sm_90 and its host
  reference spells it out; triton-lang/triton#11667's table agrees): round to nearest even; |x| above max
  finite and +-Inf give +-max finite (448 e4m3, 57344 e5m2); every NaN gives 0x7F; |x| <= half the
  smallest subnormal gives +-0.
- 'rtz' to fp8 exists only for fp32 -> fp8e5 (`cvt.rz.f16.f32`, then the fp16's top byte:
  `Fp16_to_Fp8E5M2_RTZ`). fp32 -> fp8e4nv and fp16/bf16 -> fp8 with 'rtz' abort compilation ("Unsupported
  rounding mode for conversion"): the shim raises NotImplementedError rather than guess.
- fp8 -> fp16/bf16/fp32 is exact (`cvt.rn.f16x2.e4m3x2`/`.e5m2x2`); e4m3 0x7F/0xFF are NaN, e5m2 0x7C/0xFC
  +-Inf; except fp8e5 -> bf16, where sm_90 turns Inf/NaN into finite numbers (`fp8e5_bits_to_f32_sm90_bf16`).
- tl.fma on fp32 is one `fma.rn.f32`: the exact x * y + z rounded once (PTX ISA; upstream's interpreter fix
  triton-lang/triton#11641 says the same).
- sm_89 converts fp32->fp8 through `cvt.rz.f16.f32` first (1 ulp apart at near-ties): not modelled.
Checked on an H200 (Triton 3.6.0): suites/harness/test_interpreter_shim.py with `--device cuda` runs the
same parity tests on the GPU, so the oracles followed here match the hardware bit for bit.

Exact arithmetic: numpy bit operations for bf16/fp16; for fp8, torch's CPU float8 casts (exact RTNE) after
clamping to +-max finite (ml_dtypes alone would turn 465 or Inf into NaN for e4m3).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch
import triton.language as tl
from triton._C.libtriton import ir
from triton.runtime import interpreter as _interp

Builder = _interp.InterpreterBuilder
_Handle = _interp.TensorHandle
_WIDE = ("fp16", "bf16", "fp32")  # sources/destinations of fp8 conversions that the GPU lowers
_FP8 = {"fp8e4nv": (torch.float8_e4m3fn, 448.0), "fp8e5": (torch.float8_e5m2, 57344.0)}


# ---- exact conversions on raw numpy data (bf16 is stored as uint16, fp8 as uint8 in the interpreter) ----
def bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    return (np.asarray(bits, np.uint16).astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16_bits(x: np.ndarray, rtz: bool = False) -> np.ndarray:
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    rounded = u >> 16 if rtz else (u + 0x7FFF + ((u >> 16) & 1)) >> 16  # RTNE: carry reaches Inf correctly
    quiet_nan = (u >> 16) | 0x40  # keep NaN a NaN even when its payload sits in the dropped bits
    return np.where((u & 0x7FFFFFFF) > 0x7F800000, quiet_nan, rounded).astype(np.uint16)


def f32_to_f16_rtz_bits(x: np.ndarray) -> np.ndarray:
    """cvt.rz.f16.f32: RTNE via numpy, then one ulp back toward zero wherever RTNE rounded away."""
    x = np.asarray(x, np.float32)
    with np.errstate(over="ignore"):
        h = x.astype(np.float16)
    bits = h.view(np.uint16)
    away = np.isfinite(x) & (np.abs(h.astype(np.float32)) > np.abs(x))  # finite overflow: Inf -> 65504
    return np.where(np.isnan(x), np.uint16(0x7FFF), np.where(away, bits - np.uint16(1), bits))


@functools.cache
def _fp8_table(name: str) -> np.ndarray:
    """fp32 value of each of the 256 fp8 codes (exact; NaN/Inf codes decode to NaN/Inf)."""
    return torch.arange(256, dtype=torch.int32).to(torch.uint8).view(_FP8[name][0]).float().numpy()


def fp8_bits_to_f32(bits: np.ndarray, name: str) -> np.ndarray:
    return _fp8_table(name)[np.asarray(bits, np.uint8)]


def f32_to_fp8_bits(x: np.ndarray, name: str) -> np.ndarray:
    """cvt.rn.satfinite: RTNE, |x| > max (Inf too) -> +-max, NaN -> 0x7F."""
    dtype, fmax = _FP8[name]
    x = np.asarray(x, np.float32)
    flat = torch.from_numpy(np.array(x, dtype=np.float32, copy=True).reshape(-1))
    bits = flat.clamp(-fmax, fmax).to(dtype).view(torch.uint8).numpy().reshape(x.shape)
    return np.where(np.isnan(x), np.uint8(0x7F), bits)


def fp8e5_bits_to_f32_sm90_bf16(bits: np.ndarray) -> np.ndarray:
    """What sm_90 Triton 3.6 gives for fp8e5 -> bf16 (measured on an H200): `Fp8E5M2_to_Bf16` shifts the byte
    into bf16 position and multiplies by 2**112, so finite values are exact but the Inf/NaN codes 0x7C..0x7F
    come out finite: +-65536, 81920, 98304, 114688. Open fix: triton-lang/triton#11784."""
    b = np.asarray(bits, np.uint8)
    wrapped = (4 + (b & 3)).astype(np.float32) * np.float32(2.0**14) * np.where(b & 0x80, -1, 1)
    return np.where((b & 0x7C) == 0x7C, wrapped, fp8_bits_to_f32(b, "fp8e5")).astype(np.float32)


def _to_f32(data: np.ndarray, name: str) -> np.ndarray:
    if name == "bf16":
        return bf16_bits_to_f32(data)
    if name in _FP8:
        return fp8_bits_to_f32(data, name)
    return np.asarray(data).astype(np.float32)  # fp16 (exact) or fp32


def _from_f32(x: np.ndarray, name: str) -> np.ndarray:  # only used where the value is representable
    return f32_to_bf16_bits(x) if name == "bf16" else x.astype(np.float16 if name == "fp16" else np.float32)


# ---- the wrappers: each takes the method it replaces and returns the replacement ----
def _bf16_round_cast_impl(original: Callable) -> Callable:
    def cast_impl(self, src, dst_type):
        if src.dtype.scalar.name == "fp32" and dst_type.scalar.name == "bf16":
            return _Handle(f32_to_bf16_bits(src.data), dst_type.scalar)
        return original(self, src, dst_type)

    return cast_impl


def _bf16_widen_cast_impl(original: Callable) -> Callable:
    def cast_impl(self, src, dst_type):
        if src.dtype.scalar.name == "bf16" and dst_type.scalar.name == "fp32":
            return _Handle(bf16_bits_to_f32(src.data), dst_type.scalar)  # bf16 -> fp32 is a 16-bit shift
        return original(self, src, dst_type)

    return cast_impl


def _bf16_round_fp_to_fp(original: Callable) -> Callable:
    def create_fp_to_fp(self, src, dst_type, rounding_mode):
        if src.dtype.scalar.name == "fp32" and dst_type.scalar.name == "bf16":
            rtz = rounding_mode == ir.ROUNDING_MODE.RTZ
            return _Handle(f32_to_bf16_bits(src.data, rtz=rtz), dst_type.scalar)
        return original(self, src, dst_type, rounding_mode)

    return create_fp_to_fp


def _fp8_fp_to_fp(original: Callable) -> Callable:
    def create_fp_to_fp(self, src, dst_type, rounding_mode):
        s, d = src.dtype.scalar.name, dst_type.scalar.name
        if d in _FP8 and s in _WIDE:
            if rounding_mode == ir.ROUNDING_MODE.RTZ:
                if (s, d) != ("fp32", "fp8e5"):
                    raise NotImplementedError(
                        f"{s} -> {d} with fp_downcast_rounding='rtz' does not compile for NVIDIA GPUs in "
                        "Triton 3.6 (FpToFpOpConversion: unsupported rounding mode); the interpreter shim "
                        "refuses it too"
                    )
                bits = (f32_to_f16_rtz_bits(_to_f32(src.data, s)) >> 8).astype(np.uint8)
            else:
                bits = f32_to_fp8_bits(_to_f32(src.data, s), d)
            return _Handle(bits, dst_type.scalar)
        if s in _FP8 and d in _WIDE:
            e5_bf16 = (s, d) == ("fp8e5", "bf16")
            x = fp8e5_bits_to_f32_sm90_bf16(src.data) if e5_bf16 else fp8_bits_to_f32(src.data, s)
            return _Handle(_from_f32(x, d), dst_type.scalar)
        return original(self, src, dst_type, rounding_mode)

    return create_fp_to_fp


def fma_f32(x: np.ndarray, y: np.ndarray, z: np.ndarray) -> np.ndarray:
    """fma.rn.f32: x * y + z rounded once. The product is exact in float64 (48 bits); TwoSum gives the sum
    s and its exact error e (x * y + z = s + e). Rounding s to fp32 is right unless s is exactly halfway
    between two fp32 neighbours (RN53 cannot cross such a midpoint, it can only land on it): then the sign
    of e says which neighbour the exact value is nearer to."""
    with np.errstate(over="ignore", invalid="ignore"):  # inf and NaN operands propagate as fma does
        p = np.asarray(x, np.float32).astype(np.float64) * np.asarray(y, np.float32).astype(np.float64)
        c = np.asarray(z, np.float32).astype(np.float64)
        s = p + c
        b = s - p
        e = (p - (s - b)) + (c - b)
        r = s.astype(np.float32)
        below = np.where(r.astype(np.float64) > s, np.nextafter(r, np.float32(-np.inf)), r)
        above = np.where(r.astype(np.float64) > s, r, np.nextafter(r, np.float32(np.inf)))
        halfway = np.isfinite(s) & ((below.astype(np.float64) + above.astype(np.float64)) / 2 == s) & (below != above)
    return np.where(halfway & (e > 0), above, np.where(halfway & (e < 0), below, r)).astype(np.float32)


def _fused_fma(original: Callable) -> Callable:
    def create_fma(self, x, y, z):
        if z.dtype.scalar.name == "fp32":
            return _Handle(fma_f32(x.data, y.data, z.data), z.dtype.scalar)
        return original(self, x, y, z)

    return create_fma


def _scalar_index(original: Callable) -> Callable:
    """Scalar kernel arguments are 1-element arrays; `int()` of those fails from numpy 2.4 on, which breaks
    `range()` over a runtime bound. Index through the one element instead."""

    def _patch_lang_tensor(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(np.asarray(self.handle.data).reshape(-1)[0]))

    return _patch_lang_tensor


def _decoding_dot(names: tuple[str, ...]) -> Callable[[Callable], Callable]:
    """create_dot wrapper: operands of the given dtypes are decoded exactly to fp32 before the matmul."""

    def _decode(x):
        return _Handle(_to_f32(x.data, x.dtype.scalar.name), tl.float32)

    def wrap(original: Callable) -> Callable:
        def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
            a, b = (_decode(x) if x.dtype.scalar.name in names else x for x in (a, b))
            return original(self, a, b, d, input_precision, max_num_imprecise_acc)

        return create_dot

    return wrap


@dataclass(frozen=True)
class Shim:
    name: str
    fixes: str
    upstream: str
    remove_when: str
    # (InterpreterBuilder attribute or "interpreter.<module function>", wrapper)
    patches: tuple[tuple[str, Callable[[Callable], Callable]], ...]


_REMOVE = "test_upstream_bug_still_present[{}] fails with 'upstream fixed ...' on the pinned Triton"
SHIMS: tuple[Shim, ...] = (
    Shim(
        name="bf16_dot",
        fixes="tl.dot on bf16 operands multiplied the raw uint16 bit patterns; they are now decoded to fp32",
        upstream="triton-lang/triton#11584 (closed); fix PR triton-lang/triton#11585 closed unmerged",
        remove_when=_REMOVE.format("bf16_dot"),
        patches=(("create_dot", _decoding_dot(("bf16",))),),
    ),
    Shim(
        name="bf16_round",
        fixes="fp32->bf16 cast/store truncated (cast_impl passes rounding_mode=None to _convert_float); "
        "now RTNE. Explicit 'rtz' still truncates, but a NaN with its payload in the low 16 bits stays NaN",
        upstream="none found; related: triton-lang/triton#11897 (open PR reworking _convert_float)",
        remove_when=_REMOVE.format("bf16_round"),
        patches=(("cast_impl", _bf16_round_cast_impl), ("create_fp_to_fp", _bf16_round_fp_to_fp)),
    ),
    Shim(
        name="bf16_widen",
        fixes="bf16->fp32 widening flushed or mis-scaled bf16 subnormals (_convert_float renormalises them and "
        "then clamps the fp32 exponent at 0, e.g. 0x0001 -> 0.0, 0x0003 -> 5.9e-39); now the exact 16-bit shift",
        upstream="none found; related: triton-lang/triton#11897 (open PR reworking _convert_float)",
        remove_when=_REMOVE.format("bf16_widen"),
        patches=(("cast_impl", _bf16_widen_cast_impl),),
    ),
    Shim(
        name="scalar_index",
        fixes="`for i in range(0, n, BLOCK)` with a runtime n raised TypeError('only 0-dimensional arrays can be "
        "converted to Python scalars') under numpy >= 2.4 (tensor.__index__ did int() on a 1-element array)",
        upstream="triton-lang/triton#9171 (closed: fixed after 3.6.0)",
        remove_when=_REMOVE.format("scalar_index"),
        patches=(("interpreter._patch_lang_tensor", _scalar_index),),
    ),
    Shim(
        name="fp8_convert",
        fixes="fp8e4nv/fp8e5 <-> fp16/bf16/fp32 conversions (_convert_float: no saturation, Inf/NaN wrong, "
        "e.g. 500->256, inf->256, nan->384; e4m3 NaN decoded as 480, e5m2 Inf as 65536) and the fp8 operand "
        "decode of tl.dot (e5m2 subnormals became 0); now sm_90 cvt.rn.satfinite semantics, exact decoding "
        "(fp8e5 -> bf16 keeps the GPU's finite Inf/NaN, triton-lang/triton#11784)",
        upstream="triton-lang/triton#8322 (open); open PRs triton-lang/triton#11897 and #11667",
        remove_when=_REMOVE.format("fp8_convert"),
        patches=(("create_fp_to_fp", _fp8_fp_to_fp), ("create_dot", _decoding_dot(tuple(_FP8)))),
    ),
    Shim(
        name="fma_fused",
        fixes="tl.fma on fp32 rounded the product before the add (x * y + z in numpy); now one rounding of the "
        "exact value, as fma.rn.f32 does. fp16/fp64 fma are left to the interpreter",
        upstream="triton-lang/triton#11424 and #11610 (fixed after 3.6.0 by #11641)",
        remove_when=_REMOVE.format("fma_fused"),
        patches=(("create_fma", _fused_fma),),
    ),
)

# Built once, on the first install(), so that every install puts back the very same functions.
_MODULE = "interpreter."


def _owner(attr: str) -> tuple[object, str]:
    return (_interp, attr.removeprefix(_MODULE)) if attr.startswith(_MODULE) else (Builder, attr)


def current(attr: str) -> Callable:
    """What the interpreter uses for `attr` right now (a builder method or an interpreter function)."""
    owner, name = _owner(attr)
    return vars(owner)[name]


def _set(attr: str, fn: Callable) -> None:
    owner, name = _owner(attr)
    setattr(owner, name, fn)


_originals: dict[str, Callable] = {}  # attribute -> the interpreter's own function
_replacements: dict[str, Callable] = {}  # attribute -> the outermost wrapper (shims on one method chain)
_state = {"installed": False}


def installed() -> bool:
    return _state["installed"]


def install() -> None:
    """Wrap the InterpreterBuilder methods; a second call is a no-op."""
    if _state["installed"]:
        return
    if not _replacements:
        for shim in SHIMS:
            for attr, wrap in shim.patches:
                _originals.setdefault(attr, current(attr))
                replacement = wrap(_replacements.get(attr, _originals[attr]))
                replacement.__touchstone_shim__ = shim.name
                _replacements[attr] = replacement
    for attr, replacement in _replacements.items():
        _set(attr, replacement)
    _state["installed"] = True


def uninstall() -> None:
    """Put back the interpreter's own methods; a no-op when nothing is installed."""
    if _state["installed"]:
        for attr, original in _originals.items():
            _set(attr, original)
    _state["installed"] = False


@contextlib.contextmanager
def disabled() -> Iterator[None]:
    """Run a block on the bare interpreter (every shim removed), then restore the previous state."""
    was_installed = installed()
    uninstall()
    try:
        yield
    finally:
        if was_installed:
            install()
