"""Sweep the RoPE kernel's launch shape on a GPU: time, GB/s, ratio to memcpy and to the runner's eager rotation.

    python -m bench.rotary.rope_launch_sweep

This is how `_GPU_LAUNCH` in kernels/rope.py (tokens a program, half-head tile elements, warps) is to be chosen
(it is untuned until this has run on the H200). Every config is timed as a CUDA-graph replay (decode-sized
calls run for microseconds; launch cost would hide them) on q and k views into a fused bf16 qkv buffer, and
checked bit for bit against the reference on a fresh copy. GPU only.
"""

from __future__ import annotations

import functools
import itertools
import sys

import torch
import triton

from bench.launch_sweep import gpu_args, line, memcpy_gbps, parser, time_ms
from bench.rotary.rope import BASE, HEADS, MAX_POSITIONS, hf_rotation, views
from kernels import rope as kernel
from reference.rotary.rope import apply_rope, rope_cos_sin_cache

TOKENS = (1, 64, 256, 4096)
TOKENS_PER_PROGRAM = (1, 2, 4, 8, 16)
TILE_ELEMENTS = (1024, 2048, 4096)
WARPS = (1, 2, 4)


def launcher(qkv, heads, positions, table, block_t, tile_elements, warps):
    """The kernel's own launch (kernels.rope.launch_rope) with its GPU launch table set to one config."""
    kernel._GPU_LAUNCH.update(tokens=block_t, tile_elements=tile_elements, warps=warps)
    return functools.partial(kernel.launch_rope, *views(qkv, heads), positions, table)


def main(argv: list[str] | None = None) -> int:
    args = gpu_args(parser(__doc__), argv, "rope_launch_sweep")
    del args
    memcpy = memcpy_gbps(1 << 30)
    saved = dict(kernel._GPU_LAUNCH)
    try:
        for (hq, hkv, d), tokens in itertools.product(HEADS, TOKENS):
            sweep(hq, hkv, d, tokens, memcpy)
    finally:
        kernel._GPU_LAUNCH.update(saved)
    return 0


def sweep(hq: int, hkv: int, d: int, tokens: int, memcpy: float) -> None:
    """Every config at one head shape and token count, one line each."""
    table = rope_cos_sin_cache(d, BASE, MAX_POSITIONS, device="cuda")
    qkv = torch.randn(tokens, (hq + 2 * hkv) * d, device="cuda", dtype=torch.bfloat16)
    positions = torch.randint(0, MAX_POSITIONS, (tokens,), device="cuda")
    moved = 2 * tokens * (hq + hkv) * d * 2 + 8 * tokens + 4 * tokens * d
    want_q, want_k = apply_rope(*views(qkv, (hq, hkv, d)), positions, table)
    # the peer: HF's eager rotation (the runner's before this kernel), cos/sin computed outside the timed call
    eager = time_ms(hf_rotation(False)(dict(qkv=qkv.clone(), heads=(hq, hkv, d), positions=positions)), cuda_graph=True)
    for block_t, tile, warps in itertools.product(TOKENS_PER_PROGRAM, TILE_ELEMENTS, WARPS):
        if block_t > triton.next_power_of_2(tokens):
            continue
        fresh = qkv.clone()
        launcher(fresh, (hq, hkv, d), positions, table, block_t, tile, warps)()  # the checked call
        got_q, got_k = views(fresh, (hq, hkv, d))
        exact = torch.equal(got_q, want_q) and torch.equal(got_k, want_k)
        ms = time_ms(launcher(fresh, (hq, hkv, d), positions, table, block_t, tile, warps), cuda_graph=True)
        gbps = moved / ms / 1e6
        config = f"q{hq:2d} kv{hkv} d{d:3d} T={tokens:5d} tokens/prog={block_t:2d} tile={tile:5d} warps={warps}"
        line(
            config,
            ms,
            {"memcpy": gbps / memcpy, "eager-speedup": eager / ms},
            "exact" if exact else "MISMATCH",
            gbps=gbps,
        )


if __name__ == "__main__":
    sys.exit(main())
