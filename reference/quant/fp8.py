"""FP8 (E4M3) quantization with one fp32 scale per group: per tensor, per token, per token group, and per
2-D weight block (`quantize_fp8_blocks`, DeepSeek-V3's 128x128 weight tiles).

A group is the whole tensor ("tensor"), one row ("token") or `group_size` consecutive elements of a row
("group", 128 for DeepSeek-V3-style 1x128 activation groups). For each group, in fp32:

    amax  = max(max |x|, eps)                      eps = 1e-10 (vLLM's default); NaN propagates
    scale = amax / fp8_max                         IEEE division, round to nearest even
    scale = 2**ceil(log2 scale)   if ue8m0         exact: the next power of two at or above scale
    r     = 1 / scale                              IEEE division, once per group
    q     = fp8(clamp(x * r, -fp8_max, fp8_max))   one rounding in the multiply, one in the cast (RNE)

`static_scale` (per tensor only) replaces the computed scale. Two choices are pinned where implementations
drift: elements are multiplied by the group's rounded reciprocal (DeepGEMM's `per_token_cast_to_fp8`:
`x * (1.0 / sf)`) rather than divided by the scale (vLLM's `QuantFP8` native group path): the two differ only
where x * r and x / scale round differently, never for a power-of-two (UE8M0) scale, whose reciprocal is exact.
The UE8M0 rounding is exact (not log2f/exp2f, whose ulp errors can cross a binade).

Formats (`fmt`): "e4m3fn" (torch.float8_e4m3fn, clamp at +-448) and "e4m3fnuz" (torch.float8_e4m3fnuz,
the ROCm/MI300 encoding; clamp at +-224 as vLLM does on ROCm, inside the format's 240).

Edge-case policy: NaN in a group makes its amax, scale and every code NaN (a NaN code of the format);
+-Inf makes the scale Inf and r = 0, so finite elements become 0 and the Infs NaN (Inf * 0). -0.0 stays
-0.0 in e4m3fn (0x80) and becomes 0x00 in e4m3fnuz (no negative zero). Subnormal fp8 results are kept. The
clamp runs before the cast, so the result does not depend on whether torch's own cast saturates (e4m3fn
saturates from torch 2.13; e4m3fnuz never does). `eps` must be at least 448 * 2**-126 so that every scale
is a normal fp32.
"""

from __future__ import annotations

import torch

FP8_FORMATS = {"e4m3fn": (torch.float8_e4m3fn, 448.0), "e4m3fnuz": (torch.float8_e4m3fnuz, 224.0)}
GRANULARITIES = ("tensor", "token", "group")
INPUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
OUTPUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
DEFAULT_EPS = 1e-10
MIN_EPS = 448.0 * 2.0**-126


def check_quantize_fp8_args(
    x: torch.Tensor, granularity: str, group_size: int, fmt: str, eps: float, static_scale: torch.Tensor | None
) -> None:
    """Raise TypeError/ValueError naming the bad argument. Shared with the kernel launchers."""
    if not eps >= MIN_EPS:
        raise ValueError(f"eps: must be at least {MIN_EPS:.3g} so that scales are normal fp32, got {eps}")
    if x.dtype not in INPUT_DTYPES:
        raise TypeError(f"x: dtype must be one of {INPUT_DTYPES}, got {x.dtype}")
    if x.dim() == 0:
        raise ValueError("x: needs at least one dimension")
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity must be one of {GRANULARITIES}, got {granularity!r}")
    if fmt not in FP8_FORMATS:
        raise ValueError(f"fmt must be one of {tuple(FP8_FORMATS)}, got {fmt!r}")
    if granularity == "group" and (group_size <= 0 or x.shape[-1] % group_size):
        raise ValueError(f"group_size: must divide the last dim {x.shape[-1]}, got {group_size}")
    if static_scale is not None:
        if granularity != "tensor":
            raise ValueError("static_scale: only per-tensor quantization takes a static scale")
        if static_scale.dtype != torch.float32 or static_scale.numel() != 1:
            raise TypeError(
                f"static_scale: must be a one-element float32 tensor, got {static_scale.dtype} "
                f"with {static_scale.numel()} elements"
            )


def _groups(x: torch.Tensor, granularity: str, group_size: int) -> torch.Tensor:
    if granularity == "tensor":
        return x.reshape(1, -1)
    if granularity == "token":
        return x.reshape(-1, x.shape[-1])
    return x.reshape(-1, group_size)


def scale_shape(x: torch.Tensor, granularity: str, group_size: int) -> tuple[int, ...]:
    """Shape of the scales for `x`: [1] per tensor, [..., 1] per token, [..., K // group_size] per group."""
    if granularity == "tensor":
        return (1,)
    if granularity == "token":
        return (*x.shape[:-1], 1)
    return (*x.shape[:-1], x.shape[-1] // group_size)


def ceil_pow2(scale: torch.Tensor) -> torch.Tensor:
    """Exact 2**ceil(log2 s) for positive normal fp32 s (NaN and Inf pass through): bump the exponent
    unless the mantissa is zero, then drop the mantissa."""
    bits = scale.view(torch.int32)
    exponent = bits & 0x7F800000
    bumped = torch.where((bits & 0x7FFFFF) != 0, exponent + 0x800000, exponent)
    finite = torch.isfinite(scale)
    return torch.where(finite, bumped.view(torch.float32), scale)


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
    """Returns (q of the fp8 dtype, shape of x; scales float32: [1] per tensor, [..., 1] per token,
    [..., K // group_size] per group)."""
    check_quantize_fp8_args(x, granularity, group_size, fmt, eps, static_scale)
    fp8_dtype, fp8_max = FP8_FORMATS[fmt]
    groups = _groups(x.to(torch.float32), granularity, group_size)
    if static_scale is not None:
        scale = static_scale.reshape(1, 1).to(groups.device)
    else:
        amax = groups.abs().amax(dim=-1, keepdim=True).clamp_min(eps)  # amax and clamp_min keep NaN
        # tensor / tensor: CUDA torch evaluates `tensor / python scalar` as tensor * (1 / scalar), which is
        # not the IEEE quotient (1/448 is inexact): the H200 bench found the GPU-eager reference 1 ulp off
        # the CPU one on ~0.6% of codes. Both divisions are spelt so that every device rounds once.
        scale = amax / torch.full_like(amax, fp8_max)
        if ue8m0:
            scale = ceil_pow2(scale)
    scaled = (groups * (torch.ones_like(scale) / scale)).clamp(-fp8_max, fp8_max)  # clamp keeps NaN
    q = scaled.to(fp8_dtype).reshape(x.shape)
    return q, scale.reshape(scale_shape(x, granularity, group_size))


def dequantize_fp8(
    q: torch.Tensor,
    scales: torch.Tensor,
    *,
    granularity: str = "group",
    group_size: int = 128,
    dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """fp32(q) * scale of its group, rounded once to `dtype`."""
    if q.dtype not in {d for d, _ in FP8_FORMATS.values()}:
        raise TypeError(f"q: dtype must be float8_e4m3fn or float8_e4m3fnuz, got {q.dtype}")
    if scales.dtype != torch.float32:
        raise TypeError(f"scales: dtype must be torch.float32, got {scales.dtype}")
    if dtype not in OUTPUT_DTYPES:
        raise TypeError(f"dtype must be one of {OUTPUT_DTYPES}, got {dtype}")
    want = scale_shape(q, granularity, group_size)
    if tuple(scales.shape) != want:
        raise ValueError(
            f"scales: shape {tuple(scales.shape)} does not match q {tuple(q.shape)} per {granularity}: want {want}"
        )
    groups = _groups(q.to(torch.float32), granularity, group_size)
    out = groups * scales.reshape(groups.shape[0], 1).to(torch.float32)
    return out.reshape(q.shape).to(dtype)


def check_quantize_fp8_blocks_args(w: torch.Tensor, block: int, fmt: str, eps: float) -> None:
    """Raise TypeError/ValueError naming the bad argument."""
    if w.dim() != 2:
        raise ValueError(f"w: must be 2-D [N, K], got shape {tuple(w.shape)}")
    if w.dtype not in INPUT_DTYPES:
        raise TypeError(f"w: dtype must be one of {INPUT_DTYPES}, got {w.dtype}")
    if block <= 0:
        raise ValueError(f"block: must be positive, got {block}")
    check_quantize_fp8_args(w, "group", 1, fmt, eps, None)  # fmt and eps


def block_scale_shape(w: torch.Tensor, block: int = 128) -> tuple[int, int]:
    """[ceil(N / block), ceil(K / block)]: one scale per tile, edge tiles included."""
    return (-(-w.shape[0] // block), -(-w.shape[1] // block))


def quantize_fp8_blocks(
    w: torch.Tensor,
    *,
    block: int = 128,
    fmt: str = "e4m3fn",
    eps: float = DEFAULT_EPS,
    ue8m0: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-block weight quantization (DeepSeek-V3 128x128): one fp32 scale per [block x block] tile of a 2-D
    w [N, K]; each tile follows `quantize_fp8`'s per-group rule (amax clamped by eps, NaN/Inf policy,
    UE8M0 rounding). Edge tiles are zero-padded to full size, so the padding never changes an amax.
    Returns (q [N, K] of the fp8 dtype, scales float32 [ceil(N / block), ceil(K / block)])."""
    check_quantize_fp8_blocks_args(w, block, fmt, eps)
    n, k = w.shape
    nb, kb = block_scale_shape(w, block)
    padded = torch.zeros(nb * block, kb * block, dtype=w.dtype, device=w.device)
    padded[:n, :k] = w
    tiles = padded.reshape(nb, block, kb, block).permute(0, 2, 1, 3).reshape(nb, kb, block * block)
    q, scales = quantize_fp8(tiles, granularity="group", group_size=block * block, fmt=fmt, eps=eps, ue8m0=ue8m0)
    q = q.reshape(nb, kb, block, block).permute(0, 2, 1, 3).reshape(nb * block, kb * block)[:n, :k]
    return q.contiguous(), scales.reshape(nb, kb)


def dequantize_fp8_blocks(
    q: torch.Tensor, scales: torch.Tensor, *, block: int = 128, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """fp32(q) * the scale of its tile, rounded once to `dtype`."""
    if q.dim() != 2:
        raise ValueError(f"q: must be 2-D [N, K], got shape {tuple(q.shape)}")
    if scales.dtype != torch.float32 or tuple(scales.shape) != block_scale_shape(q, block):
        raise ValueError(
            f"scales: want float32 {block_scale_shape(q, block)}, got {scales.dtype} {tuple(scales.shape)}"
        )
    n, k = q.shape
    full = scales.repeat_interleave(block, 0).repeat_interleave(block, 1)[:n, :k]
    return (q.to(torch.float32) * full).to(dtype)
