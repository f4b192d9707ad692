"""Accuracy tables: what a benchmark run reports besides timings (e.g. the SQNR of each fused w1/w3 policy).

A table is registered as an `AccuracyReport` (bench.registry.register_accuracy): a name, a title, the ops
it belongs to, and a callable that computes its rows (dicts with the same keys, in column order). `touchstone
bench` computes the tables of the ops it measured and writes `<name>.accuracy.csv` and `.accuracy.md` next
to the timing reports; index.md links them. Like the timing reports, the Markdown is rendered from the CSV,
so `touchstone report` rebuilds it without recomputing.
"""

from __future__ import annotations

import csv
import pathlib
from collections.abc import Sequence
from typing import Any

from bench.formatting import md_table
from bench.registry import ACCURACY_REPORTS, AccuracyReport, discover

SUFFIX = ".accuracy"


def csv_path(folder: pathlib.Path, name: str) -> pathlib.Path:
    return folder / f"{name}{SUFFIX}.csv"


def is_accuracy_csv(path: pathlib.Path) -> bool:
    return path.name.endswith(f"{SUFFIX}.csv")


def _cell(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def write(folder: pathlib.Path, report: AccuracyReport, rows: Sequence[dict[str, Any]]) -> pathlib.Path:
    """Write the table's CSV (replacing any earlier one) and render its Markdown."""
    if not rows or any(list(row) != list(rows[0]) for row in rows):
        raise ValueError(f"{report.name}: rows must be non-empty dicts with the same keys in the same order")
    folder.mkdir(parents=True, exist_ok=True)
    path = csv_path(folder, report.name)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows({key: _cell(value) for key, value in row.items()} for row in rows)
    render(folder, report.name)
    return path


def read(path: pathlib.Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def markdown(name: str, rows: Sequence[dict[str, str]]) -> str:
    discover()  # the table's title and note come from its registration, when it still exists
    report = ACCURACY_REPORTS.get(name)
    title = report.title if report else name
    parts = [f"# {title}", ""]
    if report and report.note:
        parts += [report.note, ""]
    header = list(rows[0]) if rows else []
    parts += [md_table(header, [[row[key] for key in header] for row in rows]), ""]
    if report:
        parts += [
            f"Recompute: `touchstone bench --ops {','.join(report.ops)}`; rebuild this page: `touchstone report`.",
            "",
        ]
    return "\n".join(parts)


def render(folder: pathlib.Path, name: str) -> None:
    (folder / f"{name}{SUFFIX}.md").write_text(markdown(name, read(csv_path(folder, name))))


def names_in(folder: pathlib.Path) -> list[str]:
    return sorted(path.name[: -len(f"{SUFFIX}.csv")] for path in folder.glob(f"*{SUFFIX}.csv"))


def for_ops(ops: Sequence[str]) -> list[AccuracyReport]:
    """The registered tables that belong to any of these ops."""
    return [report for report in ACCURACY_REPORTS.values() if set(report.ops) & set(ops)]
