"""The paged attention suites' shared cases (decode and prefill): NaN-filled NHD caches from the allocator, the
drawn problem's cache and block table with holes and shared prefixes, the named cases' small cache."""

from __future__ import annotations

import torch

from reference.kv.allocate import allocate_kv_cache
from reference.kv.attention import FullAttentionSpec
from reference.kv.store import store_kv

NAN_BYTE = 0xFF  # a fresh cache's every byte: 0xFFFF is NaN in bf16 and in fp16, 0xFF in e4m3fn
DTYPES = (torch.bfloat16, torch.float16)


def make_cache(block_size: int, kv_heads: int, head: int, dtype: torch.dtype, num_blocks: int):
    """NHD K and V views of one allocated layer (K and V interleaved per block, as the allocator lays them),
    every element NaN until written."""
    spec = FullAttentionSpec(block_size=block_size, num_kv_heads=kv_heads, head_size=head, dtype=dtype)
    views = allocate_kv_cache(spec, num_blocks, fill=NAN_BYTE).views[0]
    return views["k"], views["v"]


FIXED = dict(
    dtype=torch.bfloat16,
    block_size=16,
    kv_heads=1,
    group=4,
    head=64,
    seq_lens=[200, 17],
    num_splits=1,
    share_prefix=False,
    extra_width=0,
    spare_blocks=1,
    unused="minus_one",
    sharpness=1.0,
    seed=0,
)


def fixed(**changes) -> dict:
    """A fixed problem for `build` / `build_fp8` (FIXED with `changes`): the named tests' shapes."""
    unknown = set(changes) - set(FIXED) - {"news", "spread"}
    if unknown:
        raise KeyError(f"fixed: unknown keys {sorted(unknown)}")
    return FIXED | changes


def build(p: dict):
    """(q, k_cache, v_cache, block_table, seq_lens, scale) on the CPU. Physical blocks are a random permutation
    with `spare_blocks` never-owned (NaN) blocks among them; sequence 1 may share sequence 0's full leading
    blocks; table entries past a sequence's blocks are -1 or ids of any block (spares and others' included);
    positions past a sequence's length in its last block stay NaN."""
    return _build(p, fp8=False)[:6]


def build_fp8(p: dict):
    """build(p) over FP8 caches: (q, k_cache, v_cache, block_table, seq_lens, scale, k_scale, v_scale). The same
    tokens (in q's dtype, each (token, head) row times 2**u, u uniform in +-p["spread"]) go in through the real
    FP8 store reference (reference.kv.store.store_kv), so codes and scales are what a model's cache would hold;
    unwritten codes (0xFF) and scales are NaN."""
    return _build(p, fp8=True)


def _build(p: dict, fp8: bool):
    gen = torch.Generator().manual_seed(p["seed"])
    bs, lens = p["block_size"], p["seq_lens"]
    counts = [-(-n // bs) for n in lens]
    shared = min(lens[0], lens[1]) // bs if p["share_prefix"] and len(lens) > 1 else 0
    num_blocks = sum(counts) - shared + p["spare_blocks"]
    ids = torch.randperm(num_blocks, generator=gen).tolist()
    width = max(counts) + p["extra_width"]
    if p["unused"] == "minus_one":
        table = torch.full((len(lens), width), -1, dtype=torch.int32)
    else:
        table = torch.randint(0, num_blocks, (len(lens), width), generator=gen, dtype=torch.int32)
    k_cache, v_cache = make_cache(bs, p["kv_heads"], p["head"], torch.float8_e4m3fn if fp8 else p["dtype"], num_blocks)
    rows = {"k": [], "v": [], "slots": []}  # FP8: what goes through the store
    for b, (n, count) in enumerate(zip(lens, counts, strict=True)):
        reuse = table[0, :shared].tolist() if b == 1 else []
        own = reuse + [ids.pop() for _ in range(count - len(reuse))]
        table[b, :count] = torch.tensor(own, dtype=torch.int32)
        for j, block in enumerate(own[len(reuse) :], start=len(reuse)):
            fill = min(bs, n - j * bs)
            for name, cache in (("k", k_cache), ("v", v_cache)):
                x = torch.randn(cache[block, :fill].shape, generator=gen)
                if not fp8:
                    cache[block, :fill] = x.to(p["dtype"])
                    continue
                u = torch.rand((*x.shape[:2], 1), generator=gen) * 2 - 1
                rows[name].append((x * 2.0 ** (u * p["spread"])).to(p["dtype"]))
            rows["slots"].append(block * bs + torch.arange(fill))
    q = (torch.randn(len(lens), p["kv_heads"] * p["group"], p["head"], generator=gen) * p["sharpness"]).to(p["dtype"])
    scales = (None, None)
    if fp8:
        scales = tuple(torch.full(k_cache.shape[:3], torch.nan) for _ in range(2))
        store_kv(
            torch.cat(rows["k"]),
            torch.cat(rows["v"]),
            k_cache,
            v_cache,
            torch.cat(rows["slots"]),
            k_scale=scales[0],
            v_scale=scales[1],
        )
    return q, k_cache, v_cache, table, torch.tensor(lens, dtype=torch.int32), p["head"] ** -0.5, *scales


def on(device: str, *tensors: torch.Tensor):
    return [t.to(device) for t in tensors]


def named(dtype=torch.bfloat16, head=64, kv_heads=2, group=2, block_size=16, num_blocks=6):
    k_cache, v_cache = make_cache(block_size, kv_heads, head, dtype, num_blocks)
    table = torch.tensor([[4, 1, 5, 0]], dtype=torch.int32)  # out of order, block 2 and 3 never owned
    return k_cache, v_cache, table, head**-0.5


def equal_keys(gen: torch.Generator):
    """named() with 48 equal keys in blocks 4, 1, 5 (logical 0..2) and V[t, d] = t + d (integers, exact in bf16):
    every weight is exactly 1, so any mean of V rows is exact in fp32."""
    k_cache, v_cache, table, scale = named()
    key = torch.randn(2, 64, generator=gen).bfloat16()
    value = (torch.arange(16)[:, None, None] + torch.arange(64)[None, None, :]).expand(16, 2, 64)
    for j, block in enumerate([4, 1, 5]):
        k_cache[block] = key
        v_cache[block] = (value + 16 * j).bfloat16()
    return k_cache, v_cache, table, scale


def dominant_key(gen: torch.Generator):
    """named(kv_heads=1, group=4) with every key 0 in blocks 4, 1, 5, 0 but token 37's (block 5, row 5) 25:
    a query of ones scores it 64 * 25 / 8 = 200 above the rest, so the others weigh e^-200 = 0 in fp32."""
    k_cache, v_cache, table, scale = named(kv_heads=1, group=4)
    for block in (4, 1, 5, 0):
        k_cache[block] = 0.0
        v_cache[block] = torch.randn(16, 1, 64, generator=gen).bfloat16()
    k_cache[5, 5] = 25.0
    return k_cache, v_cache, table, scale
