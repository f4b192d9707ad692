"""KV store in Triton: write N new tokens into their cache slots, bit-exact with `reference.kv.store`.

Ops (each one launch; call them through the wrappers at the end, which have the reference's signatures):
- `touchstone::store_kv(key, value, k_cache, v_cache, slot_mapping, layout, k_scale, v_scale)`: full
  attention, NHD or HND views of any strides; bf16/fp16/fp32 caches are copied, float8_e4m3fn caches are
  quantized with one fp32 scale per (token, head).
- `touchstone::store_fp8_ds_mla(latent, entries, slot_mapping)` and
  `touchstone::store_dsv4(latent, data, scales, slot_mapping)`: the packed FP8 MLA caches, the latent
  quantized on the way in (power-of-two scales per 128 / 64 NoPE values, RoPE copied as bf16 bytes).

Grid: one program per (token, block of heads) for full attention, one per token for packed MLA. A program
reads its slot, skips it when negative (padding) or past the cache (the launcher never reads slot values: no
host sync), and writes only that slot's bytes. Exactness:
- copies load and store the elements' bits without arithmetic (NaN payloads, -0.0 survive);
- amax is an integer max over |x|'s fp32 bits (NaN, the largest pattern, propagates as in torch);
- the scale and its reciprocal are IEEE divisions (`tl.div_rn`); 2**ceil(log2 s) is done on the bits;
- e4m3fn through the hardware conversion (`cvt.rn.satfinite.e4m3x2.f32` on sm_90: RNE, saturating at 448,
  NaN to 0x7F), which equals the reference's clamp-then-RNE cast (see kernels/fp8_quant.py);
- in the packed caches (uint8 views) every store is of bytes: the fp32 scales of fp8_ds_mla split
  little-endian, the RoPE values' bytes copied, UE8M0 the fp32 scale's exponent field; no store depends on
  the alignment of a view.
- head sizes are constexprs: a power-of-two head needs no lane mask, and the sm_90 PTX then moves 8-16 B a
  thread (bf16 copy: ld/st.global.v2.b32; fp32: v4.b32; FP8 codes: st.global.b32).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._boundary import check_device, f32_bits, runs_interpreted
from kernels._pdl import launch_args, wait_then_release
from reference.kv.packed_codec import AMAX_EPS, DS_MLA_NOPE, DS_MLA_TILE, DSV4_NOPE, DSV4_TILE, ROPE_DIM
from reference.kv.store import check_store_dsv4_args, check_store_fp8_ds_mla_args, check_store_kv_args
from reference.quant.fp8 import DEFAULT_EPS

# Planted bugs for the suite's negative controls; FAULT is a constexpr, so fault 0 compiles them away.
FAULTS = {
    "none": 0,
    "slot_zero_is_padding": 1,  # the padding test off by one (slot <= 0 skipped): slot 0 is never written
}
# GPU launch shapes: heads per program of the full-attention store, and warps of each kernel. H200
# (`python -m bench.kv.store_launch_sweep`, 65536 tokens to random slots, 8 KV heads of 128): all 8 heads a
# program at 1 warp moves 0.94x memcpy GB/s for bf16 and 0.91x for FP8 (4 heads at 4 warps: 0.81x / 0.56x;
# 1 head a program: 0.41x / 0.31x). Packed MLA stores are best at 1 warp: fp8_ds_mla 0.66x,
# DeepSeek-V4 0.63x memcpy (44 and 40 MB moved, ~47 us: more warps only add per-token reduction cost).
_GPU = {"heads_per_program": 8, "kv_warps": 1, "mla_warps": 1}
DS_MLA_ROPE_AT = DS_MLA_NOPE + 4 * 4  # after the four fp32 scales


@triton.jit
def _slot(slot_ptr, token, block_size, num_slots, FAULT: tl.constexpr):
    """(valid, block, position in the block) of one token's slot."""
    slot = tl.load(slot_ptr + token)
    valid = (slot >= 0) & (slot < num_slots)
    if FAULT == 1:
        valid = (slot > 0) & (slot < num_slots)
    slot = tl.where(valid, slot, 0)
    return valid, slot // block_size, slot % block_size


@triton.jit
def _fp8_scale(x, eps_bits, UE8M0: tl.constexpr):
    """Per-row fp32 scales of a [rows, cols] fp32 tile (masked lanes 0): max(amax, eps) / 448, rounded up to a
    power of two when UE8M0 (Inf/NaN stay)."""
    amax_bits = tl.maximum(tl.max(x.to(tl.int32, bitcast=True) & 0x7FFFFFFF, axis=1), eps_bits)
    scale = tl.div_rn(amax_bits.to(tl.float32, bitcast=True), 448.0)
    if UE8M0:
        bits = scale.to(tl.int32, bitcast=True)
        pow2 = (bits & 0x7F800000) + tl.where((bits & 0x7FFFFF) != 0, 0x800000, 0)
        scale = tl.where(bits >= 0x7F800000, bits, pow2).to(tl.float32, bitcast=True)
    return scale


@triton.jit
def _e4m3_bytes(x, scale):
    """e4m3fn codes of x * (1 / scale) per row: RNE, saturating (the hardware conversion on sm_90)."""
    recip = tl.div_rn(tl.full(scale.shape, 1.0, tl.float32), scale)
    return (x * recip[:, None]).to(tl.float8e4nv).to(tl.uint8, bitcast=True)


@triton.jit
def _store_heads(
    src_ptr,
    src_head_stride,
    dst_ptr,
    dst_head_stride,
    scale_ptr,
    scale_head_stride,
    heads,
    row_mask,
    eps_bits,
    HEAD: tl.constexpr,
    FP8: tl.constexpr,
):
    """Rows `heads` of one token ([heads, HEAD] at src) into their cache rows; FP8 also writes the scales.
    HEAD is a constexpr: for a power-of-two head size the lane mask folds away and accesses vectorize."""
    lane = tl.arange(0, triton.next_power_of_2(HEAD))
    mask = row_mask[:, None] & (lane < HEAD)[None, :]
    src = src_ptr + heads[:, None] * src_head_stride + lane[None, :]
    dst = dst_ptr + heads[:, None] * dst_head_stride + lane[None, :]
    if FP8:
        x = tl.load(src, mask=mask, other=0.0).to(tl.float32)
        scale = _fp8_scale(x, eps_bits, False)
        tl.store(dst, _e4m3_bytes(x, scale), mask=mask)
        tl.store(scale_ptr + heads * scale_head_stride, scale, mask=row_mask)
    else:
        tl.store(dst, tl.load(src, mask=mask), mask=mask)


@triton.jit
def _store_kv_kernel(
    key_ptr,
    value_ptr,
    k_cache_ptr,
    v_cache_ptr,
    k_scale_ptr,
    v_scale_ptr,
    slot_ptr,
    num_heads,
    block_size,
    num_slots,
    eps_bits,
    key_token_stride,
    key_head_stride,
    value_token_stride,
    value_head_stride,
    kc_block_stride,
    kc_pos_stride,
    kc_head_stride,
    vc_block_stride,
    vc_pos_stride,
    vc_head_stride,
    ks_block_stride,
    ks_pos_stride,
    ks_head_stride,
    vs_block_stride,
    vs_pos_stride,
    vs_head_stride,
    HEAD_K: tl.constexpr,
    HEAD_V: tl.constexpr,
    BLOCK_H: tl.constexpr,
    FP8: tl.constexpr,
    FAULT: tl.constexpr,
    PDL: tl.constexpr,
):
    wait_then_release(PDL)  # kernels._pdl: before any read of an earlier kernel's output
    token = tl.program_id(0).to(tl.int64)
    valid, block, pos = _slot(slot_ptr, token, block_size, num_slots, FAULT)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    rows = (heads < num_heads) & valid
    _store_heads(
        key_ptr + token * key_token_stride,
        key_head_stride,
        k_cache_ptr + block * kc_block_stride + pos * kc_pos_stride,
        kc_head_stride,
        k_scale_ptr + block * ks_block_stride + pos * ks_pos_stride,
        ks_head_stride,
        heads,
        rows,
        eps_bits,
        HEAD_K,
        FP8,
    )
    _store_heads(
        value_ptr + token * value_token_stride,
        value_head_stride,
        v_cache_ptr + block * vc_block_stride + pos * vc_pos_stride,
        vc_head_stride,
        v_scale_ptr + block * vs_block_stride + pos * vs_pos_stride,
        vs_head_stride,
        heads,
        rows,
        eps_bits,
        HEAD_V,
        FP8,
    )


@triton.jit
def _store_packed_mla_kernel(
    latent_ptr,
    data_ptr,
    scale_ptr,
    slot_ptr,
    block_size,
    num_slots,
    eps_bits,
    latent_token_stride,
    data_block_stride,
    data_pos_stride,
    scale_block_stride,
    scale_pos_stride,
    NOPE: tl.constexpr,
    TILE: tl.constexpr,
    TILES: tl.constexpr,
    SCALE_SLOTS: tl.constexpr,
    ROPE: tl.constexpr,
    ROPE_AT: tl.constexpr,
    UE8M0: tl.constexpr,
    FAULT: tl.constexpr,
):
    """One token: NoPE codes at data[0, NOPE), RoPE bytes at data[ROPE_AT, ROPE_AT + 2 ROPE); scales at
    scale_ptr's row (fp32 bytes, or UE8M0 bytes and zero pad bytes up to SCALE_SLOTS)."""
    token = tl.program_id(0).to(tl.int64)
    valid, block, pos = _slot(slot_ptr, token, block_size, num_slots, FAULT)
    src = latent_ptr + token * latent_token_stride
    data = data_ptr + block * data_block_stride + pos * data_pos_stride
    scale_row = scale_ptr + block * scale_block_stride + pos * scale_pos_stride

    tile = tl.arange(0, SCALE_SLOTS)  # a power of two at least TILES
    lane = tl.arange(0, TILE)
    in_tile = (tile < TILES)[:, None] & (lane < TILE)[None, :]
    nope = tile[:, None] * TILE + lane[None, :]
    x = tl.load(src + nope, mask=in_tile & valid, other=0.0).to(tl.float32)
    scale = _fp8_scale(x, eps_bits, True)
    tl.store(data + nope, _e4m3_bytes(x, scale), mask=in_tile & valid)

    scale_bits = scale.to(tl.uint32, bitcast=True)
    if UE8M0:  # the exponent field: 127 = 1.0; NaN and Inf both 0xFF; the pad bytes 0
        code = tl.where(tile < TILES, (scale_bits >> 23) & 0xFF, 0)
        tl.store(scale_row + tile, code.to(tl.uint8), mask=valid)
    else:  # fp32, little-endian
        byte = tl.arange(0, 4)
        parts = (scale_bits[:, None] >> (8 * byte)[None, :]) & 0xFF
        tl.store(
            scale_row + tile[:, None] * 4 + byte[None, :], parts.to(tl.uint8), mask=(tile < TILES)[:, None] & valid
        )

    rope = tl.arange(0, 2 * ROPE)  # the bf16 RoPE values' bytes, copied
    src_bytes = (src + NOPE).to(tl.pointer_type(tl.uint8), bitcast=True)
    tl.store(data + ROPE_AT + rope, tl.load(src_bytes + rope, mask=valid), mask=valid)


def _strides(cache: torch.Tensor, layout: str) -> tuple[int, int, int]:
    """(block, position, head) element strides of an NHD or HND view (or of its [.., .., ..] scale tensor)."""
    return (
        (cache.stride(0), cache.stride(1), cache.stride(2))
        if layout == "NHD"
        else (cache.stride(0), cache.stride(2), cache.stride(1))
    )


def launch_store_kv(key, value, k_cache, v_cache, slot_mapping, layout, k_scale, v_scale, fault="none"):
    """Validate and launch; `fault` plants a named bug (negative controls only)."""
    num_blocks, block_size = check_store_kv_args(key, value, k_cache, v_cache, slot_mapping, layout, k_scale, v_scale)
    fp8 = k_cache.dtype == torch.float8_e4m3fn
    tensors = dict(key=key, value=value, k_cache=k_cache, v_cache=v_cache, slot_mapping=slot_mapping)
    if fp8:
        tensors.update(k_scale=k_scale, v_scale=v_scale)
    device = check_device(**tensors)
    slot_mapping = slot_mapping.contiguous()  # the kernel reads slot i at slot_ptr + i (a slice may stride)
    num_tokens, heads = key.shape[0], key.shape[1]
    if num_tokens == 0:
        return
    if fp8:  # the kernel stores codes as bytes
        k_cache, v_cache = k_cache.view(torch.uint8), v_cache.view(torch.uint8)
        ks, vs = _strides(k_scale, layout), _strides(v_scale, layout)
    else:
        k_scale = v_scale = slot_mapping  # never read: FP8 is a constexpr
        ks = vs = (0, 0, 0)
    block_h = (
        triton.next_power_of_2(heads)
        if runs_interpreted(device)
        else min(_GPU["heads_per_program"], triton.next_power_of_2(heads))
    )
    _store_kv_kernel[(num_tokens, triton.cdiv(heads, block_h))](
        key,
        value,
        k_cache,
        v_cache,
        k_scale,
        v_scale,
        slot_mapping,
        heads,
        block_size,
        num_blocks * block_size,
        f32_bits(DEFAULT_EPS),
        key.stride(0),
        key.stride(1),
        value.stride(0),
        value.stride(1),
        *_strides(k_cache, layout),
        *_strides(v_cache, layout),
        *ks,
        *vs,
        HEAD_K=key.shape[2],
        HEAD_V=value.shape[2],
        BLOCK_H=block_h,
        FP8=fp8,
        FAULT=FAULTS[fault],
        num_warps=_GPU["kv_warps"],
        **launch_args(device),
    )


def _launch_packed(latent, data, scales, slot_mapping, num_blocks, block_size, fmt, fault):
    check_device(latent=latent, data=data, scales=scales, slot_mapping=slot_mapping)
    slot_mapping = slot_mapping.contiguous()  # the kernel reads slot i at slot_ptr + i (a slice may stride)
    if latent.shape[0] == 0:
        return
    if fmt == "fp8_ds_mla":  # [codes | 4 fp32 scales | RoPE] in one entry
        nope, tile, scale_offset, rope_at = DS_MLA_NOPE, DS_MLA_TILE, DS_MLA_NOPE, DS_MLA_ROPE_AT
    else:  # data row [codes | RoPE], scale row [7 UE8M0 | pad]
        nope, tile, scale_offset, rope_at = DSV4_NOPE, DSV4_TILE, 0, DSV4_NOPE
    _store_packed_mla_kernel[(latent.shape[0],)](
        latent,
        data,
        scales[..., scale_offset:],
        slot_mapping,
        block_size,
        num_blocks * block_size,
        f32_bits(AMAX_EPS),
        latent.stride(0),
        data.stride(0),
        data.stride(1),
        scales.stride(0),
        scales.stride(1),
        NOPE=nope,
        TILE=tile,
        TILES=nope // tile,
        SCALE_SLOTS=triton.next_power_of_2(nope // tile),
        ROPE=ROPE_DIM,
        ROPE_AT=rope_at,
        UE8M0=fmt == "dsv4",
        FAULT=FAULTS[fault],
        num_warps=_GPU["mla_warps"],
    )


def launch_store_fp8_ds_mla(latent, entries, slot_mapping, fault="none"):
    num_blocks, block_size = check_store_fp8_ds_mla_args(latent, entries, slot_mapping)
    _launch_packed(latent, entries, entries, slot_mapping, num_blocks, block_size, "fp8_ds_mla", fault)


def launch_store_dsv4(latent, data, scales, slot_mapping, fault="none"):
    num_blocks, block_size = check_store_dsv4_args(latent, data, scales, slot_mapping)
    _launch_packed(latent, data, scales, slot_mapping, num_blocks, block_size, "dsv4", fault)


@torch.library.custom_op("touchstone::store_kv", mutates_args=("k_cache", "v_cache", "k_scale", "v_scale"))
def _store_kv_op(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    layout: str,
    k_scale: torch.Tensor | None,
    v_scale: torch.Tensor | None,
) -> None:
    launch_store_kv(key, value, k_cache, v_cache, slot_mapping, layout, k_scale, v_scale)


@_store_kv_op.register_fake
def _(key, value, k_cache, v_cache, slot_mapping, layout, k_scale, v_scale):
    check_store_kv_args(key, value, k_cache, v_cache, slot_mapping, layout, k_scale, v_scale)


@torch.library.custom_op("touchstone::store_fp8_ds_mla", mutates_args=("entries",))
def _store_fp8_ds_mla_op(latent: torch.Tensor, entries: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    launch_store_fp8_ds_mla(latent, entries, slot_mapping)


@_store_fp8_ds_mla_op.register_fake
def _(latent, entries, slot_mapping):
    check_store_fp8_ds_mla_args(latent, entries, slot_mapping)


@torch.library.custom_op("touchstone::store_dsv4", mutates_args=("data", "scales"))
def _store_dsv4_op(latent: torch.Tensor, data: torch.Tensor, scales: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    launch_store_dsv4(latent, data, scales, slot_mapping)


@_store_dsv4_op.register_fake
def _(latent, data, scales, slot_mapping):
    check_store_dsv4_args(latent, data, scales, slot_mapping)


def store_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    layout: str = "NHD",
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> None:
    """Kernel twin of `reference.kv.store.store_kv` (same arguments, same bytes)."""
    torch.ops.touchstone.store_kv(key, value, k_cache, v_cache, slot_mapping, layout, k_scale, v_scale)


def store_fp8_ds_mla(latent: torch.Tensor, entries: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Kernel twin of `reference.kv.store.store_fp8_ds_mla`."""
    torch.ops.touchstone.store_fp8_ds_mla(latent, entries, slot_mapping)


def store_dsv4(latent: torch.Tensor, data: torch.Tensor, scales: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Kernel twin of `reference.kv.store.store_dsv4`."""
    torch.ops.touchstone.store_dsv4(latent, data, scales, slot_mapping)
