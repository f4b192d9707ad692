"""RMSNorm and fused residual-add + RMSNorm in Triton, against `reference.norm.rms_norm` (lossy: an ulp).

Ops: `touchstone::rms_norm(x, weight, eps) -> out` and `touchstone::fused_add_rms_norm(x, residual, weight,
eps) -> (out, new_residual)` (functional: nothing is mutated, both are new tensors); call them through
`rms_norm(x, weight, eps, residual=None)`, which has the reference's signature.

One program per row, the whole row in registers (BLOCK = next power of two of hidden, hidden <= 8192): one read
of x (and residual), one write of out (and new_residual), where the runner's eager RMSNorm runs ~7 kernels and
the residual add one more. Op order as the reference: r = x + residual rounded to x's dtype, fp32 sum of
squares, `/ hidden`, `+ eps`, rsqrt, multiply, round to x's dtype, multiply by weight in fp32 (exact for
narrow dtypes), round. The sum order (a tree) and the approximate rsqrt differ from torch: one-ulp flips.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._boundary import as_rows, check_device, f32_bits
from kernels._fp8_groups import e4m3fn_groups
from kernels._pdl import launch_args, wait_then_release
from reference.norm.rms_norm import check_rms_norm_args
from reference.quant.fp8 import DEFAULT_EPS

MAX_HIDDEN = 8192  # the row lives in registers: 8192 fp32 over 16 warps is 16 values a thread
# Planted bugs for the suite's negative controls; FAULT is a constexpr, so fault 0 compiles them away.
FAULTS = {
    "none": 0,
    "forgets_eps": 1,  # rsqrt(mean(r^2)): a row of zeros becomes NaN
    "residual_after_norm": 2,  # normalizes x alone and adds the residual to the output
}
# (largest BLOCK, warps), chosen so that each thread holds 8-16 fp32 values of the row. H200 sweep (4516f71,
# reports/cuda-h200/launch_sweeps/rms_norm_launch_sweep.csv, CUDA-graph replays): at 4096 rows the table's
# warps are within 3 points of memcpy of the best (hidden 4096: 8 warps 0.83x fused / 0.70x plain, best 0.85x /
# 0.70x; hidden 576: 4 warps 0.41x / 0.26x, best 0.44x at 1 warp / 0.26x); rows <= 64 are launch-bound (at
# most 0.08x) and no warp count moves them.
_WARPS = ((256, 1), (1024, 4), (4096, 8), (MAX_HIDDEN, 16))


def _warps(block: int) -> int:
    return next(warps for largest, warps in _WARPS if block <= largest)


@triton.jit
def _rms_norm_kernel(
    x_ptr,
    res_ptr,
    w_ptr,
    out_ptr,
    new_res_ptr,
    hidden,
    x_row_stride,
    res_row_stride,
    eps,
    scale_ptr,
    eps_bits,
    BLOCK: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    FP8: tl.constexpr,
    FAULT: tl.constexpr,
    PDL: tl.constexpr,
):
    wait_then_release(PDL)  # kernels._pdl: before any read of an earlier kernel's output
    row = tl.program_id(0).to(tl.int64)
    col = tl.arange(0, BLOCK)
    mask = col < hidden
    x = tl.load(x_ptr + row * x_row_stride + col, mask=mask, other=0.0)
    r = x
    if HAS_RESIDUAL:
        res = tl.load(res_ptr + row * res_row_stride + col, mask=mask, other=0.0)
        r = (x.to(tl.float32) + res.to(tl.float32)).to(x.dtype)  # one rounding, as torch's narrow add
        tl.store(new_res_ptr + row * hidden + col, r, mask=mask)
        if FAULT == 2:
            r = x
    wide = r.to(tl.float32)
    mean = tl.sum(wide * wide, axis=0) / hidden
    if FAULT != 1:
        mean = mean + eps
    normed = (wide * tl.rsqrt(mean)).to(x.dtype)
    w = tl.load(w_ptr + col, mask=mask, other=0.0)
    out = (w.to(tl.float32) * normed.to(tl.float32)).to(x.dtype)
    if FAULT == 2 and HAS_RESIDUAL:
        out = (out.to(tl.float32) + res.to(tl.float32)).to(x.dtype)
    if FP8:  # the row's 128-wide groups quantized in registers; padding lanes are 0 and are not stored
        codes, scale = e4m3fn_groups(tl.reshape(out.to(tl.float32), [BLOCK // 128, 128]), eps_bits)
        tl.store(out_ptr + row * hidden + col, tl.reshape(codes, [BLOCK]), mask=mask)
        group = tl.arange(0, BLOCK // 128)
        tl.store(scale_ptr + row * (hidden // 128) + group, scale, mask=group * 128 < hidden)
    else:
        tl.store(out_ptr + row * hidden + col, out, mask=mask)


def launch_rms_norm(x, weight, eps, residual=None, fault="none", fp8_groups=False):
    """Validate, allocate and launch; returns out, or (out, new_residual); with `fp8_groups` out is (codes,
    scales): E4M3 per 128-wide group. `fault` plants a named bug."""
    check_rms_norm_args(x, weight, eps, residual)
    check_device(
        **({"x": x, "weight": weight} if residual is None else {"x": x, "residual": residual, "weight": weight})
    )
    hidden = x.shape[-1]
    if hidden > MAX_HIDDEN:
        raise ValueError(f"x: rows of {hidden} elements are longer than the kernel's {MAX_HIDDEN}")
    if weight.stride(0) != 1 and hidden > 1:
        raise ValueError(f"weight: must be contiguous, got stride {weight.stride()}")
    if fp8_groups and hidden % 128:
        raise ValueError(f"x: the FP8 form quantizes whole 128-wide groups, got rows of {hidden} elements")
    rows = as_rows(x, "x")
    res_rows = rows if residual is None else as_rows(residual, "residual")
    out = torch.empty(x.shape, dtype=torch.float8_e4m3fn if fp8_groups else x.dtype, device=x.device)
    scales = torch.empty((*x.shape[:-1], hidden // 128 if fp8_groups else 0), dtype=torch.float32, device=x.device)
    new_res = out if residual is None else torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if rows.shape[0] and hidden:
        block = max(triton.next_power_of_2(hidden), 128 if fp8_groups else 1)
        _rms_norm_kernel[(rows.shape[0],)](
            rows,
            res_rows,
            weight,
            out.view(torch.uint8) if fp8_groups else out,
            new_res,
            hidden,
            rows.stride(0),
            res_rows.stride(0),
            eps,
            scales,
            f32_bits(DEFAULT_EPS),
            BLOCK=block,
            HAS_RESIDUAL=residual is not None,
            FP8=fp8_groups,
            FAULT=FAULTS[fault],
            num_warps=_warps(block),
            **launch_args(x.device),
        )
    out = (out, scales) if fp8_groups else out
    return out if residual is None else (out, new_res)


@torch.library.custom_op("touchstone::rms_norm", mutates_args=())
def _rms_norm_op(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return launch_rms_norm(x, weight, eps)


@_rms_norm_op.register_fake
def _(x, weight, eps):
    check_rms_norm_args(x, weight, eps, None)
    return x.new_empty(x.shape)


@torch.library.custom_op("touchstone::fused_add_rms_norm", mutates_args=())
def _fused_add_rms_norm_op(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    return launch_rms_norm(x, weight, eps, residual)


@_fused_add_rms_norm_op.register_fake
def _(x, residual, weight, eps):
    check_rms_norm_args(x, weight, eps, residual)
    return x.new_empty(x.shape), x.new_empty(x.shape)


@torch.library.custom_op("touchstone::rms_norm_fp8", mutates_args=())
def _rms_norm_fp8_op(x: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    return launch_rms_norm(x, weight, eps, fp8_groups=True)


def _fp8_fake(x, weight, eps, residual):
    check_rms_norm_args(x, weight, eps, residual)
    if x.shape[-1] % 128:
        raise ValueError(f"x: the FP8 form quantizes whole 128-wide groups, got rows of {x.shape[-1]} elements")
    codes = x.new_empty(x.shape, dtype=torch.float8_e4m3fn)
    return codes, x.new_empty((*x.shape[:-1], x.shape[-1] // 128), dtype=torch.float32)


@_rms_norm_fp8_op.register_fake
def _(x, weight, eps):
    return _fp8_fake(x, weight, eps, None)


@torch.library.custom_op("touchstone::fused_add_rms_norm_fp8", mutates_args=())
def _fused_add_rms_norm_fp8_op(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    (codes, scales), new_residual = launch_rms_norm(x, weight, eps, residual, fp8_groups=True)
    return codes, scales, new_residual


@_fused_add_rms_norm_fp8_op.register_fake
def _(x, residual, weight, eps):
    return *_fp8_fake(x, weight, eps, residual), x.new_empty(x.shape)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
    """Kernel twin of `reference.norm.rms_norm.rms_norm` (same arguments; outputs within the LOSSY row)."""
    if residual is None:
        return torch.ops.touchstone.rms_norm(x, weight, eps)
    return torch.ops.touchstone.fused_add_rms_norm(x, residual, weight, eps)


def rms_norm_fp8(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
    """`rms_norm`'s output quantized to E4M3 per token and 128-wide group in the same launch, for a block-FP8
    GEMM: (codes, scales), or ((codes, scales), new_residual). The codes and scales equal
    `reference.quant.fp8.quantize_fp8` of what `rms_norm` writes, bit for bit."""
    if residual is None:
        return torch.ops.touchstone.rms_norm_fp8(x, weight, eps)
    codes, scales, new_residual = torch.ops.touchstone.fused_add_rms_norm_fp8(x, residual, weight, eps)
    return (codes, scales), new_residual
