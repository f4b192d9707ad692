"""`touchstone` command line: `bench` measures and writes reports, `report` rebuilds them from the CSVs.

    touchstone bench [--ops A,B] [--sizes small|full] [--impls X,Y] [--cases 1MiB,1GiB] [--out reports]
                     [--time-budget SECONDS]
    touchstone report [--out reports]
    touchstone list
    touchstone generate "prompt" [--max-tokens N] [--temperature T] [--seed S] [--chat]   (runner.cli)
    touchstone serve [--port 8000] [--shutdown-timeout S]          OpenAI-compatible server (runner.server.cli)
    touchstone bench serve [--concurrency 1,4,16] [--base-url URL]  serving benchmark (bench.serve.cli)

Defaults: every registered op, the "full" sweep on a GPU and "small" on CPU, every impl. Output goes to
<out>/<backend>-<device slug>/ (reports/cuda-h200/ on an H200). CSV rows are written after every
measurement, so a run cut short by a time limit keeps what it measured; --time-budget instead skips the
remaining measurements once the budget is spent and still writes the Markdown and PNG reports.
Exit status: 1 if any row of a gated implementation is a correctness mismatch or an error, else 0
(peers such as torch.compile of the reference are measured and reported, not gated).

`generate`, `serve` and `bench serve` parse their own options and are dispatched before anything imports
torch: `touchstone serve` must report a port in use within 2 s.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from bench.formatting import num, size, times
from bench.rows import Row, make_row, upsert_csv

if TYPE_CHECKING:
    from bench.environment import Environment
    from bench.roofs import Roofs


def _names(values: Sequence[str] | None) -> list[str] | None:
    if not values:
        return None
    return [name for value in values for name in value.split(",") if name]


def parser() -> argparse.ArgumentParser:
    from bench.registry import SWEEPS

    top = argparse.ArgumentParser(prog="touchstone", description="touchstone benchmarks and reports")
    commands = top.add_subparsers(dest="command", required=True)
    bench = commands.add_parser("bench", help="measure registered ops and write reports")
    bench.add_argument("--ops", nargs="+", help="op names (comma or space separated); default: all")
    bench.add_argument("--sizes", choices=SWEEPS, help="sweep; default: full on a GPU, small on CPU")
    bench.add_argument("--impls", nargs="+", help="impl names; default: all of each op's")
    bench.add_argument("--cases", nargs="+", help="case labels from the sweep (e.g. 256MiB); default: all")
    bench.add_argument("--out", default="reports", type=pathlib.Path, help="reports root (default: reports)")
    bench.add_argument("--time-budget", type=float, help="seconds; later measurements are skipped")
    rebuild = commands.add_parser("report", help="rebuild Markdown, PNG and index from existing CSVs")
    rebuild.add_argument("--out", default="reports", type=pathlib.Path, help="reports root or one folder")
    commands.add_parser("list", help="list registered ops, their impls and sweeps")
    commands.add_parser("generate", help="print a completion of the default model (see runner.cli)", add_help=False)
    commands.add_parser(
        "serve",
        help="OpenAI-compatible server on the default model (see runner.server.cli); "
        "`touchstone bench serve` benchmarks one (bench.serve.cli)",
        add_help=False,
    )
    return top


def roof_rows(roofs: Roofs, env: Environment) -> list[Row]:
    from bench.environment import timestamp

    return [
        make_row(
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


def _compact_table(rows: Sequence[Row]) -> str:
    """Final summary for the tail of the GPU log: one line per (op, case), throughput per impl."""
    from bench import report

    lines = []
    for op in dict.fromkeys(row["op"] for row in rows):
        mine = [row for row in rows if row["op"] == op]
        impls = list(dict.fromkeys(row["impl"] for row in mine))
        cells = {(row["impl"], row["x_value"]): row for row in mine}
        lines.append(f"{op} [{mine[0]['x_name']}] " + " | ".join(impls))
        for x in sorted(dict.fromkeys(row["x_value"] for row in mine)):
            texts = []
            for impl in impls:
                row = cells.get((impl, x))
                if row is None or row["p50"] is None:
                    texts.append(row["correctness"].split(":")[0] if row else "")
                else:
                    flag = "" if row["correctness"].startswith(("exact", "baseline")) else f" {row['correctness']}"
                    texts.append(f"{num(report.throughput(row))} ({times(row['fraction_of_roof'])}){flag}")
            lines.append(f"  {size(x):>6}  " + " | ".join(texts))
    return "\n".join(lines)


def run_bench(args: argparse.Namespace) -> int:
    from bench import accuracy, report
    from bench.environment import collect
    from bench.registry import discover
    from bench.roofs import measure_roofs
    from bench.runner import Progress, RunConfig, count_measurements, failures, run_op

    started = time.monotonic()
    registry = discover()
    ops = _names(args.ops) or list(registry)
    unknown = [name for name in ops if name not in registry]
    impls = _names(args.impls)
    known_impls = {impl.name for name in ops if name in registry for impl in registry[name].impls}
    if unknown or (impls and set(impls) - known_impls):
        bad = unknown + sorted(set(impls or ()) - known_impls)
        known = ", ".join(f"{name} ({', '.join(i.name for i in op.impls)})" for name, op in registry.items())
        print(f"unknown ops/impls {bad}; registered: {known}", file=sys.stderr)
        return 2
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
        print(f"{err.args[0]}; see `touchstone list`", file=sys.stderr)
        return 2
    folder = args.out / f"{env.backend}-{env.slug}"
    print(
        f"touchstone bench: {env.device} ({env.backend} {env.arch}), driver {env.driver}, "
        f"clocks at start: {env.clocks_at_start}; torch {env.torch}, triton {env.triton}; "
        f"git {env.git_sha} dirty={env.dirty}; sweep {sweep}; writing {folder}",
        flush=True,
    )
    roofs = measure_roofs(env.torch_device, log=lambda line: print(line, flush=True))
    upsert_csv(folder / report.ROOFS_CSV, roof_rows(roofs, env))
    progress = Progress(total)
    all_rows: list[Row] = []
    for op in selected:
        done: list[Row] = []

        def save(row: Row, op_name: str = op.name, done: list[Row] = done) -> None:
            done.append(row)
            upsert_csv(folder / f"{op_name}.csv", done)

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
    print(f"roofs: memcpy {num(roofs.memcpy.value)} GB/s, gemm bf16 {num(roofs.gemm.value)} TFLOP/s", flush=True)
    peers = {(op.name, impl.name) for op in selected for impl in op.impls if not impl.gated}
    found = failures(all_rows)
    bad = [row for row in found if (row["op"], row["impl"]) not in peers]
    print(
        f"wrote {folder}/ ({len(all_rows)} rows, {len(bad)} mismatches/errors, "
        f"{len(found) - len(bad)} in ungated peers) in {time.monotonic() - started:.0f} s",
        flush=True,
    )
    return 1 if bad else 0


def run_list() -> int:
    from bench.registry import SWEEPS, discover

    for name, op in discover().items():
        print(f"{name} [{op.area}, {op.dtype}, roof {op.roof}] impls: {', '.join(i.name for i in op.impls)}")
        for sweep in SWEEPS:
            print(f"  {sweep}: {', '.join(case.label for case in op.sweeps[sweep])}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["generate"]:  # the runner parses its own options
        from runner.cli import main as generate

        return generate(argv[1:])
    if argv[:1] == ["serve"]:
        from runner.server.cli import main as serve

        return serve(argv[1:])
    if argv[:2] == ["bench", "serve"]:
        from bench.serve.cli import main as bench_serve

        return bench_serve(argv[2:])
    args = parser().parse_args(argv)
    if args.command == "bench":
        return run_bench(args)
    if args.command == "report":
        from bench import report

        folders = report.rebuild(args.out)
        print("rebuilt " + (", ".join(str(f) for f in folders) or f"nothing (no CSV under {args.out})"))
        return 0
    return run_list()


if __name__ == "__main__":
    sys.exit(main())
