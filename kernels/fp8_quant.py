"""FP8 (E4M3) group quantization in Triton, bit-exact with `reference.quant.fp8.quantize_fp8`.

Op: `touchstone::quantize_fp8(x, granularity, group_size, fmt, eps, ue8m0, static_scale) -> (q, scales)`;
call it through `quantize_fp8`, which has the reference's signature.

One kernel quantizes [BLOCK_G groups x GROUP elements] tiles: a group is `group_size` elements of a row, a
whole row (per token), or a row of a tensor that shares one scale (per tensor; the scale then comes from a
first pass that atomically maxes |x|, or from the static scale). Exactness:
- amax is an integer max over |x|'s fp32 bits (NaN has the largest pattern, so it propagates, as in torch).
- scale and its reciprocal are IEEE divisions (`tl.div_rn`), the UE8M0 rounding is done on the bits.
- e4m3fn: the hardware conversion (`cvt.rn.satfinite.e4m3x2.f32` on sm_90: RNE, saturating at 448, NaN to
  0x7F) equals clamp-then-RNE. e4m3fnuz (no NVIDIA conversion exists): RNE on the bits, like `kernels.mxfp4`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._boundary import as_rows, check_device, f32_bits, runs_interpreted
from kernels._fp8_groups import group_scale
from kernels._pdl import launch_args, wait_then_release
from kernels._tiles import block_offsets
from reference.quant.fp8 import DEFAULT_EPS, FP8_FORMATS, check_quantize_fp8_args, scale_shape

_FMT_ID = {"e4m3fn": 0, "e4m3fnuz": 1}
# Planted bugs for the suite's negative controls; FAULT is a constexpr, so fault 0 compiles them away.
FAULTS = {
    "none": 0,
    "amax_skips_last_lane": 1,  # a mask off by one: the group's last element never reaches amax
    "ue8m0_rounds_down": 2,  # 2**floor(log2 scale): the largest element can exceed fp8_max and saturate
}
_SCALE_SOURCE = {"group": 0, "tensor_amax": 1, "static": 2}
# Elements per program: GPU tiles of 8 K elements (64 groups of 128, 8 warps) run group-128 quantization of
# 1 GiB bf16 at 1.017x memcpy on the H200 (fp32 and UE8M0 scales alike; `python -m bench.quant.fp8_launch_sweep`):
# 16-64 groups at 2-8 warps all land at 1.01-1.02x, fewer threads per group (1 warp for 64
# groups, 1-4 warps for 128) fall to 0.16-0.84x. The interpreter pays ~1 ms per program: few, large ones.
_GPU_TILE_ELEMENTS = 8192
_INTERPRETER_TILE_ELEMENTS = 1 << 16


@triton.jit
def _encode_e4m3fnuz(v):
    """fp32 values (|v| <= 224 or NaN) -> e4m3fnuz bytes: bias 8, no -0, NaN 0x80; RNE on the exact value."""
    bits = v.to(tl.uint32, bitcast=True)
    magnitude = bits & 0x7FFFFFFF
    # Below 2**-7 the grid is 2**-10: one fma whose fp32 ulp is 2**-10 / 2**-10 = 1 rounds |v| * 2**10.
    small = tl.fma(magnitude.to(tl.float32, bitcast=True), 1024.0, 12582912.0).to(tl.uint32, bitcast=True)
    small = small - 0x4B400000
    # Normals: round the significand to 3 bits (ties to even) on the bits, rebias 127 -> 8.
    large = ((magnitude + 0x7FFFF + ((magnitude >> 20) & 1)) >> 20) - (119 << 3)
    code = tl.where(magnitude < 0x3C000000, small, large)  # 0x3C000000 = 2**-7
    code = tl.where(code != 0, code | ((bits >> 24) & 0x80), 0)  # no negative zero
    return tl.where(magnitude > 0x7F800000, 0x80, code).to(tl.uint8)


@triton.jit
def _amax_bits_kernel(
    x_ptr, amax_ptr, n_rows, row_len, x_row_stride, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr
):
    """amax_ptr[0] = max over the tensor of |x|'s fp32 bits (int32 atomics: the patterns are non-negative)."""
    wait_then_release(PDL)  # kernels._pdl: before any read of an earlier kernel's output
    row = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    best = tl.zeros([BLOCK_R], dtype=tl.int32)
    for start in range(0, row_len, BLOCK_K):
        col = start + tl.arange(0, BLOCK_K)
        mask = (row < n_rows)[:, None] & (col < row_len)[None, :]
        x = tl.load(x_ptr + row[:, None] * x_row_stride + col[None, :], mask=mask, other=0.0).to(tl.float32)
        best = tl.maximum(best, tl.max(x.to(tl.int32, bitcast=True) & 0x7FFFFFFF, axis=1))
    tl.atomic_max(amax_ptr, tl.max(best, axis=0))


@triton.jit
def _quantize_fp8_kernel(
    x_ptr,
    q_ptr,
    scale_ptr,
    source_ptr,
    n_groups,
    groups_per_row,
    group_len,
    x_row_stride,
    eps_bits,
    BLOCK_G: tl.constexpr,
    GROUP: tl.constexpr,
    FMT: tl.constexpr,
    FP8_MAX: tl.constexpr,
    UE8M0: tl.constexpr,
    SOURCE: tl.constexpr,
    CONTIGUOUS: tl.constexpr,
    FAULT: tl.constexpr,
    PDL: tl.constexpr,
):
    wait_then_release(PDL)  # kernels._pdl: before any read of an earlier kernel's output
    group = tl.program_id(0).to(tl.int64) * BLOCK_G + tl.arange(0, BLOCK_G)
    lane = tl.arange(0, GROUP)
    offset = block_offsets(group, groups_per_row, x_row_stride, group_len, CONTIGUOUS)
    mask = (group < n_groups)[:, None] & (lane < group_len)[None, :]
    x = tl.load(x_ptr + offset[:, None] + lane[None, :], mask=mask, other=0.0).to(tl.float32)

    if SOURCE == 2:  # static per-tensor scale
        scale = tl.load(source_ptr + tl.zeros([BLOCK_G], dtype=tl.int32))
    else:
        if SOURCE == 1:  # per tensor: the first pass's amax bits
            amax_bits = tl.load(source_ptr + tl.zeros([BLOCK_G], dtype=tl.int32))
        else:
            magnitude = x.to(tl.int32, bitcast=True) & 0x7FFFFFFF
            if FAULT == 1:
                magnitude = tl.where((lane < group_len - 1)[None, :], magnitude, 0)
            amax_bits = tl.max(magnitude, axis=1)
        scale = group_scale(amax_bits, eps_bits, FP8_MAX)  # eps as fp32 bits: the integer max keeps NaN
        if UE8M0:  # 2**ceil(log2 scale), exact; Inf/NaN stay
            bits = scale.to(tl.int32, bitcast=True)
            pow2 = (bits & 0x7F800000) + tl.where((bits & 0x7FFFFF) != 0, 0x800000, 0)
            if FAULT == 2:
                pow2 = bits & 0x7F800000
            scale = tl.where(bits >= 0x7F800000, bits, pow2).to(tl.float32, bitcast=True)
    recip = tl.div_rn(tl.full([BLOCK_G], 1.0, tl.float32), scale)
    v = x * recip[:, None]
    if FMT == 0:
        q = v.to(tl.float8e4nv).to(tl.uint8, bitcast=True)  # RNE, saturating at 448, NaN -> 0x7F
    else:
        v_bits = v.to(tl.uint32, bitcast=True)
        clamped = tl.minimum(v_bits & 0x7FFFFFFF, 0x43600000) | (v_bits & 0x80000000)  # |v| <= 224
        v = tl.where((v_bits & 0x7FFFFFFF) > 0x7F800000, v, clamped.to(tl.float32, bitcast=True))
        q = _encode_e4m3fnuz(v)
    tl.store(q_ptr + (group * group_len)[:, None] + lane[None, :], q, mask=mask)  # q is contiguous
    if SOURCE == 0:
        tl.store(scale_ptr + group, scale, mask=group < n_groups)
    else:
        tl.store(scale_ptr + group * 0, scale, mask=group == 0)


# A whole row is one tile per token; longer rows would not fit a program's registers.
MAX_ROW = 1 << 16


def _tile(group_len: int, n_groups: int, device: torch.device) -> tuple[int, int, int]:
    """(groups per program, padded group length, warps)."""
    elements = _INTERPRETER_TILE_ELEMENTS if runs_interpreted(device) else _GPU_TILE_ELEMENTS
    group = triton.next_power_of_2(group_len)
    block_g = max(1, min(elements // group, triton.next_power_of_2(n_groups)))
    return block_g, group, 4 if block_g * group <= 4096 else 8


def launch_quantize_fp8(x, granularity, group_size, fmt, eps, ue8m0, static_scale, fault="none"):
    """Validate, allocate and launch; `fault` plants a named bug (negative controls only)."""
    check_quantize_fp8_args(x, granularity, group_size, fmt, eps, static_scale)
    devices = {"x": x} if static_scale is None else {"x": x, "static_scale": static_scale}
    check_device(**devices)
    rows = as_rows(x, "x")
    k = x.shape[-1]
    if granularity != "group" and k > MAX_ROW:
        raise ValueError(
            f"x: rows of {k} elements are longer than the kernel's {MAX_ROW} for per-{granularity} "
            f"scales; quantize per group"
        )
    fp8_dtype, fp8_max = FP8_FORMATS[fmt]
    q = torch.empty(x.shape, dtype=fp8_dtype, device=x.device)
    group_len = group_size if granularity == "group" else k
    groups_per_row = k // group_len
    n_groups = rows.shape[0] * groups_per_row
    scales = torch.empty(scale_shape(x, granularity, group_size), dtype=torch.float32, device=x.device)
    if n_groups == 0 or k == 0:
        if granularity == "tensor":
            scales.fill_(static_scale.item() if static_scale is not None else eps / fp8_max)
        return q, scales
    source, source_id = scales, _SCALE_SOURCE["group"]
    if granularity == "tensor":
        if static_scale is not None:
            source, source_id = static_scale.reshape(1), _SCALE_SOURCE["static"]
        else:
            source, source_id = torch.zeros(1, dtype=torch.int32, device=x.device), _SCALE_SOURCE["tensor_amax"]
            block_k = min(triton.next_power_of_2(k), 1024)
            block_r = max(1, 4096 // block_k)
            _amax_bits_kernel[(triton.cdiv(rows.shape[0], block_r),)](
                rows,
                source,
                rows.shape[0],
                k,
                rows.stride(0),
                BLOCK_R=block_r,
                BLOCK_K=block_k,
                **launch_args(x.device),
            )
    block_g, group, warps = _tile(group_len, n_groups, x.device)
    _quantize_fp8_kernel[(triton.cdiv(n_groups, block_g),)](
        rows,
        q.view(torch.uint8),
        scales,
        source,
        n_groups,
        groups_per_row,
        group_len,
        rows.stride(0),
        f32_bits(eps),
        BLOCK_G=block_g,
        GROUP=group,
        FMT=_FMT_ID[fmt],
        FP8_MAX=fp8_max,
        UE8M0=ue8m0,
        SOURCE=source_id,
        CONTIGUOUS=rows.shape[0] == 1 or rows.stride(0) == k,
        FAULT=FAULTS[fault],
        num_warps=warps,
        **launch_args(x.device),
    )
    return q, scales


@torch.library.custom_op("touchstone::quantize_fp8", mutates_args=())
def _quantize_fp8_op(
    x: torch.Tensor,
    granularity: str,
    group_size: int,
    fmt: str,
    eps: float,
    ue8m0: bool,
    static_scale: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    return launch_quantize_fp8(x, granularity, group_size, fmt, eps, ue8m0, static_scale)


@_quantize_fp8_op.register_fake
def _(x, granularity, group_size, fmt, eps, ue8m0, static_scale):
    check_quantize_fp8_args(x, granularity, group_size, fmt, eps, static_scale)
    return (
        x.new_empty(x.shape, dtype=FP8_FORMATS[fmt][0]),
        x.new_empty(scale_shape(x, granularity, group_size), dtype=torch.float32),
    )


def quantize_fp8(
    x: torch.Tensor,
    *,
    granularity: str = "group",
    group_size: int = 128,
    fmt: str = "e4m3fn",
    eps: float = DEFAULT_EPS,
    ue8m0: bool = False,
    static_scale: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Kernel twin of `reference.quant.fp8.quantize_fp8` (same arguments, same bytes)."""
    return torch.ops.touchstone.quantize_fp8(x, granularity, group_size, fmt, eps, ue8m0, static_scale)
