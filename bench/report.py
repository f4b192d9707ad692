"""Reports from the CSVs: `<op>.md` and `<op>.png` beside `<op>.csv`, and `index.md` for the folder.

Everything is rendered from the CSV files on disk (never from in-memory results), so `touchstone report`
rebuilds byte-identical Markdown without re-measuring. Folder: reports/<target>-<device>/, target = backend
(cuda, rocm, xpu, cpu), device = `Platform.slug` ('h200'). The impl order, the comparison impl and the
headline comparisons come from the op's registered definition when it still exists.
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
import sys

import pandas as pd

from bench import accuracy, oss_records, rows, tables
from bench.correctness import is_checked
from bench.environment import ROW_FIELDS
from bench.formatting import num, size, times
from bench.plots import plot_op
from bench.registry import discover

ROOFS_CSV = "roofs.csv"
LAUNCH_SWEEPS = "launch_sweeps"  # the launch sweeps' rows (bench/launch_sweep.py), linked from index.md


@dataclasses.dataclass(frozen=True)
class View:
    impls: tuple[str, ...]
    compare_to: str | None
    headline: tuple[tuple[str, str], ...]


def view_of(frame: pd.DataFrame) -> View:
    seen = tuple(frame["impl"].unique())
    op = discover().get(frame["op"].iloc[0])
    if op is None:
        return View(seen, seen[0] if seen else None, ())
    declared = tuple(impl.name for impl in op.impls)
    return View(declared + tuple(i for i in seen if i not in declared), op.compare_to, op.headline)


def _unique(frame: pd.DataFrame, column: str) -> str:
    return " / ".join(str(v) for v in frame[column].unique())


def throughput(frame: pd.DataFrame) -> pd.Series:
    """GB/s for memcpy-roofed rows, TFLOP/s for GEMM-roofed ones."""
    return frame["gbps"].where(frame["roof_name"] == "memcpy", frame["tflops"])


def by_case(frame: pd.DataFrame, column: str) -> pd.DataFrame:
    """`column` as a table: one row per size (x_value, ascending), one column per impl."""
    return frame.pivot(index="x_value", columns="impl", values=column).sort_index()


def speedups(frame: pd.DataFrame, other: str) -> pd.DataFrame:
    """Per size and impl, the impl's speed over `other` (other's p50 / impl's p50), or the fraction of the roof
    when `other` is the roof's name."""
    if other in set(frame["roof_name"]):
        return by_case(frame, "fraction_of_roof")
    p50 = by_case(frame, "p50")
    return p50.rdiv(p50[other], axis=0) if other in p50 else p50 * math.nan


def headline(frame: pd.DataFrame, view: View) -> list[str]:
    """'impl vs other: R at the largest size both ran (geomean G over N sizes)' for each headline pair."""
    out = []
    for impl, other in view.headline:
        ratios = speedups(frame, other).get(impl, pd.Series(dtype=float)).dropna()
        ratios = ratios[ratios > 0]
        if ratios.empty:
            out.append(f"{impl} vs {other}: not measured")
            continue
        geomean = math.exp(ratios.map(math.log).mean())
        out.append(
            f"{impl} vs {other}: {times(ratios.iloc[-1])} at {size(ratios.index[-1])} {frame['x_name'].iloc[0]} "
            f"(geomean {times(geomean)} over {len(ratios)} sizes)"
        )
    return out


def _status(row: pd.Series) -> str:
    """The reason a row has no timing ("skipped", "error", ...), or "" when it was timed."""
    return row["correctness"].split(":")[0] if pd.isna(row["p50"]) else ""


def _throughput_cell(row: pd.Series) -> str:
    value = row["gbps"] if row["roof_name"] == "memcpy" else row["tflops"]
    return _status(row) or f"{num(value)} ({times(row['fraction_of_roof'])})"


def _latency_cell(row: pd.Series) -> str:
    return _status(row) or f"{row['p50']:.4g} [{row['p20']:.4g}, {row['p80']:.4g}] ({int(row['n_samples'])})"


def _cells(frame: pd.DataFrame, impls: list[str], cell) -> pd.DataFrame:
    """One text cell per (size, impl) from each row through `cell`; "" where the impl has no row."""
    shown = frame.assign(text=frame.apply(cell, axis=1))
    return by_case(shown, "text").reindex(columns=impls).fillna("")


def _sweeps(frame: pd.DataFrame) -> list[str]:
    commands = [command.split() for command in frame["repro_cmd"]]
    return sorted({words[words.index("--sizes") + 1] for words in commands if "--sizes" in words})


def _with_size_column(table: pd.DataFrame, x_name: str) -> pd.DataFrame:
    table = table.copy()
    table.insert(0, x_name, [size(x) for x in table.index])
    return table.reset_index(drop=True)


def op_markdown(frame: pd.DataFrame, view: View) -> str:
    op, x_name, roof_name = frame["op"].iloc[0], frame["x_name"].iloc[0], _unique(frame, "roof_name")
    unit = "GB/s" if roof_name == "memcpy" else "TFLOP/s"
    impls = [impl for impl in view.impls if impl in set(frame["impl"])]
    cases = frame.drop_duplicates("x_value").set_index("x_value").sort_index()

    def table(cell, extra: bool = False) -> str:
        body = _cells(frame, impls, cell)
        if extra:
            body.insert(0, "MB moved", [num(b / 1e6) for b in cases["bytes"]])
            body.insert(0, "shape", list(cases["shape"]))
        return tables.markdown(_with_size_column(body, x_name))

    roofs = ", ".join(f"{num(v)} {unit}" for v in frame["roof_value"].unique())
    parts = [f"# {op} ({_unique(frame, 'dtype')}) on {_unique(frame, 'device')}", ""]
    parts += [
        f"Measured against the same-run **{roof_name}** roof: **{roofs}**. Bytes per call = compulsory "
        "bytes read + written; p50 of the timed samples (cold L2 on GPUs: docs/bench.md, Timing).",
        "",
    ]
    parts += [f"- {line}" for line in headline(frame, view)] + [""]
    parts += [f"## {unit} at p50 (fraction of {roof_name})", "", table(_throughput_cell, extra=True), ""]
    parts += ["## Latency p50 [p20, p80] in ms (samples)", "", table(_latency_cell), ""]
    if view.compare_to in impls:
        parts += [f"## Speed relative to {view.compare_to} (its p50 / impl p50)", ""]
        ratios = speedups(frame, view.compare_to).reindex(columns=impls).map(times)
        parts += [tables.markdown(_with_size_column(ratios, x_name)), ""]
    parts += [
        "## Correctness against the op's baseline (bit-exact, or within the lossy bounds of kernels/tolerances)",
        "",
    ]
    parts += [table(lambda row: row["correctness"]), ""]
    stamps = sorted(frame["timestamp"])
    env = pd.DataFrame({"field": [*ROW_FIELDS, "measured"]})
    env["value"] = [_unique(frame, column) for column in ROW_FIELDS] + [f"{stamps[0]} .. {stamps[-1]}"]
    parts += ["## Environment", "", tables.markdown(env), ""]
    parts += ["## Reproduce", "", "```"]
    parts += [f"git checkout {sha}" for sha in frame["git_sha"].unique()]
    parts += [f"touchstone bench --ops {op} --sizes {sweep}" for sweep in _sweeps(frame)] + ["```", ""]
    parts += ["One row's command is in the CSV's `repro_cmd` column.", "", f"![{op}]({op}.png)", ""]
    return "\n".join(parts)


def render_op(folder: pathlib.Path, op: str) -> None:
    frame = rows.read(folder / f"{op}.csv")
    if frame.empty:
        return
    view = view_of(frame)
    (folder / f"{op}.md").write_text(op_markdown(frame, view))
    try:
        plot_op(frame, view.impls, folder / f"{op}.png")
    except Exception as err:  # matplotlib is a bench extra; the CSV and Markdown stand without the plot
        print(f"warning: no plot for {op}: {type(err).__name__}: {err}", file=sys.stderr, flush=True)


def summary(frame: pd.DataFrame) -> dict[str, str]:
    """The index's line for one op: dtype, roof, the fastest impl at the largest size, the headline, the commit,
    how many rows were checked against the baseline, and how many were wrong: in gated impls (ours, which fail
    a run) / in ungated peers (a torch.compile of the reference, a vendor library)."""
    timed = frame.dropna(subset=["p50"]).assign(throughput=lambda f: throughput(f).fillna(0.0))
    best = timed.sort_values(["x_value", "throughput"]).iloc[-1] if not timed.empty else None
    checked = frame["correctness"].map(is_checked)
    wrong = frame["correctness"].str.startswith(("mismatch", "error"))
    definition = discover().get(frame["op"].iloc[0])
    peers = {impl.name for impl in definition.impls if not impl.gated} if definition else set()
    by_peer = frame["impl"].isin(peers)
    return {
        "dtype": _unique(frame, "dtype"),
        "roof": _unique(frame, "roof_name"),
        "fastest at the largest size (throughput, x roof)": (
            f"{best['impl']}: {_throughput_cell(best)}" if best is not None else "—"
        ),
        "checked": str(int(checked.sum())),
        "wrong: ours / peers": f"{int((wrong & ~by_peer).sum())} / {int((wrong & by_peer).sum())}",
        "headline": "; ".join(headline(frame, view_of(frame))) or "—",
        "git": _unique(frame, "git_sha"),
    }


def _other_tables(folder: pathlib.Path) -> list[pathlib.Path]:
    """CSVs of the folder that are neither op rows, roofs nor accuracy tables (runner and serving reports)."""
    return [
        path
        for path in sorted(folder.glob("*.csv"))
        if path.name != ROOFS_CSV and not accuracy.is_accuracy_csv(path) and not rows.is_rows_csv(path)
    ]


def op_csvs(folder: pathlib.Path) -> list[pathlib.Path]:
    return [
        path
        for path in sorted(folder.glob("*.csv"))
        if path.name != ROOFS_CSV and not accuracy.is_accuracy_csv(path) and rows.is_rows_csv(path)
    ]


def index_markdown(folder: pathlib.Path) -> str:
    parts = [f"# Benchmarks: {folder.name}", ""]
    lines = []
    for path in op_csvs(folder):
        frame = rows.read(path)
        if not frame.empty:
            lines.append({"op": f"[{path.stem}]({path.stem}.md)", **summary(frame)})
    if lines:
        parts += [tables.markdown(pd.DataFrame(lines)), ""]
    if others := _other_tables(folder):
        parts += ["## Runner and serving reports", ""]
        parts += [f"- [{path.stem}]({path.stem}.md)" for path in others] + [""]
    if sweeps := sorted((folder / LAUNCH_SWEEPS).glob("*.csv")):
        parts += ["## Launch sweeps (the measurements behind the kernels' launch tables)", ""]
        parts += [f"- [{path.stem}]({LAUNCH_SWEEPS}/{path.name})" for path in sweeps] + [""]
    if names := accuracy.names_in(folder):
        parts += ["## Accuracy tables", ""]
        parts += [f"- [{name}]({name}{accuracy.SUFFIX}.md)" for name in names] + [""]
    if (folder / ROOFS_CSV).exists():
        roofs = rows.read(folder / ROOFS_CSV)
        shown = pd.DataFrame(
            {
                "roof": roofs["roof_name"],
                "what": roofs["impl"] + " (" + roofs["dtype"] + ")",
                "shape": roofs["shape"],
                "value": [
                    f"{num(v)} {'GB/s' if name == 'memcpy' else 'TFLOP/s'}"
                    for v, name in zip(roofs["roof_value"], roofs["roof_name"], strict=True)
                ],
                "measured": roofs["timestamp"],
            }
        )
        parts += ["## Roofs (measured in the bench run)", "", tables.markdown(shown), ""]
    return "\n".join(parts)


def render_index(folder: pathlib.Path) -> None:
    (folder / "index.md").write_text(index_markdown(folder))


def rebuild(path: pathlib.Path) -> list[pathlib.Path]:
    """Re-render every report folder under `path` (or `path` itself) from its CSVs, and rewrite their PyTorch
    OSS benchmark records. Returns the folders."""
    folders = sorted(
        {
            csv.parent
            for csv in path.rglob("*.csv")
            # launch-sweep rows and `touchstone compare`'s output are linked or stand alone, not report folders
            if csv.parent.name != LAUNCH_SWEEPS and not (csv.parent / "compare.csv").exists()
        }
    )
    for folder in folders:
        for csv in sorted(folder.glob("*.csv")):
            if accuracy.is_accuracy_csv(csv):
                accuracy.render(folder, csv.name.removesuffix(f"{accuracy.SUFFIX}.csv"))
        for csv in op_csvs(folder):
            render_op(folder, csv.stem)
        for csv in [*op_csvs(folder), *([folder / ROOFS_CSV] if (folder / ROOFS_CSV).exists() else [])]:
            oss_records.write(csv.with_suffix(oss_records.SUFFIX), oss_records.op_records(rows.read(csv)))
        for csv in _other_tables(folder):
            records = oss_records.table_records(csv.stem, tables.read(csv), {})
            oss_records.write(csv.with_suffix(oss_records.SUFFIX), records)
        render_index(folder)
    return folders
