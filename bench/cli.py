"""The bench commands: `touchstone bench` measures and writes reports, `touchstone report` rebuilds them from the
CSVs, `touchstone list` shows what is registered.

Defaults: every registered op, the "full" sweep on a GPU and "small" on CPU, every impl. Output goes to
<out>/<backend>-<device slug>/ (reports/cuda-h200/ on an H200). CSV rows are written after every measurement,
so a run cut short by a time limit keeps what it measured; --time-budget instead skips the remaining
measurements once the budget is spent and still writes the Markdown and PNG reports. Exit status: 1 if any
row of a gated implementation is a correctness mismatch or an error, else 0 (peers such as torch.compile of
the reference are measured and reported, not gated).
"""

from __future__ import annotations

import difflib
import pathlib
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from runner.cli_parser import Parser, fail

if TYPE_CHECKING:
    import argparse

    from bench.environment import Environment
    from bench.roofs import Roofs
    from bench.rows import Row


def _names(values: Sequence[str] | None) -> list[str] | None:
    if not values:
        return None
    return [name for value in values for name in value.split(",") if name]


def bench_parser() -> Parser:
    from bench.registry import SWEEPS

    p = Parser(prog="touchstone bench", description="Measure registered ops and write reports.")
    p.add_argument("--ops", nargs="+", help="op names (comma or space separated); default: all")
    p.add_argument("--sizes", choices=SWEEPS, help="sweep; default: full on a GPU, small on CPU")
    p.add_argument("--impls", nargs="+", help="impl names; default: all of each op's")
    p.add_argument("--cases", nargs="+", help="case labels from the sweep (e.g. 256MiB); default: all")
    p.add_argument("--out", default="reports", type=pathlib.Path, help="reports root (default: reports)")
    p.add_argument("--time-budget", type=float, help="seconds; later measurements are skipped")
    return p


def report_parser() -> Parser:
    p = Parser(prog="touchstone report", description="Rebuild Markdown, PNG and index.md from existing CSVs.")
    p.add_argument("--out", default="reports", type=pathlib.Path, help="reports root or one folder")
    return p


def list_parser() -> Parser:
    return Parser(prog="touchstone list", description="List the registered ops, their impls and sweeps.")


def roof_rows(roofs: Roofs, env: Environment) -> list[Row]:
    from bench import rows as tidy
    from bench.environment import timestamp

    return [
        tidy.make_row(
            op=f"roof-{roof.name}",
            impl=roof.impl,
            dtype=roof.dtype,
            shape=roof.shape,
            x_name="",
            x_value=float("nan"),
            nbytes=roof.bytes,
            flops=roof.flops,
            roof_name=roof.name,
            roof_value=roof.value,
            correctness="n/a",
            environment=env.row_fields(),
            timestamp=timestamp(),
            repro_cmd="touchstone bench",
            timing=roof.timing,
        )
        for roof in roofs
    ]


def _compact_table(done: list[Row]) -> str:
    """Final summary for the tail of the GPU log: one line per (op, case), throughput per impl."""
    import pandas as pd

    from bench import report
    from bench import rows as tidy
    from bench.formatting import num, size, times

    frame = tidy.frame(done)
    lines = []
    for op, mine in frame.groupby("op", sort=False):
        impls = list(mine["impl"].unique())
        lines.append(f"{op} [{mine['x_name'].iloc[0]}] " + " | ".join(impls))
        mine = mine.assign(throughput=report.throughput(mine))
        for x, case in mine.groupby("x_value", sort=True):
            by_impl = case.set_index("impl")
            texts = []
            for impl in impls:
                if impl not in by_impl.index:
                    texts.append("")
                    continue
                row = by_impl.loc[impl]
                if pd.isna(row["p50"]):
                    texts.append(row["correctness"].split(":")[0])
                    continue
                flag = (
                    ""
                    if row["correctness"].startswith(("exact", "baseline", "close", "differs"))
                    else f" {row['correctness']}"
                )
                texts.append(f"{num(row['throughput'])} ({times(row['fraction_of_roof'])}){flag}")
            lines.append(f"  {size(x):>6}  " + " | ".join(texts))
    return "\n".join(lines)


def _unknown(kind: str, wanted: Sequence[str], known: Sequence[str]) -> str:
    """'unknown op 'mxfp4_quant' (did you mean mxfp4_quantize?); `touchstone list` shows them all'."""
    bad = [name for name in wanted if name not in known]
    hints = [
        f"{name!r}" + (f" (did you mean {m[0]}?)" if (m := difflib.get_close_matches(name, known, 1)) else "")
        for name in bad
    ]
    return f"unknown {kind}{'s' if len(bad) > 1 else ''} {', '.join(hints)}; `touchstone list` shows them all"


def run_bench(args: argparse.Namespace) -> int:
    from bench import accuracy, report
    from bench import rows as tidy
    from bench.correctness import is_checked, is_failure
    from bench.environment import collect
    from bench.formatting import num
    from bench.registry import discover
    from bench.roofs import measure_roofs
    from bench.runner import Progress, RunConfig, count_measurements, run_op

    started = time.monotonic()
    registry = discover()
    ops = _names(args.ops) or list(registry)
    impls = _names(args.impls)
    if unknown := [name for name in ops if name not in registry]:
        fail("touchstone bench", _unknown("op", unknown, list(registry)))
    known_impls = sorted({impl.name for name in ops for impl in registry[name].impls})
    if impls and (unknown := [name for name in impls if name not in known_impls]):
        fail("touchstone bench", _unknown("impl", unknown, known_impls))
    env = collect()
    sweep = args.sizes or ("small" if env.torch_device == "cpu" else "full")
    deadline = None if args.time_budget is None else started + args.time_budget
    config = RunConfig(sweep=sweep, impls=impls, cases=_names(args.cases), deadline=deadline)
    selected = [registry[name] for name in ops]
    if config.impls:
        selected = [op for op in selected if any(impl.name in config.impls for impl in op.impls)]
    try:
        total = sum(count_measurements(op, config) for op in selected)
    except KeyError as err:  # a --cases label missing from the chosen sweep
        fail("touchstone bench", f"{err.args[0]}; `touchstone list` shows the sweeps")
    folder = args.out / f"{env.backend}-{env.slug}"
    print(
        f"touchstone bench: {env.device} ({env.backend} {env.arch}), driver {env.driver}, "
        f"clocks at start: {env.clocks_at_start}; torch {env.torch}, triton {env.triton}; "
        f"git {env.git_sha} dirty={env.dirty}; sweep {sweep}; writing {folder}",
        flush=True,
    )
    roofs = measure_roofs(env.torch_device, log=lambda line: print(line, flush=True))
    tidy.upsert(folder / report.ROOFS_CSV, roof_rows(roofs, env))
    progress = Progress(total)
    all_rows: list[Row] = []
    for op in selected:
        done: list[Row] = []

        def save(row: Row, op_name: str = op.name, done: list[Row] = done) -> None:
            done.append(row)
            tidy.upsert(folder / f"{op_name}.csv", done)

        all_rows += run_op(op, env, roofs, config, progress, on_row=save)
        report.render_op(folder, op.name)
        report.render_index(folder)
    for table in accuracy.for_ops([op.name for op in selected]):
        try:
            path = accuracy.write(folder, table, table.rows())
            print(f"accuracy table {table.name}: {path}", flush=True)
        except Exception as err:  # an accuracy table never costs the timings already written
            print(f"accuracy table {table.name}: error: {type(err).__name__}: {err}", file=sys.stderr, flush=True)
    report.render_index(folder)
    print(_compact_table(all_rows), flush=True)
    print(f"roofs: memcpy {num(roofs.memcpy.value)} GB/s, gemm {num(roofs.gemm.value)} TFLOP/s", flush=True)
    gated = {(op.name, impl.name) for op in selected for impl in op.impls if impl.gated}
    checked = [row for row in all_rows if is_checked(row["correctness"])]
    wrong = [row for row in all_rows if is_failure(row["correctness"])]
    bad = [row for row in wrong if (row["op"], row["impl"]) in gated]
    unchecked = sum(row["correctness"].startswith("unchecked") for row in all_rows)
    print(
        f"wrote {folder}/ ({len(all_rows)} rows: {len(checked)} checked against a baseline, {len(bad)} "
        f"mismatches/errors in gated impls, {len(wrong) - len(bad)} in ungated peers, {unchecked} unchecked) "
        f"in {time.monotonic() - started:.0f} s",
        flush=True,
    )
    return 1 if bad else 0


def bench_main(argv: Sequence[str]) -> int:
    return run_bench(bench_parser().parse_args(argv))


def report_main(argv: Sequence[str]) -> int:
    from bench import report

    args = report_parser().parse_args(argv)
    if not args.out.is_dir():
        fail("touchstone report", f"--out {args.out}: no such folder")
    folders = report.rebuild(args.out)
    if not folders:
        fail("touchstone report", f"--out {args.out}: no report CSV under it")
    print("rebuilt " + ", ".join(str(f) for f in folders))
    return 0


def list_main(argv: Sequence[str]) -> int:
    from bench.registry import SWEEPS, discover

    list_parser().parse_args(argv)
    for name, op in discover().items():
        print(f"{name} [{op.area}, {op.dtype}, roof {op.roof}] impls: {', '.join(i.name for i in op.impls)}")
        for sweep in SWEEPS:
            print(f"  {sweep}: {', '.join(case.label for case in op.sweeps[sweep])}")
    return 0
