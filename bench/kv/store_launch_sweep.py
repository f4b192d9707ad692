"""Sweep the KV store kernels' launch shapes on a GPU: GB/s against a memcpy of the same run.

    python -m bench.kv.store_launch_sweep [--tokens 65536]

How the `_GPU` table in kernels/kv_store.py is to be chosen (its comment holds the H200 result).
Full attention: 8 KV heads of 128, block size 16, NHD, bf16 copy and FP8 with per-token-head scales; packed
MLA: fp8_ds_mla and DeepSeek-V4 (block size 64). Slots are a random permutation of the cache (every token
lands in a different place, as after many requests), written into a cache twice the tokens' size. Each config
is checked bit-exact against the reference run on the GPU before its time counts. Moved bytes = inputs read +
cache bytes (and scales) written; the roof is a device-to-device copy of the inputs' size.
"""

from __future__ import annotations

import functools
import sys

import torch

from bench.launch_sweep import gpu_args, memcpy_gbps, parser, report, time_ms
from kernels import kv_store as kernel
from reference.kv import store as ref
from reference.kv.allocate import allocate_kv_cache
from reference.kv.attention import FullAttentionSpec
from reference.kv.packed_mla import DeepseekV4Spec, FP8DsMLASpec

HEADS, HEAD_SIZE, BLOCK = 8, 128, 16
KV_SHAPES = [(h, w) for h in (1, 2, 4, 8) for w in (1, 2, 4, 8) if h * HEAD_SIZE // (32 * w) >= 1]
MLA_WARPS = (1, 2, 4, 8)


def _slots(tokens: int, num_slots: int) -> torch.Tensor:
    return torch.randperm(num_slots, device="cuda")[:tokens]


def sweep_full_attention(tokens: int, dtype: torch.dtype) -> None:
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=HEADS, head_size=HEAD_SIZE, dtype=dtype)
    num_blocks = 2 * tokens // BLOCK
    key, value = (torch.randn(tokens, HEADS, HEAD_SIZE, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    slots = _slots(tokens, num_blocks * BLOCK)
    fp8 = dtype == torch.float8_e4m3fn
    caches = [allocate_kv_cache(spec, num_blocks, device="cuda") for _ in range(2)]
    scales = [
        {n: torch.zeros(num_blocks, BLOCK, HEADS, device="cuda") for n in ("k_scale", "v_scale")}
        if fp8
        else {"k_scale": None, "v_scale": None}
        for _ in range(2)
    ]
    want, got = caches
    ref.store_kv(key, value, want.views[0]["k"], want.views[0]["v"], slots, **scales[0])
    moved = 2 * key.numel() * 2 + 2 * key.numel() * dtype.itemsize + (2 * tokens * HEADS * 4 if fp8 else 0)
    memcpy = memcpy_gbps(2 * key.numel() * 2, f"{dtype} store, {tokens} tokens")
    for heads, warps in KV_SHAPES:
        kernel._GPU.update(heads_per_program=heads, kv_warps=warps)
        got.buffer.zero_()
        call = functools.partial(
            kernel.launch_store_kv,
            key,
            value,
            got.views[0]["k"],
            got.views[0]["v"],
            slots,
            "NHD",
            scales[1]["k_scale"],
            scales[1]["v_scale"],
        )
        call()
        exact = torch.equal(got.buffer, want.buffer) and all(
            s is None or torch.equal(s, scales[0][n]) for n, s in scales[1].items()
        )
        report(f"store_kv {dtype!s:20s} heads/program={heads} warps={warps}", time_ms(call), moved, memcpy, exact)


def sweep_packed_mla(tokens: int, fmt: str) -> None:
    spec = FP8DsMLASpec(block_size=64) if fmt == "fp8_ds_mla" else DeepseekV4Spec(block_size=64)
    num_blocks = 2 * tokens // 64
    latent = torch.randn(tokens, 576 if fmt == "fp8_ds_mla" else 512, device="cuda", dtype=torch.bfloat16)
    slots = _slots(tokens, num_blocks * 64)
    want, got = (allocate_kv_cache(spec, num_blocks, device="cuda") for _ in range(2))

    def store(module, cache):
        views = cache.views[0]
        if fmt == "fp8_ds_mla":
            return functools.partial(module, latent, views["entries"], slots)
        return functools.partial(module, latent, views["data"], views["scales"], slots)

    store(ref.store_fp8_ds_mla if fmt == "fp8_ds_mla" else ref.store_dsv4, want)()
    moved = latent.numel() * 2 + tokens * spec.token_bytes
    memcpy = memcpy_gbps(latent.numel() * 2, f"{fmt} store, {tokens} tokens")
    for warps in MLA_WARPS:
        kernel._GPU.update(mla_warps=warps)
        got.buffer.zero_()
        call = store(kernel.launch_store_fp8_ds_mla if fmt == "fp8_ds_mla" else kernel.launch_store_dsv4, got)
        call()
        report(f"store {fmt:10s} warps={warps}", time_ms(call), moved, memcpy, torch.equal(got.buffer, want.buffer))


def main(argv: list[str] | None = None) -> int:
    cli = parser(__doc__)
    cli.add_argument("--tokens", type=int, default=65536, help="tokens stored per call")
    args = gpu_args(cli, argv, "store_launch_sweep")
    torch.manual_seed(0)
    saved = dict(kernel._GPU)
    try:
        for dtype in (torch.bfloat16, torch.float8_e4m3fn):
            sweep_full_attention(args.tokens, dtype)
        for fmt in ("fp8_ds_mla", "dsv4"):
            sweep_packed_mla(args.tokens, fmt)
    finally:
        kernel._GPU.update(saved)
    return 0


if __name__ == "__main__":
    sys.exit(main())
