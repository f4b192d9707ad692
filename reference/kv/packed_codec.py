"""Byte codecs of one token of the packed FP8 MLA caches (layouts in reference.kv.packed_mla).

Rule (FlashMLA's `tests/quant.py`), per tile of the NoPE part
(128 values for fp8_ds_mla, 64 for DeepSeek-V4), in fp32:

    scale = 2**ceil(log2(max(amax / 448, 1e-4)))     a power of two at or above amax / 448, at least 2**-13
    q     = e4m3fn(x / scale)                         RNE; |x / scale| <= 448, so nothing saturates

This is `reference.quant.fp8.quantize_fp8` per group with ue8m0=True and eps = 448e-4 on amax: clamping amax
at 448e-4 before the division and the quotient at 1e-4 after it give the same power of two (1e-4 is far
from one: 2**-13.3), and for a power-of-two scale its multiply-by-reciprocal is the division.
fp8_ds_mla stores the scale as fp32 (little-endian); DeepSeek-V4 as UE8M0, the fp32 exponent field of the
power of two (byte 127 = 1.0, 114 = 2**-13). RoPE values are copied as bf16 bytes. Decoding is
fp32(q) * scale per tile, rounded once to bf16: exact for these scales (e4m3 has 4 significant bits).

Edge-case policy: a NaN in a tile makes its scale NaN (fp32 NaN; UE8M0 0xFF) and every code of the tile
NaN (0x7F, or 0xFF for a negative NaN). An Inf makes the scale Inf (fp32 Inf; UE8M0 has no Inf: 0xFF, NaN)
and the tile's finite values 0, the Inf itself NaN. -0.0 gives code 0x80. RoPE bytes are copied whatever
they hold. The pad byte of a DeepSeek-V4 scale row is 0.
"""

from __future__ import annotations

import torch

from reference.formats.e8m0 import decode_e8m0
from reference.kv.packed_mla import DS_MLA_TOKEN_BYTES, DSV4_DATA_ROW_BYTES, DSV4_SCALE_ROW_BYTES
from reference.quant.fp8 import dequantize_fp8, quantize_fp8

SCALE_FLOOR = 1e-4  # FlashMLA's floor on the scale (its tests/quant.py ties it to FP8_AMAX_MARGIN)
AMAX_EPS = 448.0 * SCALE_FLOOR
ROPE_DIM = 64
DS_MLA_NOPE, DS_MLA_TILE = 512, 128
DSV4_NOPE, DSV4_TILE = 448, 64


def _check_latent(latent: torch.Tensor, nope: int) -> None:
    if not isinstance(latent, torch.Tensor) or latent.dtype != torch.bfloat16:
        raise TypeError(f"latent: dtype must be torch.bfloat16, got {getattr(latent, 'dtype', type(latent).__name__)}")
    if latent.dim() == 0 or latent.shape[-1] != nope + ROPE_DIM:
        raise ValueError(
            f"latent: last dim must be {nope} NoPE + {ROPE_DIM} RoPE = {nope + ROPE_DIM}, "
            f"got shape {tuple(latent.shape)}"
        )


def _check_bytes(name: str, t: torch.Tensor, width: int) -> None:
    if not isinstance(t, torch.Tensor) or t.dtype != torch.uint8:
        raise TypeError(f"{name}: dtype must be torch.uint8, got {getattr(t, 'dtype', type(t).__name__)}")
    if t.dim() == 0 or t.shape[-1] != width:
        raise ValueError(f"{name}: last dim must be {width} bytes, got shape {tuple(t.shape)}")


def _quantize_nope(latent: torch.Tensor, nope: int, tile: int) -> tuple[torch.Tensor, torch.Tensor]:
    return quantize_fp8(latent[..., :nope], granularity="group", group_size=tile, eps=AMAX_EPS, ue8m0=True)


def _rope_bytes(latent: torch.Tensor, nope: int) -> torch.Tensor:
    rope = latent[..., nope:].contiguous()
    return rope.view(torch.uint8)


def encode_fp8_ds_mla(latent: torch.Tensor) -> torch.Tensor:
    """bf16 latent [..., 576] (512 NoPE, 64 RoPE) -> the 656-byte fp8_ds_mla entries, uint8 [..., 656]."""
    _check_latent(latent, DS_MLA_NOPE)
    q, scales = _quantize_nope(latent, DS_MLA_NOPE, DS_MLA_TILE)
    return torch.cat(
        [q.view(torch.uint8), scales.contiguous().view(torch.uint8), _rope_bytes(latent, DS_MLA_NOPE)], dim=-1
    )


def decode_fp8_ds_mla(entries: torch.Tensor) -> torch.Tensor:
    """uint8 [..., 656] fp8_ds_mla entries -> bf16 latent [..., 576]."""
    _check_bytes("entries", entries, DS_MLA_TOKEN_BYTES)
    entries = entries.contiguous()
    q = entries[..., :DS_MLA_NOPE].view(torch.float8_e4m3fn)
    scales = entries[..., DS_MLA_NOPE : DS_MLA_NOPE + 16].view(torch.float32)
    nope = dequantize_fp8(q, scales, granularity="group", group_size=DS_MLA_TILE, dtype=torch.bfloat16)
    return torch.cat([nope, entries[..., DS_MLA_NOPE + 16 :].view(torch.bfloat16)], dim=-1)


def ue8m0_bytes(scales: torch.Tensor) -> torch.Tensor:
    """Power-of-two fp32 scales -> UE8M0 bytes: the exponent field (NaN and Inf both give 0xFF, NaN)."""
    return ((scales.view(torch.int32) >> 23) & 0xFF).to(torch.uint8)


def encode_dsv4(latent: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """bf16 latent [..., 512] (448 NoPE, 64 RoPE) -> (data rows uint8 [..., 576], scale rows uint8 [..., 8])."""
    _check_latent(latent, DSV4_NOPE)
    q, scales = _quantize_nope(latent, DSV4_NOPE, DSV4_TILE)
    data = torch.cat([q.view(torch.uint8), _rope_bytes(latent, DSV4_NOPE)], dim=-1)
    pad = torch.zeros((*scales.shape[:-1], 1), dtype=torch.uint8, device=latent.device)
    return data, torch.cat([ue8m0_bytes(scales), pad], dim=-1)


def decode_dsv4(data: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """(data rows uint8 [..., 576], scale rows uint8 [..., 8]) -> bf16 latent [..., 512]; the pad byte is ignored."""
    _check_bytes("data", data, DSV4_DATA_ROW_BYTES)
    _check_bytes("scales", scales, DSV4_SCALE_ROW_BYTES)
    if data.shape[:-1] != scales.shape[:-1]:
        raise ValueError(f"scales: leading dims {tuple(scales.shape[:-1])} differ from data's {tuple(data.shape[:-1])}")
    data = data.contiguous()
    q = data[..., :DSV4_NOPE].view(torch.float8_e4m3fn)
    factors = decode_e8m0(scales[..., : DSV4_NOPE // DSV4_TILE])
    nope = dequantize_fp8(q, factors, granularity="group", group_size=DSV4_TILE, dtype=torch.bfloat16)
    return torch.cat([nope, data[..., DSV4_NOPE:].view(torch.bfloat16)], dim=-1)
