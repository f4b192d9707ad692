"""KV store: write N new tokens' K/V (or MLA latents) into their cache slots, in place.

Slots follow vLLM's `slot_mapping` (`reshape_and_cache_flash`, `concat_and_cache_mla`): token i
goes to slot s = slot_mapping[i] of the layer's cache, i.e. block s // block_size, position s % block_size
in that block; a negative slot (vLLM's PAD_SLOT_ID = -1, padding of a CUDA-graph batch) is skipped. Valid
slots must be distinct and below num_blocks * block_size (checked here; the kernel does not read slot values
on the host, so it only skips out-of-range slots rather than writing out of bounds). Nothing but the bytes of
the written slots changes: other slots, other layers, padding bytes stay as they were.

Caches are the views of reference.kv.allocate (any strides, last dim contiguous):
- Full attention (reference.kv.attention), `store_kv`: k_cache/v_cache [num_blocks, block_size, H, D] for
  layout "NHD", [num_blocks, H, block_size, D] for "HND"; key [N, H, D], value [N, H, Dv].
  * bf16 / fp16 / fp32 caches: the values are copied bit for bit (key.dtype must be the cache's dtype).
  * float8_e4m3fn caches: one fp32 scale per (token, head), written to k_scale/v_scale (float32,
    [num_blocks, block_size, H] for NHD, [num_blocks, H, block_size] for HND). The rule is
    `reference.quant.fp8.quantize_fp8(granularity="token")` over each head's D values: amax = max|x|
    clamped at eps = 1e-10, scale = amax / 448 (IEEE division, round to nearest even), q = e4m3fn(clamp(
    x * (1 / scale), +-448)) (RNE). vLLM's FP8_PER_TOKEN_HEAD mode keeps these scales inline in the page;
    reference.kv.attention's spec has no room for them, so they live in their own tensors here.
- Packed MLA (reference.kv.packed_mla), the latent quantized on the way in by reference.kv.packed_codec:
  `store_fp8_ds_mla`: latent bf16 [N, 576] -> entries uint8 [num_blocks, block_size, 656];
  `store_dsv4`: latent bf16 [N, 512] -> data uint8 [num_blocks, block_size, 576] and scales uint8
  [num_blocks, block_size, 8].

Edge-case policy: that of the rule applied. FP8 (per token-head and packed): a NaN in a head (tile) makes its
scale and every code NaN; an Inf makes the scale Inf (UE8M0: 0xFF) and the finite codes 0; -0.0 gives 0x80;
subnormal fp8 codes are kept; nothing saturates except after the fp32 scale's rounding (x * (1 / scale) may
exceed 448 by an ulp: clamped). Copies (bf16/fp16/fp32, RoPE) move bits: NaN payloads and -0.0 survive.
"""

from __future__ import annotations

import torch

from reference.kv.attention import LAYOUTS
from reference.kv.packed_codec import DS_MLA_NOPE, DSV4_NOPE, ROPE_DIM, encode_dsv4, encode_fp8_ds_mla
from reference.kv.packed_mla import DS_MLA_TOKEN_BYTES, DSV4_DATA_ROW_BYTES, DSV4_SCALE_ROW_BYTES
from reference.quant.fp8 import quantize_fp8

COPY_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
FP8_INPUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _check_tensor(name: str, t: object) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: must be a torch.Tensor, got {type(t).__name__}")
    return t


def check_slot_mapping(slot_mapping: torch.Tensor, num_tokens: int) -> None:
    """int64 [num_tokens]; its values are checked by `check_slot_values` (host side, references only)."""
    _check_tensor("slot_mapping", slot_mapping)
    if slot_mapping.dtype != torch.int64:
        raise TypeError(f"slot_mapping: dtype must be torch.int64, got {slot_mapping.dtype}")
    if slot_mapping.dim() != 1 or slot_mapping.shape[0] != num_tokens:
        raise ValueError(
            f"slot_mapping: must be 1-D with one slot per token ({num_tokens}), got shape {tuple(slot_mapping.shape)}"
        )


def check_slot_values(slot_mapping: torch.Tensor, num_slots: int) -> torch.Tensor:
    """The valid (non-negative) slots, each below num_slots and none twice; ValueError naming slot_mapping."""
    slots = slot_mapping[slot_mapping >= 0]
    if slots.numel() and int(slots.max()) >= num_slots:
        raise ValueError(f"slot_mapping: slot {int(slots.max())} is past the cache's {num_slots} slots")
    if slots.unique().numel() != slots.numel():
        raise ValueError("slot_mapping: a slot appears twice; which token would land there is unspecified")
    return slots


def _check_cache(name: str, cache: object, dtype: torch.dtype | None = None) -> torch.Tensor:
    cache = _check_tensor(name, cache)
    if dtype is not None and cache.dtype != dtype:
        raise TypeError(f"{name}: dtype must be {dtype}, got {cache.dtype}")
    if cache.dim() == 0:
        raise ValueError(f"{name}: must have dimensions, got a 0-d tensor")
    if cache.shape[-1] > 1 and cache.stride(-1) != 1:
        raise ValueError(f"{name}: last dim must have stride 1, got strides {cache.stride()}")
    return cache


def check_store_kv_args(key, value, k_cache, v_cache, slot_mapping, layout, k_scale, v_scale) -> tuple[int, int]:
    """Raise TypeError/ValueError naming the bad argument; returns (num_blocks, block_size). Shared with the
    kernel launcher."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout: must be one of {LAYOUTS}, got {layout!r}")
    for name, t in (("key", key), ("value", value)):
        _check_tensor(name, t)
        if t.dim() != 3:
            raise ValueError(f"{name}: must be [num_tokens, num_kv_heads, head_size], got shape {tuple(t.shape)}")
        if t.shape[-1] > 1 and t.stride(-1) != 1:
            raise ValueError(f"{name}: last dim must have stride 1, got strides {t.stride()}")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        _check_cache(name, t)
        if t.dim() != 4:
            raise ValueError(f"{name}: must be 4-D ({layout}), got shape {tuple(t.shape)}")
    if k_cache.dtype != v_cache.dtype:
        raise TypeError(f"v_cache: dtype {v_cache.dtype} differs from k_cache's {k_cache.dtype}")
    num_blocks, block_size, heads = _cache_dims(k_cache, layout)
    if _cache_dims(v_cache, layout) != (num_blocks, block_size, heads):
        raise ValueError(
            f"v_cache: shape {tuple(v_cache.shape)} does not match k_cache's {tuple(k_cache.shape)} "
            f"but for the head size"
        )
    for name, t, cache in (("key", key, k_cache), ("value", value, v_cache)):
        if t.shape[0] != key.shape[0] or t.shape[1] != heads or t.shape[2] != cache.shape[-1]:
            raise ValueError(
                f"{name}: shape {tuple(t.shape)} does not fit its cache: want [{key.shape[0]}, {heads}, "
                f"{cache.shape[-1]}]"
            )
    check_slot_mapping(slot_mapping, key.shape[0])
    fp8 = k_cache.dtype == torch.float8_e4m3fn
    if fp8:
        for name, t in (("key", key), ("value", value)):
            if t.dtype not in FP8_INPUT_DTYPES:
                raise TypeError(f"{name}: dtype must be one of {FP8_INPUT_DTYPES} for an FP8 cache, got {t.dtype}")
        want = (num_blocks, block_size, heads) if layout == "NHD" else (num_blocks, heads, block_size)
        for name, s in (("k_scale", k_scale), ("v_scale", v_scale)):
            if s is None:
                raise ValueError(f"{name}: an FP8 cache needs per-token-head scale tensors")
            _check_tensor(name, s)
            if s.dtype != torch.float32 or tuple(s.shape) != want:
                raise ValueError(f"{name}: must be float32 {want} ({layout}), got {s.dtype} {tuple(s.shape)}")
    else:
        if k_cache.dtype not in COPY_DTYPES:
            raise TypeError(f"k_cache: dtype must be one of {COPY_DTYPES} or torch.float8_e4m3fn, got {k_cache.dtype}")
        for name, t in (("key", key), ("value", value)):
            if t.dtype != k_cache.dtype:
                raise TypeError(f"{name}: dtype {t.dtype} must be the cache's {k_cache.dtype} (stores copy bits)")
        for name, s in (("k_scale", k_scale), ("v_scale", v_scale)):
            if s is not None:
                raise ValueError(f"{name}: only an FP8 cache takes scales, the cache is {k_cache.dtype}")
    return num_blocks, block_size


def _cache_dims(cache: torch.Tensor, layout: str) -> tuple[int, int, int]:
    """(num_blocks, block_size, num_kv_heads) of a 4-D cache view."""
    if layout == "NHD":
        return cache.shape[0], cache.shape[1], cache.shape[2]
    return cache.shape[0], cache.shape[2], cache.shape[1]


def _write(cache: torch.Tensor, layout: str, blocks: torch.Tensor, positions: torch.Tensor, rows: torch.Tensor):
    """cache[block, position] (NHD) or cache[block, :, position] (HND) = rows[i], for each valid token i."""
    if layout == "NHD":
        cache[blocks, positions] = rows
    else:
        cache[blocks, :, positions] = rows


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
    """Write key/value [N, H, D(v)] into k_cache/v_cache at slot_mapping [N] (in place); FP8 caches also get
    each (token, head)'s scale in k_scale/v_scale."""
    num_blocks, block_size = check_store_kv_args(key, value, k_cache, v_cache, slot_mapping, layout, k_scale, v_scale)
    valid = slot_mapping >= 0
    slots = check_slot_values(slot_mapping, num_blocks * block_size)
    blocks, positions = slots // block_size, slots % block_size
    for x, cache, scale in ((key, k_cache, k_scale), (value, v_cache, v_scale)):
        rows = x[valid]
        if cache.dtype == torch.float8_e4m3fn:  # written as bytes: indexed writes of float8 need no device support
            codes, scales = quantize_fp8(rows, granularity="token")
            _write(scale.unsqueeze(-1), layout, blocks, positions, scales)
            cache, rows = cache.view(torch.uint8), codes.view(torch.uint8)
        _write(cache, layout, blocks, positions, rows)


def _check_latent_store(
    latent: torch.Tensor, width: int, slot_mapping: torch.Tensor, rows: tuple[tuple[str, torch.Tensor, int], ...]
) -> tuple[int, int]:
    """Shared argument checks of the packed-MLA stores; returns (num_blocks, block_size)."""
    _check_tensor("latent", latent)
    if latent.dtype != torch.bfloat16:
        raise TypeError(f"latent: dtype must be torch.bfloat16, got {latent.dtype}")
    if latent.dim() != 2 or latent.shape[1] != width:
        raise ValueError(f"latent: must be [num_tokens, {width}], got shape {tuple(latent.shape)}")
    if latent.stride(1) != 1:
        raise ValueError(f"latent: last dim must have stride 1, got strides {latent.stride()}")
    check_slot_mapping(slot_mapping, latent.shape[0])
    first = rows[0][1]
    for name, t, row_bytes in rows:
        _check_cache(name, t, torch.uint8)
        if t.dim() != 3 or t.shape[2] != row_bytes:
            raise ValueError(f"{name}: must be uint8 [num_blocks, block_size, {row_bytes}], got shape {tuple(t.shape)}")
        if t.shape[:2] != first.shape[:2]:
            raise ValueError(f"{name}: blocks {tuple(t.shape[:2])} differ from {rows[0][0]}'s {tuple(first.shape[:2])}")
    return first.shape[0], first.shape[1]


def check_store_fp8_ds_mla_args(latent, entries, slot_mapping) -> tuple[int, int]:
    return _check_latent_store(
        latent, DS_MLA_NOPE + ROPE_DIM, slot_mapping, (("entries", entries, DS_MLA_TOKEN_BYTES),)
    )


def check_store_dsv4_args(latent, data, scales, slot_mapping) -> tuple[int, int]:
    return _check_latent_store(
        latent,
        DSV4_NOPE + ROPE_DIM,
        slot_mapping,
        (("data", data, DSV4_DATA_ROW_BYTES), ("scales", scales, DSV4_SCALE_ROW_BYTES)),
    )


def store_fp8_ds_mla(latent: torch.Tensor, entries: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Encode latent bf16 [N, 576] as fp8_ds_mla and write each token's 656 bytes at its slot (in place)."""
    num_blocks, block_size = check_store_fp8_ds_mla_args(latent, entries, slot_mapping)
    slots = check_slot_values(slot_mapping, num_blocks * block_size)
    entries[slots // block_size, slots % block_size] = encode_fp8_ds_mla(latent[slot_mapping >= 0])


def store_dsv4(latent: torch.Tensor, data: torch.Tensor, scales: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Encode latent bf16 [N, 512] in the DeepSeek-V4 layout and write each token's data row and scale row
    (7 UE8M0 bytes and a 0 pad byte) at its slot (in place)."""
    num_blocks, block_size = check_store_dsv4_args(latent, data, scales, slot_mapping)
    slots = check_slot_values(slot_mapping, num_blocks * block_size)
    rows, scale_rows = encode_dsv4(latent[slot_mapping >= 0])
    data[slots // block_size, slots % block_size] = rows
    scales[slots // block_size, slots % block_size] = scale_rows
