"""Sweep the W4A16 MXFP4 GEMM's launch configs on a GPU, N = K = 8192: time, speedup over the bf16 matmul of the
same run, and weight GB/s against a memcpy of the same run.

    python -m bench.gemm.w4a16_mxfp4_launch_sweep [--m 1 4 16 128 1024] [--nk 8192]

This is how `_GPU_CONFIGS` in kernels/w4a16_mxfp4_gemm.py is chosen (its comment says which rows are measured
and which are guesses). Every config is checked against the mirror reference (lossy bound of the suites)
before it is timed. Each time is the median of do_bench over a CUDA-graph replay of one launch (the kernel(s)
alone: no Python dispatch), with do_bench's 256 MB L2 flush before every repetition, so the 34 MiB of weights
stream from HBM; "dispatch" is the same op called through torch.ops (what the bench registry times).
Lines: M, config (kernel BLOCK_N BLOCK_M GROUPS SPLIT_K warps stages), us, x bf16 matmul, weight GB/s,
x memcpy, check.
"""

from __future__ import annotations

import itertools
import sys

import torch
from triton.testing import do_bench

from bench.gemm.w4a16_mxfp4 import SCALE_RANGE
from bench.launch_sweep import gpu_args, parser
from kernels import w4a16_mxfp4_gemm as kernel
from kernels.tolerances import families, lossy_bound, lossy_metrics
from reference.gemm.w4a16_mxfp4 import w4a16_mxfp4_gemm_mirror
from reference.quant.mxfp4 import dequantize_mxfp4

# ~2 s per config (compile + timing): ~50 s per M for the dot list, ~2.5 min for the GEMV one.
# GEMV: stages 2 is the register prefetch of the next K tile. Candidates keep 8..32 code words per thread and
# tile (fewer waste the x conversion, more pass ~170 registers: 3 programs per SM or fewer); the row first is
# the best of the previous sweep (no prefetch, old decode: 24.2 us), as a control.
GEMV = [("gemv", 64, 1, 16, 4, 4, 1)] + [
    ("gemv", bn, 1, g, s, w, 2)
    for bn, g, w, s in itertools.product((16, 32, 64), (8, 16, 32), (2, 4, 8), (1, 2, 4, 8, 16))
    if 8 <= bn * g * 4 // (32 * w) <= 32 and 2 <= 256 // g // s and 256 <= 8192 // bn * s <= 4096
]

# M = 2..4: the control, the table's M = 1 row and the runners-up behind it (see kernels/w4a16_mxfp4_gemm.py).
GEMV_SHORT = [
    ("gemv", 64, 1, 16, 4, 4, 1),
    ("gemv", 16, 1, 32, 1, 4, 2),
    ("gemv", 32, 1, 16, 2, 4, 2),
    ("gemv", 64, 1, 8, 4, 4, 2),
    ("gemv", 16, 1, 16, 2, 2, 2),
    ("gemv", 32, 1, 8, 4, 2, 2),
]


def dot_configs(m: int) -> list[tuple]:
    block_ms = [b for b in (16, 32, 64, 128) if b <= max(16, m)][-2:]
    splits = (1, 2, 4) if m <= 64 else (1,)
    return [("dot", bn, bm, 4, s, w, 3) for bn, bm, s, w in itertools.product((64, 128), block_ms, splits, (4, 8))]


def candidates(m: int) -> list[tuple]:
    """GEMV candidates up to M = 4 (one program per row of x; the full list at M = 1 only, so that --m 1 4 16
    fits one 10-minute run), tensor-core ones from M = 1 (padded to 16)."""
    gemv = GEMV if m == 1 else [c for c in GEMV if c in GEMV_SHORT] if m <= 4 else []
    return gemv + dot_configs(m)


def memcpy_gbps() -> float:
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return 2 * src.numel() / do_bench(lambda: dst.copy_(src), warmup=25, rep=200, return_mode="median") / 1e6


def graph_time_ms(fn) -> float:
    fn()  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return do_bench(graph.replay, warmup=25, rep=200, return_mode="median")


def sweep_m(x, codes, scales, w, memcpy: float, only: str | None) -> None:
    m = x.shape[0]
    weight_bytes = codes.numel() + scales.numel()
    bound = lossy_bound(families.W4A16_MXFP4_GEMM, torch.bfloat16)
    want = w4a16_mxfp4_gemm_mirror(x, codes, scales)
    matmul = graph_time_ms(lambda: torch.matmul(x, w.T))
    dispatch = do_bench(lambda: kernel.w4a16_mxfp4_gemm(x, codes, scales), warmup=25, rep=200, return_mode="median")
    print(
        f"M={m}: bf16 matmul {matmul * 1e3:.1f} us; op through torch.ops (default config, do_bench as the "
        f"registry times it) {dispatch * 1e3:.1f} us",
        flush=True,
    )
    results = []
    for config in candidates(m):
        if only and config[0] != only:
            continue
        try:
            got = kernel.launch(x, codes, scales, config=config)
            metrics = lossy_metrics(got, want, want)
            ok = metrics.max_rel <= bound.max_rel and metrics.rms_rel <= bound.rms_rel
            ms = graph_time_ms(lambda config=config: kernel.launch(x, codes, scales, config=config))
        except Exception as err:  # a config that does not compile or fit is a line, not the end of the sweep
            print(f"M={m:5d} {config}  failed: {type(err).__name__}: {str(err).splitlines()[0][:120]}", flush=True)
            continue
        gbps = weight_bytes / ms / 1e6
        results.append((ms, config))
        print(
            f"M={m:5d} {config}  {ms * 1e3:8.1f} us  {matmul / ms:5.2f}x bf16  {gbps:6.0f} GB/s weights  "
            f"{gbps / memcpy:.3f}x memcpy  {'ok' if ok else 'MISMATCH ' + str(metrics)}",
            flush=True,
        )
    if results:
        ms, config = min(results)
        print(
            f"BEST M={m}: {config} {ms * 1e3:.1f} us, {matmul / ms:.2f}x bf16 matmul, "
            f"{weight_bytes / ms / 1e6 / memcpy:.3f}x memcpy",
            flush=True,
        )


def main(argv: list[str] | None = None) -> int:
    cli = parser(__doc__)
    cli.add_argument("--m", type=int, nargs="+", default=[1, 4, 16, 128, 1024])
    cli.add_argument("--nk", type=int, default=8192, help="N = K")
    cli.add_argument("--only", choices=("gemv", "dot"), help="restrict to one kernel")
    args = gpu_args(cli, argv, "w4a16_mxfp4_launch_sweep")
    n = k = args.nk
    gen = torch.Generator(device="cuda").manual_seed(0)
    codes = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device="cuda", generator=gen)
    scales = torch.randint(*SCALE_RANGE, (n, k // 32), dtype=torch.uint8, device="cuda", generator=gen)
    w = dequantize_mxfp4(codes, scales, dtype=torch.bfloat16)
    memcpy = memcpy_gbps()
    print(
        f"memcpy 1 GiB: {memcpy:.0f} GB/s; N = K = {n}; weights {(codes.numel() + scales.numel()) / 2**20:.1f} MiB",
        flush=True,
    )
    for m in args.m:
        x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda", generator=gen)
        sweep_m(x, codes, scales, w, memcpy, args.only)
    return 0


if __name__ == "__main__":
    sys.exit(main())
