"""Sweep the MoE layer's launch tiles on a GPU: the whole layer (alignment, both grouped GEMMs, the combine) as a
CUDA-graph replay per (first GEMM's, second GEMM's) tiles, against the same run's peer and roof.

    python -m bench.moe.launch_sweep [--cases mixtral_prefill dsv3_decode dsv3_quant mxfp4_decode
        mxfp4_fragment_decode mxfp4_fragment_gemvs] [--repeats 3]

Cases: mixtral_prefill (bf16, 4,096 tokens; against the `torch._grouped_mm` layer, bench/moe/grouped_mm_peer.py:
the bar is >= 1.0x), dsv3_decode (block FP8, DeepSeek-V3's experts at 1, 2 and 4 tokens: the grouped GEMM's
tiles, which `tiles` forces, and `kernels.moe_gemv`'s block-FP8 launch shapes; against memcpy on the touched
experts' bytes: the bar is >= 0.70x), dsv3_quant (the same experts on the grouped GEMM at its table tiles,
4 to 4,096 tokens: the GEMMs quantizing their inputs as they load them against a separate quantization pass,
the choice behind `kernels.moe_gemm.FUSE_INPUT_QUANT`), mxfp4_decode (gpt-oss-20b's experts at 1, 4 and 16 tokens:
`kernels.moe_gemv`'s launch shapes against the grouped GEMM, which `tiles` forces; memcpy on the touched bytes,
the bar >= 0.60x) and mxfp4_fragment_decode (the same experts in the fragment layout at 1, 4, 16 and 64 tokens:
`kernels.mxfp4_moe_fragment`'s launch configs), and mxfp4_fragment_gemvs (each of that layer's GEMVs alone: its
configs are chosen a GEMV at a time). The layer's own choice (`kernels.moe_gemm.choose_tiles`) is the
line marked "table". Each config is timed `--repeats` times (cold L2 each time), and every p20 / p50 / p80 is
printed, because layer timings on the H200 have come out bimodal (p20 5.07 ms against p50 5.78 ms in one
report). The inputs are the MoE benches' (bench/moe/fused_moe.py, block_fp8_moe.py). GPU only.
"""

from __future__ import annotations

import functools

import torch

from bench.launch_sweep import failed, gpu_args, memcpy_gbps, note, parser, record
from bench.moe import block_fp8_moe as fp8_bench
from bench.moe import fused_moe as bf16_bench
from bench.moe import mxfp4_moe as mx_bench
from bench.moe.grouped_mm_peer import grouped_mm_moe
from bench.moe.layer_bench import cases, touched_experts
from bench.read_floor import read_floor_ms
from bench.timing import bench
from kernels import block_fp8_moe, fused_moe, moe_align, moe_gemv, mxfp4_moe, mxfp4_moe_fragment
from kernels.moe_gemm import ACTIVATIONS, Tiles, choose_tiles, fp8_tiles, mx_tiles
from kernels.mxfp4_moe_fragment_gemv import UP_TOGETHER, launch_gemv

T = Tiles
# (first GEMM's, second GEMM's) tiles; both share BM (the alignment's block). None: the table's choice.
MIXTRAL_PREFILL = (
    None,
    *((T(128, 128, 64, 8, s, g), T(128, 256, 64, 8, 4, 16)) for s in (3, 4) for g in (8, 16, 32)),
    (T(128, 128, 64, 8, 4, 16), T(128, 256, 64, 8, 3, 16)),
    (T(128, 128, 64, 8, 4, 16), T(128, 128, 64, 8, 4, 16)),
    (T(128, 128, 64, 8, 4, 16), T(128, 256, 64, 8, 4, 8)),
    (T(128, 128, 32, 8, 6, 16), T(128, 256, 32, 8, 6, 16)),
    (T(64, 128, 64, 4, 4, 16), T(64, 256, 64, 8, 4, 16)),
)
DSV3_DECODE = (
    None,
    *(
        (T(16, bn1, 128, w, s), T(16, bn2, 128, w, s))
        for bn1, bn2 in ((64, 64), (64, 128), (128, 128))
        for w, s in ((4, 4), (4, 6))
    ),
)


def _time(fn, repeats: int) -> list:
    fn()
    return [bench(fn, "cuda", cuda_graph=True) for _ in range(repeats)]


def _line(case: str, label: str, timings: list, peer_ms: float, peer: str, rate: float | None = None) -> None:
    p50s = [t.p50 for t in timings]
    best = min(p50s)
    spread = "  ".join(f"[{t.p20:.4f} {t.p50:.4f} {t.p80:.4f}]" for t in timings)
    extra = f"  {rate / best / 1e6:.0f} GB/s" if rate is not None else ""
    print(f"{case} {label}  best p50 {best:.4f} ms  {peer_ms / best:.3f}x {peer}{extra}  p20/p50/p80 {spread}")
    record(
        f"{case} {label}",
        time_us=best * 1e3,
        **{f"x_{peer}": peer_ms / best},
        p20_ms=min(t.p20 for t in timings),
        p50s_ms=" ".join(f"{p:.4f}" for p in p50s),
        p80_ms=max(t.p80 for t in timings),
    )


def _label(pair) -> str:
    return (
        "table"
        if pair is None
        else " / ".join(f"{t.bm}x{t.bn}x{t.bk} w{t.warps} s{t.stages} g{t.group_m}" for t in pair)
    )


def mixtral_prefill(repeats: int) -> None:
    case = cases(bf16_bench.SHAPES["mixtral"], (4096,))[0]
    x, w13, w2, weights, ids = bf16_bench.inputs(case, "cuda")
    peer = min(t.p50 for t in _time(lambda: grouped_mm_moe(x, w13, w2, weights, ids), repeats))
    print(f"mixtral_prefill grouped-mm p50 {peer:.4f} ms")
    record("mixtral_prefill grouped-mm", time_us=peer * 1e3)
    for pair in MIXTRAL_PREFILL:
        try:
            timings = _time(functools.partial(fused_moe.launch, x, w13, w2, weights, ids, tiles=pair), repeats)
        except Exception as err:  # a config the GPU cannot run: report, go on
            failed(f"mixtral_prefill {_label(pair)}", err)
            continue
        _line("mixtral_prefill", _label(pair), timings, peer, "grouped-mm")


# kernels.moe_gemv's block-FP8 tensor-core (U, warps) candidates
FP8_GEMV = ((1, 1), (2, 1), (1, 2), (2, 2), (1, 4), (2, 4), (1, 8), (2, 8))


def dsv3_decode(repeats: int) -> None:
    roof = memcpy_gbps(1 << 30, "1 GiB device copy")
    shape = fp8_bench.DSV3
    for tokens in (1, 2, 4):
        case = cases(shape, (tokens,))[0]
        args = fp8_bench.inputs(case, "cuda")
        moved = fp8_bench.moved_bytes(case)
        roof_ms = moved / roof / 1e6
        rows = tokens * shape.top_k
        table = fp8_tiles(*choose_tiles(args[0].device, rows, shape.experts, shape.hidden, shape.inter))
        for pair in (table, *DSV3_DECODE[1:]):  # the grouped GEMM, forced by `tiles`
            label = "grouped " + _label(pair) + (" (table tiles)" if pair is table else "")
            try:
                timings = _time(functools.partial(block_fp8_moe.launch, *args, tiles=pair), repeats)
            except Exception as err:
                failed(f"dsv3_decode T{tokens} {label}", err)
                continue
            _line(f"dsv3_decode T{tokens}", label, timings, roof_ms, "memcpy", moved)
        _gemv_sweep(
            f"dsv3_decode T{tokens}", "FP8_MMA_LAUNCH", FP8_GEMV, functools.partial(block_fp8_moe.launch, *args),
            repeats, roof_ms, moved, "FP8_MAX_ASSIGNMENTS", rows,
        )  # fmt: skip


def dsv3_quant(repeats: int) -> None:
    shape = fp8_bench.DSV3
    for tokens in (4, 16, 64, 256, 1024, 4096):
        case = cases(shape, (tokens,))[0]
        args = fp8_bench.inputs(case, "cuda")
        table = fp8_tiles(*choose_tiles(args[0].device, tokens * shape.top_k, shape.experts, shape.hidden, shape.inter))
        timings = {}
        for fused in (False, True):
            label = ("fused " if fused else "separate ") + _label(table)
            try:
                layer = functools.partial(block_fp8_moe.launch, *args, tiles=table, fuse_quant=fused)
                timings[label] = _time(layer, repeats)
            except Exception as err:
                failed(f"dsv3_quant T{tokens} {label}", err)
        if len(timings) == 2:
            separate = min(t.p50 for t in next(iter(timings.values())))
            for label, t in timings.items():
                _line(f"dsv3_quant T{tokens}", label, t, separate, "separate")
        del args
        torch.cuda.empty_cache()


def _gemv_sweep(
    case: str, knob: str, candidates, layer, repeats: int, roof_ms: float, moved: int, limit: str, rows: int
):  # fmt: skip
    """The layer on its GEMV path (`kernels.moe_gemv`'s assignment limit `limit` raised to `rows` meanwhile) with
    each of its launch `candidates` set in turn at `knob`."""
    table, most = getattr(moe_gemv, knob), getattr(moe_gemv, limit)
    setattr(moe_gemv, limit, max(most, rows))
    try:
        for launch in candidates:
            setattr(moe_gemv, knob, launch)
            label = f"gemv {knob} {launch}" + (" (table)" if launch == table else "")
            try:
                timings = _time(layer, repeats)
            except Exception as err:
                failed(f"{case} {label}", err)
                continue
            _line(case, label, timings, roof_ms, "memcpy", moved)
    finally:
        setattr(moe_gemv, knob, table)
        setattr(moe_gemv, limit, most)


# kernels.moe_gemv's (BLOCK_N, GROUPS, warps) candidates
MX_GEMV = ((16, 32, 4), (16, 16, 4), (32, 16, 4), (32, 32, 8), (16, 16, 2), (64, 16, 8), (8, 32, 2))


def mxfp4_decode(repeats: int) -> None:
    roof = memcpy_gbps(1 << 30, "1 GiB device copy")
    shape = mx_bench.GPTOSS
    for tokens in (1, 4, 16):
        case = cases(shape, (tokens,))[0]
        args = mx_bench.inputs(case, "cuda")
        moved = mx_bench.moved_bytes(case)
        roof_ms = moved / roof / 1e6
        rows = tokens * shape.top_k
        grouped = mx_tiles(
            args[0].device,
            rows,
            shape.experts,
            *choose_tiles(args[0].device, rows, shape.experts, shape.hidden, shape.inter),
        )
        timings = _time(functools.partial(mxfp4_moe.launch, *args, tiles=grouped), repeats)
        _line(f"mxfp4_decode T{tokens}", "grouped GEMM (table tiles)", timings, roof_ms, "memcpy", moved)
        if moe_gemv.takes(rows):
            layer = functools.partial(mxfp4_moe.launch, *args)
            case = f"mxfp4_decode T{tokens}"
            _gemv_sweep(case, "GPU_LAUNCH", MX_GEMV, layer, repeats, roof_ms, moved, "MAX_ASSIGNMENTS", rows)


# kernels.mxfp4_moe_fragment's (WARPS, U, DEPTH, GROUPS) candidates
MX_FRAGMENT = (
    (8, 2, 1, 1), (4, 2, 1, 1), (4, 1, 1, 1), (4, 2, 2, 1), (2, 2, 1, 1), (2, 1, 1, 1), (2, 2, 2, 1), (2, 1, 2, 1),
    (1, 2, 1, 1), (1, 2, 2, 1), (2, 2, 1, 2), (4, 2, 1, 2),
)  # fmt: skip


def mxfp4_fragment_gemvs(repeats: int) -> None:
    """gpt-oss-20b's experts at 1, 4, 16 and 64 tokens: each of the fragment layer's two GEMVs alone (the first on
    x with the activation, the second on its output with the routing weight, both on one alignment made beforehand)
    with each config of MX_FRAGMENT that has one column group, against memcpy on the bytes of the weights it reads;
    the first also on silu's gate-then-up rows, its tiles in one K loop or one after the other (UP_TOGETHER)."""
    roof = memcpy_gbps(1 << 30, "1 GiB device copy")
    shape = mx_bench.GPTOSS
    w13, p13, w2, p2 = mx_bench.fragment_weights(shape.experts, shape.hidden, shape.inter, "cuda")
    for tokens in (1, 4, 16, 64):
        case = cases(shape, (tokens,))[0]
        x, _, _, _, _, weights, ids, activation, b13, b2 = mx_bench.inputs(case, "cuda")
        n = tokens * shape.top_k
        alignment = moe_align.launch(ids, shape.experts, 8)
        w = weights.reshape(-1).float().contiguous()
        h = torch.empty(n, shape.inter, dtype=x.dtype, device="cuda")
        out = torch.empty(n, shape.hidden, dtype=x.dtype, device="cuda")
        experts = touched_experts(case)
        act = ACTIVATIONS[activation]
        first = functools.partial(launch_gemv, x, w13, p13, b13, h, alignment, w, shape.top_k, act, False)
        # the same words as silu's gate rows then up rows (Qwen3-MoE's and Mixtral's activation): a program's gate
        # and up tiles in one K loop (UP_TOGETHER) or one after the other
        silu = functools.partial(launch_gemv, x, w13, p13, b13, h, alignment, w, shape.top_k, ACTIVATIONS["silu"],
                                 False)  # fmt: skip
        second = functools.partial(launch_gemv, h, w2, p2, b2, out, alignment, w, 1, 0, True, early=True)
        table = mxfp4_moe_fragment.gpu_config(n)
        runs = (
            ("first GEMV", w13, p13, first, table[0], True),
            ("first GEMV silu", w13, p13, silu, table[0] if UP_TOGETHER else None, True),
            ("first GEMV silu up apart", w13, p13, silu, None if UP_TOGETHER else table[0], False),
            ("second GEMV", w2, p2, second, table[1], True),
        )
        for which, words, pairs, run, chosen, together in runs:
            moved = experts * (words[0].numel() + pairs[0].numel()) * 4
            for config in (c for c in MX_FRAGMENT if c[3] == 1):
                label = f"{which} {config}" + (" (table)" if config == chosen else "")
                timed = _time(functools.partial(run, config=config, up_together=together), repeats)
                _line(f"mxfp4_fragment_gemvs T{tokens}", label, timed, moved / roof / 1e6, "memcpy", moved)


def mxfp4_fragment_decode(repeats: int) -> None:
    """gpt-oss-20b's experts at 1 ... 1024 tokens: the fragment layer (`kernels.mxfp4_moe_fragment`) with each config
    of MX_FRAGMENT for both GEMVs and the table's pair (up to 64 tokens; the table's alone beyond) and on its other
    path (the bf16 layer on the decoded
    experts), beside the interchange layer's own choice (`kernels.mxfp4_moe`: moe_gemv's GEMVs up to its limit, the
    grouped GEMM above)."""
    roof = memcpy_gbps(1 << 30, "1 GiB device copy")
    shape = mx_bench.GPTOSS
    for tokens in (1, 4, 16, 64, 256, 1024):
        case = cases(shape, (tokens,))[0]
        args = mx_bench.inputs(case, "cuda")
        x, _, _, _, _, weights, ids, activation, b13, b2 = args
        words = mx_bench.fragment_weights(shape.experts, shape.hidden, shape.inter, "cuda")
        moved = mx_bench.moved_bytes(case)
        roof_ms = moved / roof / 1e6
        name = f"mxfp4_fragment_decode T{tokens}"
        _line(name, "interchange layer (its choice)", _time(functools.partial(mxfp4_moe.launch, *args), repeats),
              roof_ms, "memcpy", moved)  # fmt: skip
        floor = read_floor_ms(moved)
        note(f"{name} read floor", f"{name} read floor (one lone kernel reading the bytes moved): {floor * 1e3:.1f} us "
             f"{roof_ms / floor:.3f}x memcpy", time_us=floor * 1e3, x_memcpy=roof_ms / floor)  # fmt: skip
        layer = functools.partial(mxfp4_moe_fragment.launch, x, *words, weights, ids, activation, b13, b2)
        _line(name, "fragment: bf16 layer on the decoded experts", _time(functools.partial(layer, gemv=False), repeats),
              roof_ms, "memcpy", moved)  # fmt: skip
        table = mxfp4_moe_fragment.gpu_config(tokens * shape.top_k)
        table = table[0] if table[0] == table[1] else table  # one config for both GEMVs, or the pair
        for config in dict.fromkeys((*MX_FRAGMENT, table) if tokens <= 64 else (table,)):  # the table's once
            label = f"fragment {config}" + (" (table)" if config == table else "")
            try:
                timings = _time(functools.partial(layer, config=config, gemv=True), repeats)
            except Exception as err:
                failed(f"{name} {label}", err)
                continue
            _line(name, label, timings, roof_ms, "memcpy", moved)


CASES = {
    "mixtral_prefill": mixtral_prefill,
    "dsv3_decode": dsv3_decode,
    "dsv3_quant": dsv3_quant,
    "mxfp4_decode": mxfp4_decode,
    "mxfp4_fragment_decode": mxfp4_fragment_decode,
    "mxfp4_fragment_gemvs": mxfp4_fragment_gemvs,
}


def main(argv: list[str] | None = None) -> None:
    cli = parser(__doc__)
    cli.add_argument("--cases", nargs="+", choices=sorted(CASES), default=sorted(CASES))
    cli.add_argument("--repeats", type=int, default=3, help="timings per config (each cold-L2, CUDA-graph replays)")
    args = gpu_args(cli, argv, "moe_launch_sweep")
    for name in args.cases:
        CASES[name](args.repeats)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
