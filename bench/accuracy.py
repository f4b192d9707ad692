"""Accuracy tables: what a benchmark run reports besides timings (e.g. the SQNR of each fused w1/w3 policy).

A table is registered as an `AccuracyReport` (bench.registry.register_accuracy): a name, a title, the ops
it belongs to, and a callable that computes its rows (dicts with the same keys, in column order). `touchstone
bench` computes the tables of the ops it measured and writes `<name>.accuracy.csv` and `.accuracy.md` next
to the timing reports; index.md links them. Like the timing reports, the Markdown is rendered from the CSV,
so `touchstone report` rebuilds it without recomputing.
"""

from __future__ import annotations

import pathlib
from collections.abc import Sequence
from typing import Any

import pandas as pd

from bench import tables
from bench.registry import ACCURACY_REPORTS, AccuracyReport, discover

SUFFIX = ".accuracy"


def csv_path(folder: pathlib.Path, name: str) -> pathlib.Path:
    return folder / f"{name}{SUFFIX}.csv"


def is_accuracy_csv(path: pathlib.Path) -> bool:
    return path.name.endswith(f"{SUFFIX}.csv")


def write(folder: pathlib.Path, report: AccuracyReport, rows: Sequence[dict[str, Any]]) -> pathlib.Path:
    """Write the table's CSV (replacing any earlier one) and render its Markdown."""
    if not rows or any(list(row) != list(rows[0]) for row in rows):
        raise ValueError(f"{report.name}: rows must be non-empty dicts with the same keys in the same order")
    path = csv_path(folder, report.name)
    tables.write(path, pd.DataFrame(list(rows)).map(tables.cell))
    render(folder, report.name)
    return path


def markdown(name: str, frame: pd.DataFrame) -> str:
    discover()  # the table's title and note come from its registration, when it still exists
    report = ACCURACY_REPORTS.get(name)
    parts = [f"# {report.title if report else name}", ""]
    if report and report.note:
        parts += [report.note, ""]
    parts += [tables.markdown(frame), ""]
    if report:
        parts += [
            f"Recompute: `touchstone bench --ops {','.join(report.ops)}`; rebuild this page: `touchstone report`.",
            "",
        ]
    return "\n".join(parts)


def render(folder: pathlib.Path, name: str) -> None:
    (folder / f"{name}{SUFFIX}.md").write_text(markdown(name, tables.read(csv_path(folder, name))))


def names_in(folder: pathlib.Path) -> list[str]:
    return sorted(path.name[: -len(f"{SUFFIX}.csv")] for path in folder.glob(f"*{SUFFIX}.csv"))


def for_ops(ops: Sequence[str]) -> list[AccuracyReport]:
    """The registered tables that belong to any of these ops."""
    return [report for report in ACCURACY_REPORTS.values() if set(report.ops) & set(ops)]
