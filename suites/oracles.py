"""Independent oracles: ml_dtypes (numpy) codecs, an MXFP4 quantizer derived differently from ours, and the
fp64 product of unquantized GEMM operands (the signal of the GEMM suites' SQNR).

ml_dtypes casts to float4_e2m1fn round to nearest even, saturate and keep the sticky bit; float8_e8m0fnu
holds powers of two. The MX scale rules here use float64 log2 and the fp32 bit trick for "even", not the
reference's exponent-field arithmetic, so the two derivations check each other.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import torch

E2M1 = ml_dtypes.float4_e2m1fn
E8M0 = ml_dtypes.float8_e8m0fnu


def e2m1_codes(values: np.ndarray) -> np.ndarray:
    """float32 values -> 4-bit codes (uint8) through ml_dtypes' cast."""
    return values.astype(np.float32).astype(E2M1).view(np.uint8) & 0xF


def e2m1_values(codes: np.ndarray) -> np.ndarray:
    return codes.astype(np.uint8).view(E2M1).astype(np.float32)


def e8m0_values(scale_bytes: np.ndarray) -> np.ndarray:
    return scale_bytes.astype(np.uint8).view(E8M0).astype(np.float32)


def mx_scale_exponent(amax: np.ndarray, mode: str) -> np.ndarray:
    """Unbiased exponent per block for positive finite amax (float64), clamped to [-127, 127]."""
    with np.errstate(divide="ignore"):
        if mode == "floor":
            e = np.floor(np.log2(amax)) - 2
        elif mode == "rceil":
            e = np.ceil(np.log2(amax / 6.0))
        elif mode == "ceil":
            e = np.ceil(np.log2(amax)) - 2
        elif mode == "even":
            bits = amax.astype(np.float32).view(np.uint32).astype(np.int64)
            e = ((bits + (1 << 21)) >> 23) - 127 - 2  # round the significand to 1 bit, half up
        else:
            raise ValueError(mode)
    return np.clip(e, -127, 127).astype(np.int64)


def quantize_mxfp4(x: torch.Tensor, mode: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Oracle MXFP4 quantizer with the project's policy (NaN/Inf block -> 0xFF and zero codes; zero -> 0x00)."""
    blocks = x.detach().cpu().to(torch.float32).numpy().reshape(-1, 32)
    finite = np.isfinite(blocks).all(axis=1)
    amax = np.where(finite, np.abs(np.where(np.isfinite(blocks), blocks, 0)).max(axis=1), 0).astype(np.float64)
    safe = np.where(finite & (amax > 0), amax, 1.0)
    e = np.where(amax > 0, mx_scale_exponent(safe, mode), -127)
    with np.errstate(over="ignore", invalid="ignore"):  # NaN/Inf blocks: their codes are set to 0 below
        scaled = (blocks.astype(np.float64) * np.exp2(-e.astype(np.float64))[:, None]).astype(np.float32)
    codes = np.where(finite[:, None], e2m1_codes(np.where(finite[:, None], scaled, 0)), 0).astype(np.uint8)
    codes = codes | np.where(finite[:, None] & np.signbit(scaled), 0x8, 0).astype(np.uint8)
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    scales = np.where(finite, e + 127, 0xFF).astype(np.uint8)
    lead = tuple(x.shape[:-1])
    k = x.shape[-1]
    return (torch.from_numpy(packed.reshape(*lead, k // 2)), torch.from_numpy(scales.reshape(*lead, k // 32)))


def dequantize_mxfp4(codes: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    packed = codes.cpu().numpy()
    nibbles = np.stack((packed & 0xF, packed >> 4), axis=-1).reshape(*packed.shape[:-1], -1)
    values = e2m1_values(nibbles).astype(np.float64)
    scale = np.repeat(e8m0_values(scales.cpu().numpy()).astype(np.float64), 32, axis=-1)
    limit = torch.finfo(dtype).max
    with np.errstate(invalid="ignore", over="ignore"):
        product = values * scale
        product = np.where(np.isnan(product), product, np.clip(product, -limit, limit))
    return torch.from_numpy(product.astype(np.float32)).to(dtype)


FP8 = {"e4m3fn": (ml_dtypes.float8_e4m3fn, 448.0), "e4m3fnuz": (ml_dtypes.float8_e4m3fnuz, 224.0)}


def quantize_fp8(
    x: torch.Tensor, granularity: str, group_size: int, fmt: str, eps: float, ue8m0: bool
) -> tuple[np.ndarray, np.ndarray]:
    """Oracle group quantization: numpy float32 arithmetic (log2/exp2 for UE8M0) and ml_dtypes' fp8 casts.
    Returns (fp8 bytes, float32 scales), both flattened."""
    data = x.detach().cpu().to(torch.float32).numpy()
    groups = {
        "tensor": data.reshape(1, -1),
        "token": data.reshape(-1, data.shape[-1]),
        "group": data.reshape(-1, group_size),
    }[granularity]
    dtype, fp8_max = FP8[fmt]
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        amax = np.maximum(np.abs(groups).max(axis=1), np.float32(eps))
        scale = (amax / np.float32(fp8_max)).astype(np.float32)
        if ue8m0:
            scale = np.exp2(np.ceil(np.log2(scale.astype(np.float64)))).astype(np.float32)
        recip = (np.float32(1.0) / scale).astype(np.float32)
        scaled = np.clip(groups * recip[:, None], -fp8_max, fp8_max).astype(np.float32)
    return scaled.astype(dtype).view(np.uint8).reshape(-1), scale.reshape(-1)


E4M3 = ml_dtypes.float8_e4m3fn


def quantize_nvfp4(x: torch.Tensor, encode_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Oracle NVFP4 quantizer: numpy float32 arithmetic in the reference's order, ml_dtypes' E4M3 cast
    (after a clamp to 448: ml_dtypes does not saturate) and E2M1 cast; the project's NaN/Inf-block policy."""
    blocks = x.detach().cpu().to(torch.float32).numpy().reshape(-1, 16)
    s = np.float32(encode_scale)
    finite = np.isfinite(blocks).all(axis=1)
    magnitude = np.abs(np.where(finite[:, None], blocks, 0)).astype(np.float32)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        block_scale = (magnitude.max(axis=1) * (s / np.float32(6.0))).astype(np.float32)
        scale = np.minimum(block_scale, np.float32(448.0)).astype(E4M3)
        stored = scale.astype(np.float32)
        multiplier = np.where(stored == 0, np.float32(0), s / stored).astype(np.float32)
        scaled = (magnitude * multiplier[:, None]).astype(np.float32)
    codes = e2m1_codes(scaled) | np.where(np.signbit(blocks), 0x8, 0).astype(np.uint8)
    codes = np.where(finite[:, None], codes, 0).astype(np.uint8)
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    scale_bytes = np.where(finite, scale.view(np.uint8), 0x7F).astype(np.uint8)
    lead, k = tuple(x.shape[:-1]), x.shape[-1]
    return (torch.from_numpy(packed.reshape(*lead, k // 2)), torch.from_numpy(scale_bytes.reshape(*lead, k // 16)))


def unquantized_product(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """float64 x [M, K] @ w [N, K]^T: the product a quantized GEMM approximates, with the weights (and
    activations) before quantization."""
    return x.to(torch.float64) @ w.to(torch.float64).T
