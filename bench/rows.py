"""The tidy row: one per (op, impl, case, metric), its columns, and its CSV storage.

A row whose impl did not run (skipped, error, out of memory, time budget) keeps its place with empty
timings and the reason in `correctness` ("skipped: ...", "error: ..."), so a missing number is always
explained. Derived columns: gbps = bytes / p50, tflops = flops / p50 (empty when the op has no FLOPs
model), fraction_of_roof = gbps or tflops over the same-run roof named in roof_name.

CSV files are upserted: rows of a new run replace rows with the same key (op, impl, dtype, shape, metric)
and leave the others, so re-running one impl after a fix keeps the rest of the table.
"""

from __future__ import annotations

import csv
import json
import pathlib
from collections.abc import Iterable
from typing import Any

COLUMNS = (
    "op",
    "impl",
    "dtype",
    "shape",
    "x_name",
    "x_value",
    "metric",
    "unit",
    "p20",
    "p50",
    "p80",
    "n_samples",
    "bytes",
    "flops",
    "gbps",
    "tflops",
    "roof_name",
    "roof_value",
    "fraction_of_roof",
    "correctness",
    "device",
    "backend",
    "arch",
    "driver",
    "clocks_at_start",
    "torch",
    "triton",
    "python",
    "git_sha",
    "dirty",
    "timestamp",
    "repro_cmd",
)
FLOAT_COLUMNS = ("x_value", "p20", "p50", "p80", "gbps", "tflops", "roof_value", "fraction_of_roof")
INT_COLUMNS = ("n_samples", "bytes", "flops")
KEY = ("op", "impl", "dtype", "shape", "metric")

Row = dict[str, Any]


def repro_command(op: str, sweep: str, impl: str | None = None, case: str | None = None) -> str:
    command = f"touchstone bench --ops {op} --sizes {sweep}"
    if impl:
        command += f" --impls {impl}"
    if case:
        command += f" --cases {case}"
    return command


def make_row(
    *,
    op: str,
    impl: str,
    dtype: str,
    shape: tuple[int, ...],
    x_name: str,
    x_value: float,
    nbytes: int,
    flops: int,
    roof_name: str,
    roof_value: float,
    correctness: str,
    environment: dict[str, str],
    timestamp: str,
    repro_cmd: str,
    timing: Any = None,  # bench.timing.Timing, or None when the impl did not run
) -> Row:
    row: Row = dict.fromkeys(COLUMNS)
    row.update(environment)
    row.update(
        op=op,
        impl=impl,
        dtype=dtype,
        shape=json.dumps(list(shape)),
        x_name=x_name,
        x_value=float(x_value),
        metric="latency",
        unit="ms",
        bytes=int(nbytes),
        flops=int(flops),
        roof_name=roof_name,
        roof_value=float(roof_value),
        correctness=correctness,
        timestamp=timestamp,
        repro_cmd=repro_cmd,
    )
    if timing is not None:
        seconds = timing.p50 * 1e-3
        row.update(p20=timing.p20, p50=timing.p50, p80=timing.p80, n_samples=timing.n_samples)
        row["gbps"] = nbytes / seconds / 1e9
        row["tflops"] = flops / seconds / 1e12 if flops else None
        achieved = row["gbps"] if roof_name == "memcpy" else row["tflops"]
        row["fraction_of_roof"] = achieved / roof_value if achieved is not None and roof_value else None
    missing = set(row) - set(COLUMNS)
    if missing:
        raise KeyError(f"unknown row fields {sorted(missing)}")
    return row


def _parse(column: str, text: str) -> Any:
    if column in FLOAT_COLUMNS:
        return float(text) if text != "" else None
    if column in INT_COLUMNS:
        return int(float(text)) if text != "" else None
    return text


def read_csv(path: pathlib.Path) -> list[Row]:
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        if tuple(reader.fieldnames or ()) != COLUMNS:
            raise ValueError(f"{path}: columns {reader.fieldnames} are not the tidy schema {COLUMNS}")
        return [{column: _parse(column, row[column]) for column in COLUMNS} for row in reader]


def write_csv(path: pathlib.Path, rows: Iterable[Row]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: ("" if row[k] is None else row[k]) for k in COLUMNS})
    tmp.replace(path)  # a run killed mid-write (device time limit) leaves the previous file intact


def upsert_csv(path: pathlib.Path, rows: list[Row]) -> list[Row]:
    """Replace rows with the same KEY, keep the rest; order: kept rows, then the new ones. Returns all."""
    new_keys = {tuple(row[k] for k in KEY) for row in rows}
    try:
        old = read_csv(path) if path.exists() else []
    except ValueError:  # written by an older schema: keep it aside rather than mix columns
        path.replace(path.with_suffix(".csv.old"))
        old = []
    kept = [row for row in old if tuple(row[k] for k in KEY) not in new_keys]
    merged = kept + rows
    write_csv(path, merged)
    return merged
