"""Every report table on disk, through pandas: CSV read, atomic write, upsert on a key, and Markdown.

One writer serves the op reports (the tidy rows of `bench.rows`, upserted run after run), the accuracy tables
and the runner and serving reports (a table per run, written whole). Beside each CSV, `bench.oss_records`
writes the same rows as PyTorch OSS benchmark-database records.
"""

from __future__ import annotations

import math
import pathlib
import re
from collections.abc import Callable, Sequence

import pandas as pd

from bench import oss_records
from bench.environment import Environment, timestamp


def read(path: pathlib.Path, numeric: Sequence[str] = ()) -> pd.DataFrame:
    """A CSV as text columns (an empty cell is ""), with the `numeric` columns parsed (an empty cell is NaN)."""
    frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    for column in numeric:
        frame[column] = frame[column].map(lambda text: float(text) if text != "" else math.nan).astype(float)
    return frame


def header(path: pathlib.Path) -> tuple[str, ...]:
    return tuple(pd.read_csv(path, nrows=0).columns)


def write(path: pathlib.Path, frame: pd.DataFrame) -> None:
    """Write `frame` to `path`; a run killed mid-write (a device time limit) leaves the previous file intact."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    frame.to_csv(tmp, index=False, float_format="%.17g")
    tmp.replace(path)


def upsert(path: pathlib.Path, frame: pd.DataFrame, key: Sequence[str], numeric: Sequence[str] = ()) -> pd.DataFrame:
    """Replace the rows of `path` that share `key` with a row of `frame`, keep the others: kept rows first,
    then the new ones. Returns what was written."""
    if path.exists():
        old = read(path, numeric)
        if tuple(old.columns) != tuple(frame.columns):
            raise ValueError(f"{path}: its columns differ from the rows being written; migrate it first")
        frame = pd.concat([old, frame], ignore_index=True).drop_duplicates(subset=list(key), keep="last")
    frame = frame.reset_index(drop=True)
    write(path, frame)
    return frame


def cell(value: object) -> str:
    """A value as the Markdown tables print it: floats to 4 significant digits, missing as an em dash."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    if isinstance(value, float):  # 4 significant digits; large values whole, with thousands separators
        return f"{value:,.0f}" if abs(value) >= 1e4 else f"{value:.4g}"
    return str(value)


_NUMERIC = re.compile(r"^(—|-?[\d.]+)")


def markdown(frame: pd.DataFrame, columns: Sequence[str] | None = None) -> str:
    """GitHub Markdown of `frame` (or of its `columns`), every cell through `cell`; columns whose cells all start
    with a number are right-aligned."""
    shown = (frame if columns is None else frame[list(columns)]).map(cell)
    align = ["right" if len(shown) and shown[c].map(lambda s: bool(_NUMERIC.match(s))).all() else "left" for c in shown]
    return shown.to_markdown(index=False, disable_numparse=True, colalign=align)


# The run's columns at the end of every report outside the op registry (values from the environment and the
# command line).
RUN_COLUMNS = ("device", "torch", "triton", "git_sha", "dirty", "command")


def command_line(prog: str, argv: Sequence[str] | None) -> str:
    """The command a report says it came from: `prog` and the arguments given (sys.argv's when None)."""
    import sys

    return " ".join([prog, *(sys.argv[1:] if argv is None else argv)])


def write_report(
    out: pathlib.Path,
    env: Environment,
    name: str,
    rows: Sequence[dict],
    columns: Sequence[str],
    shown: Sequence[str],
    headline: str,
    common: dict,
    intro: Sequence[str] = (),
    plot: Callable[[pathlib.Path], None] | None = None,
) -> pathlib.Path:
    """A report outside the op registry (the runner's throughput, the serving benchmark): <name>.csv with the
    `columns` (a row's missing value comes from `common`, then the environment), <name>.md (a headline, the
    environment, the `intro` lines, a table of the `shown` columns, then <name>.png, which `plot(path)` draws
    or the caller does) and <name>.pytorch.json. Returns the folder."""
    folder = out / f"{env.backend}-{env.slug}"
    base = dict(device=env.device, torch=env.torch, triton=env.triton, git_sha=env.git_sha, dirty=env.dirty, **common)
    frame = pd.DataFrame([{col: row.get(col, base.get(col, "")) for col in columns} for row in rows], columns=columns)
    write(folder / f"{name}.csv", frame)
    versions = ", ".join(f"{k} {base[k]}" for k in ("torch", "triton", "transformers") if k in base)
    lines = [f"# {name}", "", headline, "", f"{env.device}; {versions}; git {env.git_sha} dirty={env.dirty}", ""]
    lines += [part for line in intro for part in (line, "")]
    lines += [markdown(frame, shown), "", f"![{name}]({name}.png)"]
    (folder / f"{name}.md").write_text("\n".join(lines) + "\n")
    oss_records.write(
        folder / f"{name}{oss_records.SUFFIX}",
        oss_records.table_records(name, frame, env.row_fields() | {"timestamp": timestamp()}),
    )
    if plot is not None:
        plot(folder / f"{name}.png")
    return folder
