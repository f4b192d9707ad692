"""The tidy row: one per (op, impl, case, metric), its columns, and its CSV storage.

A row whose impl did not run (skipped, error, out of memory, time budget) keeps its place with empty
timings and the reason in `correctness` ("skipped: ...", "error: ..."), so a missing number is always
explained. Derived columns: gbps = bytes / p50, tflops = flops / p50 (empty when the op has no FLOPs
model), fraction_of_roof = gbps or tflops over the same-run roof named in roof_name.

CSV files are upserted: rows of a new run replace rows with the same key (op, impl, dtype, shape, metric)
and leave the others, so re-running one impl after a fix keeps the rest of the table. In memory a row is a
dict while it is measured and the rows of a file are a pandas DataFrame.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Sequence
from typing import Any

import pandas as pd

from bench import oss_records, tables
from bench.environment import ROW_FIELDS

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
    *ROW_FIELDS,
    "timestamp",
    "repro_cmd",
)
NUMERIC_COLUMNS = (
    "x_value",
    "p20",
    "p50",
    "p80",
    "n_samples",
    "bytes",
    "flops",
    "gbps",
    "tflops",
    "roof_value",
    "fraction_of_roof",
)
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


def frame(rows: Sequence[Row]) -> pd.DataFrame:
    return pd.DataFrame(list(rows), columns=list(COLUMNS))


def is_rows_csv(path: pathlib.Path) -> bool:
    """Whether `path` holds tidy op rows (other report tables share the folders)."""
    return tables.header(path) == COLUMNS


def read(path: pathlib.Path) -> pd.DataFrame:
    """The tidy rows of an op's CSV; numeric columns as floats (NaN where the impl did not run)."""
    rows = tables.read(path, NUMERIC_COLUMNS)
    if tuple(rows.columns) != COLUMNS:
        raise ValueError(f"{path}: not a tidy op CSV (columns differ from bench.rows.COLUMNS)")
    return rows


def upsert(path: pathlib.Path, rows: Sequence[Row]) -> pd.DataFrame:
    """Rows of a new run replace rows with the same KEY and leave the others (bench.tables.upsert); the
    PyTorch OSS records beside the CSV are rewritten from the result."""
    merged = tables.upsert(path, frame(rows), KEY, NUMERIC_COLUMNS)
    oss_records.write(path.with_suffix(oss_records.SUFFIX), oss_records.op_records(merged))
    return merged
