"""Sweep the paged prefill kernel's launch shapes on a GPU: time, TFLOP/s, and the ratio to SDPA flash.

    python -m bench.attention.paged_prefill_launch_sweep [--quick]

How the `_GPU` table in kernels/paged_prefill.py is to be chosen (its comment holds the H200 result).
Shapes: the bar's, 8 sequences x 2048 new tokens, causal, no prefix (bar >= 0.9x SDPA flash TFLOP/s), and a
chunked-prefill case, 8 x 512 new tokens after 1536 cached; 32 query heads, 8 KV heads, head 128, bf16, block
size 16, block tables a random permutation of the cache. Per config: the kernel's median time, TFLOP/s of the
causal work (4 D Hq per visible (query, key) pair), the ratio to the same-run SDPA flash on the same K/V laid
out contiguously (bottom-right causal mask, K/V expanded to the query heads: flash's work is the same), and
whether the output is within the ("paged_prefill", bf16) tolerance row of the mirror at the config's tile.
"""

from __future__ import annotations

import functools
import itertools
import sys

import torch

from bench.launch_sweep import gpu_args, line, note, parser, time_ms, timed_or_none
from kernels import paged_prefill as kernel
from kernels.tolerances import families, lossy_bound, lossy_metrics, tolerance_verdict
from reference.attention import paged as ref
from reference.kv.allocate import allocate_kv_cache
from reference.kv.attention import FullAttentionSpec

HQ, HKV, HEAD, BLOCK = 32, 8, 128, 16
SHAPES = ((8, 2048, 0), (8, 512, 1536))  # (sequences, new tokens, cached prefix)
TILES_M, TILES_N, WARPS, STAGES = (64, 128), (32, 64, 128), (4, 8), (2, 3, 4)


def problem(batch: int, new: int, prefix: int):
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=HKV, head_size=HEAD, dtype=torch.bfloat16)
    per_seq = (new + prefix) // BLOCK
    cache = allocate_kv_cache(spec, batch * per_seq, device="cuda")
    k_cache, v_cache = cache.views[0]["k"], cache.views[0]["v"]
    k_cache.copy_(torch.randn(k_cache.shape, device="cuda"))
    v_cache.copy_(torch.randn(v_cache.shape, device="cuda"))
    table = torch.randperm(batch * per_seq, device="cuda").view(batch, per_seq).to(torch.int32)
    lens = torch.full((batch,), new + prefix, dtype=torch.int32, device="cuda")
    cu = torch.arange(0, (batch + 1) * new, new, dtype=torch.int32, device="cuda")
    q = torch.randn(batch * new, HQ, HEAD, device="cuda", dtype=torch.bfloat16)
    return q, k_cache, v_cache, table, lens, cu


def sdpa_ms(q, k_cache, v_cache, table, batch: int, new: int, prefix: int) -> float:
    """SDPA flash on the same K/V gathered once into contiguous [B, Hq, L, D] (the gather is not timed). K/V are
    repeated to Hq heads because the prefix case needs a causal_lower_right mask; this peer therefore reads 4x
    the K/V bytes. The bar's peer is the registered bench's `sdpa-flash` (no prefix, enable_gqa=True)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.bias import causal_lower_right

    k, v = (
        c[table.long()].flatten(1, 2).transpose(1, 2).repeat_interleave(HQ // HKV, dim=1).contiguous()
        for c in (k_cache, v_cache)
    )
    q4 = q.view(batch, new, HQ, HEAD).transpose(1, 2).contiguous()
    mask = causal_lower_right(new, new + prefix)

    def call():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(q4, k, v, attn_mask=mask)

    return time_ms(call)


def sweep(batch: int, new: int, prefix: int, configs) -> None:
    q, k_cache, v_cache, table, lens, cu = problem(batch, new, prefix)
    scale = HEAD**-0.5
    flops = 4 * HEAD * HQ * batch * (new * prefix + new * (new + 1) // 2)
    try:
        sdpa = sdpa_ms(q, k_cache, v_cache, table, batch, new, prefix)
        note(
            f"{batch} x {new} new after {prefix} SDPA flash",
            f"{batch} x {new} new after {prefix}: SDPA flash {sdpa * 1e3:.1f} us, {flops / sdpa / 1e9:.0f} TFLOP/s",
            time_us=sdpa * 1e3,
            tflops=flops / sdpa / 1e9,
        )
    except RuntimeError as err:
        sdpa = float("nan")
        note(
            f"{batch} x {new} new after {prefix} SDPA flash",
            f"{batch} x {new} new after {prefix}: SDPA flash unavailable: {str(err)[:80]}",
            verdict=f"unavailable: {str(err)[:80]}",
        )
    bound = lossy_bound(families.PAGED_PREFILL, torch.bfloat16)
    ideal = ref.paged_attention_ideal(q, k_cache, v_cache, table, lens, scale, cu_seqlens=cu)
    mirrors = {}
    for tile_m, tile_n, warps, stages in configs:
        kernel._GPU.update(tile_m=tile_m, tile_n=tile_n, warps=warps, stages=stages)
        name = f"  {batch}x{new}+{prefix} tile_m={tile_m:3d} tile_n={tile_n:3d} warps={warps} stages={stages}"
        call = functools.partial(kernel.launch_paged_prefill, q, k_cache, v_cache, table, lens, cu, scale)
        ms = timed_or_none(call, name)
        if ms is None:
            continue
        if tile_n not in mirrors:
            mirrors[tile_n] = ref.paged_prefill_mirror(q, k_cache, v_cache, table, lens, cu, scale, tile_n)
        line(
            name,
            ms,
            {"SDPA flash": sdpa / ms},
            tolerance_verdict(lossy_metrics(call(), mirrors[tile_n], ideal), bound),
            tflops=flops / ms / 1e9,
        )


def main(argv: list[str] | None = None) -> int:
    cli = parser(__doc__)
    cli.add_argument("--quick", action="store_true", help="tile_m 128, tile_n 64 and 128, warps 8, stages 2, 3")
    args = gpu_args(cli, argv, "paged_prefill_launch_sweep")
    torch.manual_seed(0)
    if args.quick:
        configs = list(itertools.product((128,), (64, 128), (8,), (2, 3)))
    else:
        configs = list(itertools.product(TILES_M, TILES_N, WARPS, STAGES))
    saved = dict(kernel._GPU)
    try:
        for batch, new, prefix in SHAPES:
            sweep(batch, new, prefix, configs)
    finally:
        kernel._GPU.update(saved)
    return 0


if __name__ == "__main__":
    sys.exit(main())
