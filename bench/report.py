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
from collections.abc import Sequence

from bench import accuracy
from bench.formatting import md_table, num, size, times
from bench.plots import plot_op
from bench.registry import discover
from bench.rows import Row, read_csv

ROOFS_CSV = "roofs.csv"
ENV_COLUMNS = (
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
)


@dataclasses.dataclass(frozen=True)
class View:
    impls: tuple[str, ...]
    compare_to: str | None
    headline: tuple[tuple[str, str], ...]


def view_of(rows: Sequence[Row]) -> View:
    seen = tuple(dict.fromkeys(row["impl"] for row in rows))
    op = discover().get(rows[0]["op"])
    if op is None:
        return View(seen, seen[0] if seen else None, ())
    declared = tuple(impl.name for impl in op.impls)
    return View(declared + tuple(i for i in seen if i not in declared), op.compare_to, op.headline)


def _unique(rows: Sequence[Row], column: str) -> str:
    return " / ".join(dict.fromkeys(str(row[column]) for row in rows))


def throughput(row: Row) -> float | None:
    return row["gbps"] if row["roof_name"] == "memcpy" else row["tflops"]


def _status(row: Row | None) -> str:
    if row is None:
        return ""
    return row["correctness"].split(":")[0] if row["p50"] is None else ""


def _cells(rows: Sequence[Row]) -> tuple[list[float], dict[tuple[str, float], Row]]:
    xs = sorted(dict.fromkeys(row["x_value"] for row in rows))
    return xs, {(row["impl"], row["x_value"]): row for row in rows}


def ratio(rows: Sequence[Row], impl: str, other: str, x: float) -> float | None:
    """Speed of impl over other at size x (other may be a roof name: the fraction of that roof)."""
    _, cells = _cells(rows)
    mine = cells.get((impl, x))
    if mine is None or mine["p50"] is None:
        return None
    if other == mine["roof_name"]:
        return mine["fraction_of_roof"]
    theirs = cells.get((other, x))
    return theirs["p50"] / mine["p50"] if theirs is not None and theirs["p50"] is not None else None


def headline(rows: Sequence[Row], view: View) -> list[str]:
    """'impl vs other: R at the largest size both ran (geomean G over N sizes)' for each headline pair."""
    out = []
    xs, _ = _cells(rows)
    for impl, other in view.headline:
        pairs = [(x, r) for x in xs if (r := ratio(rows, impl, other, x))]
        if not pairs:
            out.append(f"{impl} vs {other}: not measured")
            continue
        geomean = math.exp(sum(math.log(r) for _, r in pairs) / len(pairs))
        out.append(
            f"{impl} vs {other}: {times(pairs[-1][1])} at {size(pairs[-1][0])} {rows[0]['x_name']} "
            f"(geomean {times(geomean)} over {len(pairs)} sizes)"
        )
    return out


def _throughput_cell(row: Row | None) -> str:
    return _status(row) or f"{num(throughput(row))} ({times(row['fraction_of_roof'])})"


def _latency_cell(row: Row | None) -> str:
    return _status(row) or f"{row['p50']:.4g} [{row['p20']:.4g}, {row['p80']:.4g}] ({row['n_samples']})"


def _sweeps(rows: Sequence[Row]) -> list[str]:
    commands = [row["repro_cmd"].split() for row in rows]
    return sorted({words[words.index("--sizes") + 1] for words in commands if "--sizes" in words})


def op_markdown(rows: Sequence[Row], view: View) -> str:
    op, x_name, roof_name = rows[0]["op"], rows[0]["x_name"], _unique(rows, "roof_name")
    unit = "GB/s" if roof_name == "memcpy" else "TFLOP/s"
    xs, cells = _cells(rows)
    impls = [impl for impl in view.impls if any(row["impl"] == impl for row in rows)]
    shape_of = {row["x_value"]: (row["shape"], num(row["bytes"] / 1e6)) for row in rows}

    def table(cell, extra: bool = False) -> str:
        body = [[size(x), *(shape_of[x] if extra else ()), *(cell(cells.get((i, x))) for i in impls)] for x in xs]
        header = [x_name, *(("shape", "MB moved") if extra else ()), *impls]
        return md_table(header, body)

    roofs = ", ".join(f"{num(v)} {unit}" for v in dict.fromkeys(row["roof_value"] for row in rows))
    parts = [f"# {op} ({_unique(rows, 'dtype')}) on {_unique(rows, 'device')}", ""]
    parts += [
        f"Measured against the same-run **{roof_name}** roof: **{roofs}**. Bytes per call = compulsory "
        "bytes read + written; p50 of the timed samples (cold L2 on GPUs).",
        "",
    ]
    parts += [f"- {line}" for line in headline(rows, view)] + [""]
    parts += [f"## {unit} at p50 (fraction of {roof_name})", "", table(_throughput_cell, extra=True), ""]
    parts += ["## Latency p50 [p20, p80] in ms (samples)", "", table(_latency_cell), ""]
    if view.compare_to in impls:
        parts += [f"## Speed relative to {view.compare_to} (its p50 / impl p50)", ""]
        ratios = {(i, x): ratio(rows, i, view.compare_to, x) for i in impls for x in xs}
        body = [[size(x), *(times(ratios[i, x]) for i in impls)] for x in xs]
        parts += [md_table([x_name, *impls], body), ""]
    parts += ["## Correctness against the op's baseline (bit-exact, or within kernels/tolerances's lossy bounds)", ""]
    parts += [table(lambda row: row["correctness"] if row else ""), ""]
    stamps = sorted(row["timestamp"] for row in rows)
    env = [[column, _unique(rows, column)] for column in ENV_COLUMNS]
    env.append(["measured", f"{stamps[0]} .. {stamps[-1]}"])
    parts += ["## Environment", "", md_table(["field", "value"], env), ""]
    parts += ["## Reproduce", "", "```"]
    parts += [f"git checkout {sha}" for sha in dict.fromkeys(row["git_sha"] for row in rows)]
    parts += [f"touchstone bench --ops {op} --sizes {sweep}" for sweep in _sweeps(rows)] + ["```", ""]
    parts += ["One row's command is in the CSV's `repro_cmd` column.", "", f"![{op}]({op}.png)", ""]
    return "\n".join(parts)


def _read(path: pathlib.Path) -> list[Row]:
    """Rows of a CSV, or none (with a warning) if it is not a bench CSV: other files may share the folder."""
    try:
        return read_csv(path)
    except (ValueError, KeyError) as err:
        print(f"warning: skipping {path}: {err}", file=sys.stderr, flush=True)
        return []


def render_op(folder: pathlib.Path, op: str) -> None:
    rows = _read(folder / f"{op}.csv")
    if not rows:
        return
    view = view_of(rows)
    (folder / f"{op}.md").write_text(op_markdown(rows, view))
    try:
        plot_op(rows, view.impls, folder / f"{op}.png")
    except Exception as err:  # matplotlib is a bench extra; the CSV and Markdown stand without the plot
        print(f"warning: no plot for {op}: {type(err).__name__}: {err}", file=sys.stderr, flush=True)


def index_markdown(folder: pathlib.Path) -> str:
    parts = [f"# Benchmarks: {folder.name}", ""]
    body = []
    for path in sorted(folder.glob("*.csv")):
        if path.name == ROOFS_CSV or accuracy.is_accuracy_csv(path) or not (rows := _read(path)):
            continue
        op, view = rows[0]["op"], view_of(rows)
        timed = [row for row in rows if row["p50"] is not None]
        best = max(timed, key=lambda row: (row["x_value"], throughput(row) or 0)) if timed else None
        best_text = f"{best['impl']}: {_throughput_cell(best)}" if best else "—"
        body.append(
            [
                f"[{op}]({op}.md)",
                _unique(rows, "dtype"),
                _unique(rows, "roof_name"),
                best_text,
                "; ".join(headline(rows, view)) or "—",
                _unique(rows, "git_sha"),
            ]
        )
    header = ["op", "dtype", "roof", "fastest at the largest size (throughput, x roof)", "headline", "git"]
    parts += [md_table(header, body), ""]
    if tables := accuracy.names_in(folder):
        parts += ["## Accuracy tables", ""]
        parts += [f"- [{name}]({name}{accuracy.SUFFIX}.md)" for name in tables] + [""]
    if (folder / ROOFS_CSV).exists():
        roofs = _read(folder / ROOFS_CSV)
        parts += ["## Roofs (measured in the bench run)", ""]
        parts += [
            md_table(
                ["roof", "what", "shape", "value", "measured"],
                [
                    [
                        row["roof_name"],
                        f"{row['impl']} ({row['dtype']})",
                        row["shape"],
                        f"{num(row['roof_value'])} {'GB/s' if row['roof_name'] == 'memcpy' else 'TFLOP/s'}",
                        row["timestamp"],
                    ]
                    for row in roofs
                ],
            ),
            "",
        ]
    return "\n".join(parts)


def render_index(folder: pathlib.Path) -> None:
    (folder / "index.md").write_text(index_markdown(folder))


def rebuild(path: pathlib.Path) -> list[pathlib.Path]:
    """Re-render every report folder under `path` (or `path` itself) from its CSVs. Returns the folders."""
    folders = sorted({csv.parent for csv in path.rglob("*.csv")})
    for folder in folders:
        for csv in sorted(folder.glob("*.csv")):
            if accuracy.is_accuracy_csv(csv):
                accuracy.render(folder, csv.name.removesuffix(f"{accuracy.SUFFIX}.csv"))
            elif csv.name != ROOFS_CSV:
                render_op(folder, csv.stem)
        render_index(folder)
    return folders
