"""Sweep the paged decode kernel's launch shapes on a GPU: time, KV GB/s, and ratios to SDPA and memcpy.

    python -m bench.attention.paged_decode_launch_sweep [--quick] [--fp8] [--configs 128x4x2,128x4x1x128]
        [--mma 4x2,8x1] [--shapes 128x4096] [--splits 1,3]

How the `_GPU` table in kernels/paged_decode.py is to be chosen (its comment holds the H200 result). Shapes
are the bars' shapes, built by bench/attention/paged_decode_inputs.py (32 query heads, 8 KV heads, head 128, bf16,
block size 16, K/V-outermost NHD cache, block tables a random permutation of it): batch 128 x context 4096 and batch
8 x context 32768 (the split-K case), each at several split counts. Per config: the kernel's median time, the KV
bytes it must read (K and V of every token) per second, the ratio to the same-run SDPA (`enable_gqa=True`) on the
same KV laid out contiguously (the no-paging ceiling; bar >= 0.92x at batch 128 x 4096) and to memcpy GB/s (bar >=
0.85x at batch 8 x 32k), and whether the output is within the ("paged_decode", bf16) tolerance row of the mirror
reference. `--fp8`: the same K/V stored into an FP8 cache (bench/attention/paged_decode_inputs.fp8_kv), GB/s
counted on the codes and scales read; SDPA stays the bf16 contiguous ceiling (an FP8 cache should beat it).
`--mma WARPSxSUB,...` (with `--fp8`): the FP8 MMA kernel (`kernels.paged_decode_fp8_mma`, the `mma_warps` (and
`mma_few_warps`) and `mma_sub` entries of the table) at each, in place of the generic kernel's grid (which `--configs`
adds back).
"""

from __future__ import annotations

import functools
import itertools
import sys

import torch

from bench.attention import paged_decode_inputs as pdi
from bench.launch_sweep import dims, gpu_args, line, memcpy_gbps, note, parser, time_ms, timed_or_none
from kernels import paged_decode as kernel
from kernels.tolerances import families, lossy_bound, lossy_metrics, tolerance_verdict
from reference.attention import paged as ref

SHAPES = {(128, 4096): (1, 2, 4), (8, 32768): (8, 16, 32, 64)}  # (batch, context): split counts
TILES, WARPS, STAGES = (16, 32, 64, 128), (2, 4, 8), (1, 2, 3, 4)


def sdpa_ms(problem: pdi.Problem) -> float:
    """SDPA decode on the same KV, gathered once into contiguous [B, Hkv, L, D] (the gather is not timed)."""
    k, v = pdi.contiguous_kv(problem)
    q4 = problem.q[:, :, None, :]
    return time_ms(lambda: torch.nn.functional.scaled_dot_product_attention(q4, k, v, enable_gqa=True))


def parse_configs(text: str) -> list[tuple[int, int, int, int | None]]:
    """(tile_n, warps, stages, maxnreg or None) tuples from "TILExWARPSxSTAGES[xMAXNREG],..."."""
    return [(*c, None) if len(c) == 3 else c for c in dims("TILExWARPSxSTAGES[xMAXNREG]", (3, 4))(text)]


def parse_splits(text: str) -> tuple[int, ...]:
    return tuple(c[0] for c in dims("a split count", (1,))(text))


def sweep(batch: int, context: int, splits: tuple[int, ...], configs, mma, memcpy: float, fp8: bool) -> None:
    problem = pdi.make_problem(batch, context, "cuda")
    q, k_cache, v_cache, table, lens, scale, _ = problem.args
    kv_bytes = pdi.kv_bytes(batch, context)
    sdpa = sdpa_ms(problem)
    note(
        f"batch {batch} context {context} SDPA",
        f"batch {batch} context {context}: SDPA {sdpa * 1e3:.1f} us, {kv_bytes / sdpa / 1e6:.0f} GB/s",
        time_us=sdpa * 1e3,
        gbps=kv_bytes / sdpa / 1e6,
    )
    scales = (None, None)
    if fp8:
        k_cache, v_cache, *scales = pdi.fp8_kv(problem)
        kv_bytes = pdi.fp8_kv_bytes(batch, context)
    bound = lossy_bound(families.PAGED_DECODE, torch.bfloat16)
    ideal = ref.paged_attention_ideal(q, k_cache, v_cache, table, lens, scale, k_scale=scales[0], v_scale=scales[1])
    for num_splits in splits:
        mirror = ref.paged_decode_mirror(q, k_cache, v_cache, table, lens, scale, num_splits, *scales)
        runs = [(dict(tile_n=t, warps=w, stages=st, maxnreg=r), False) for t, w, st, r in configs]
        runs += [(dict(mma_warps=w, mma_few_warps=w, mma_sub=sub), True) for w, sub in mma]
        for config, on_mma in runs:
            if on_mma:
                name = f"  B{batch} L{context} splits={num_splits:2d} mma warps={config['mma_warps']}"
                name += f" sub={config['mma_sub']}"
            else:
                key = "fp8_" if fp8 else ""
                config = {key + name: value for name, value in config.items()}
                name = f"  B{batch} L{context} splits={num_splits:2d} tile={config[key + 'tile_n']:3d}"
                name += f" warps={config[key + 'warps']} stages={config[key + 'stages']}"
                name += f" maxnreg={config[key + 'maxnreg']}" if config[key + "maxnreg"] else ""
            call = functools.partial(
                kernel.launch_paged_decode, q, k_cache, v_cache, table, lens, scale, num_splits, *scales,
                config=config, mma=on_mma,
            )  # fmt: skip
            ms = timed_or_none(call, name)
            if ms is None:
                continue
            gbps = kv_bytes / ms / 1e6
            line(
                name,
                ms,
                {"SDPA": sdpa / ms, "memcpy": gbps / memcpy},
                tolerance_verdict(lossy_metrics(call(), mirror, ideal), bound),
                gbps=gbps,
            )


def main(argv: list[str] | None = None) -> int:
    cli = parser(__doc__)
    cli.add_argument("--quick", action="store_true", help="tile 64 only, warps 4 and 8, stages 2 and 3")
    cli.add_argument("--fp8", action="store_true", help="FP8 caches (e4m3fn codes, per-(slot, KV head) scales)")
    cli.add_argument("--configs", type=parse_configs, help="TILExWARPSxSTAGES[xMAXNREG],... in place of the grid")
    cli.add_argument(
        "--shapes", type=dims("BATCHxCONTEXT", (2,)), help="BATCHxCONTEXT,... (default: SHAPES; one not in SHAPES "
        "gets 1 split)",
    )  # fmt: skip
    cli.add_argument("--splits", type=parse_splits, help="split counts, in place of each shape's")
    cli.add_argument("--mma", type=dims("WARPSxSUB", (2,)), default=[], help="FP8 MMA kernel configs (with --fp8)")
    args = gpu_args(cli, argv, "paged_decode_launch_sweep")
    torch.manual_seed(0)
    grid = itertools.product(
        (64,) if args.quick else TILES, (4, 8) if args.quick else WARPS, (2, 3) if args.quick else STAGES, (None,)
    )
    if args.mma and not args.fp8:
        cli.error("--mma: the MMA kernel reads FP8 caches; add --fp8")
    configs = args.configs or ([] if args.mma else list(grid))
    shapes = {shape: SHAPES.get(shape, (1,)) for shape in args.shapes} if args.shapes else dict(SHAPES)
    if args.splits:
        shapes = {shape: args.splits for shape in shapes}
    memcpy = memcpy_gbps(pdi.kv_bytes(8, 32768), "the KV bytes of batch 8 x 32k")
    for (batch, context), splits in shapes.items():
        sweep(batch, context, splits, configs, args.mma, memcpy, args.fp8)
    return 0


if __name__ == "__main__":
    sys.exit(main())
