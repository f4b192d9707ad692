"""`touchstone compare A B`: two report folders (two commits, two machines) joined row by row.

Rows join on (op, impl, dtype, shape). For each pair: B's speed over A's (A's p50 / B's p50, so 1.10x means B
is 10 % faster) and the change of B's time; a row is flagged when its time moved by more than --threshold
(default 5 %) or its correctness changed class (right / wrong / not checked). A regression is a flagged row
that got slower or went from right to wrong; with --fail-on-regression the command exits 1 when a gated impl
(one of ours, not a peer such as torch.compile) has one, so a nightly job can gate on it. Writes
compare.csv, compare.md and compare.png to --out.
"""

from __future__ import annotations

import math
import pathlib
import sys
from collections.abc import Sequence

import pandas as pd

from bench import report, rows, tables
from bench.formatting import size, times
from runner.cli_parser import Parser, fail

KEY = ["op", "impl", "dtype", "shape"]


def parser() -> Parser:
    p = Parser(prog="touchstone compare", description="Compare two report folders row by row; flag regressions.")
    p.add_argument("a", type=pathlib.Path, help="the baseline report folder (e.g. reports/cuda-h200)")
    p.add_argument("b", type=pathlib.Path, help="the report folder to compare with it")
    p.add_argument("--threshold", type=float, default=0.05, help="time change that flags a row (default 0.05)")
    p.add_argument("--fail-on-regression", action="store_true", help="exit 1 on a regression of a gated impl")
    p.add_argument(
        "--min-ms",
        type=float,
        default=0.0,
        help="rows whose p50 is below this in both folders are compared but never flagged (host-bound calls)",
    )
    p.add_argument("--out", type=pathlib.Path, default=pathlib.Path("reports/compare"), help="output folder")
    return p


def correctness_class(verdict: str) -> str:
    if not isinstance(verdict, str) or not verdict:
        return "absent"
    if verdict.startswith(("exact", "close", "differs as expected", "baseline")):
        return "right"
    if verdict.startswith(("mismatch", "error")):
        return "wrong"
    return "not checked"


def load(folder: pathlib.Path) -> pd.DataFrame:
    """Every op row of a report folder (roofs included: a moved roof explains moved rows)."""
    frames = [rows.read(path) for path in report.op_csvs(folder)]
    if (folder / report.ROOFS_CSV).exists():
        frames.append(rows.read(folder / report.ROOFS_CSV))
    if not frames:
        raise FileNotFoundError(f"{folder}: no report CSV")
    return pd.concat(frames, ignore_index=True)


def _gated(op: str, impl: str) -> bool:
    from bench.registry import discover

    definition = discover().get(op)
    if definition is None:
        return not op.startswith("roof-")
    return next((i.gated for i in definition.impls if i.name == impl), True)


def compare(a: pd.DataFrame, b: pd.DataFrame, threshold: float, min_ms: float = 0.0) -> pd.DataFrame:
    """One row per key present in either folder: both p50s, the speed ratio, the time change, both verdicts,
    and the flag ('' when nothing moved). A time change of a row faster than `min_ms` in both folders is not
    flagged: such calls time the host's dispatch, which moves between runs."""
    keep = [*KEY, "x_name", "x_value", "p50", "correctness", "git_sha"]
    joined = a[keep].merge(b[keep], on=KEY, how="outer", suffixes=("_a", "_b"), indicator=True)
    joined["x_name"] = joined["x_name_a"].fillna(joined["x_name_b"])
    joined["x_value"] = joined["x_value_a"].fillna(joined["x_value_b"])
    joined["speed_b_over_a"] = joined["p50_a"] / joined["p50_b"]
    joined["time_change"] = joined["p50_b"] / joined["p50_a"] - 1.0
    joined["class_a"] = joined["correctness_a"].map(correctness_class)
    joined["class_b"] = joined["correctness_b"].map(correctness_class)
    joined["gated"] = [_gated(op, impl) for op, impl in zip(joined["op"], joined["impl"], strict=True)]

    def flag(row: pd.Series) -> str:
        if row["_merge"] != "both":
            return f"only in {'A' if row['_merge'] == 'left_only' else 'B'}"
        flags = []
        if row["class_a"] != row["class_b"]:
            flags.append(f"correctness {row['class_a']} -> {row['class_b']}")
        change = row["time_change"]
        if not math.isnan(change) and abs(change) > threshold and max(row["p50_a"], row["p50_b"]) >= min_ms:
            flags.append(f"{'slower' if change > 0 else 'faster'} {abs(change):.0%}")
        return "; ".join(flags)

    joined["flag"] = joined.apply(flag, axis=1)
    slower = (joined["time_change"] > threshold) & (joined[["p50_a", "p50_b"]].max(axis=1) >= min_ms)
    broke = (joined["class_a"] == "right") & (joined["class_b"] == "wrong")
    joined["regression"] = (joined["_merge"] == "both") & (slower | broke)
    columns = [
        *KEY,
        "x_name",
        "x_value",
        "p50_a",
        "p50_b",
        "speed_b_over_a",
        "time_change",
        "correctness_a",
        "correctness_b",
        "flag",
        "regression",
        "gated",
        "git_sha_a",
        "git_sha_b",
    ]
    return joined[columns].sort_values([*KEY[:2], "x_value"]).reset_index(drop=True)


def markdown(table: pd.DataFrame, a: pathlib.Path, b: pathlib.Path, threshold: float, min_ms: float) -> str:
    both = table.dropna(subset=["speed_b_over_a"])
    speeds = both["speed_b_over_a"][both["speed_b_over_a"] > 0]
    geomean = math.exp(speeds.map(math.log).mean()) if not speeds.empty else math.nan
    regressions = table[table["regression"]]
    shas = lambda column: ", ".join(str(s)[:10] for s in table[column].dropna().unique())
    parts = [f"# Comparison: {b} vs {a}", ""]
    parts += [
        f"A = `{a}` (git {shas('git_sha_a')}), B = `{b}` (git {shas('git_sha_b')}). Speed = A's p50 / B's p50 "
        f"(above 1: B is faster). Flagged: time moved by more than {threshold:.0%}"
        + (f" (rows of {min_ms:g} ms or more)" if min_ms else "")
        + ", or correctness changed.",
        "",
        f"- {len(both)} rows in both, {int(((table['flag'] != '') & ~table['flag'].str.startswith('only in')).sum())} "
        f"flagged, {len(regressions)} regressions "
        f"({int(regressions['gated'].sum())} in gated impls); geomean speed {times(geomean)}",
        f"- only in A: {int((table['flag'] == 'only in A').sum())}, "
        f"only in B: {int((table['flag'] == 'only in B').sum())}",
        "",
    ]
    only = table["flag"].str.startswith("only in")
    shown = table[(table["flag"] != "") & ~only]
    if not shown.empty:
        view = pd.DataFrame(
            {
                "op": shown["op"],
                "impl": shown["impl"] + ["" if g else " (peer)" for g in shown["gated"]],
                "case": [
                    f"{size(x)} {n}" if isinstance(n, str) and n else ""
                    for x, n in zip(shown["x_value"], shown["x_name"], strict=True)
                ],
                "p50 A (ms)": shown["p50_a"].map(lambda v: f"{v:.4g}" if not math.isnan(v) else "—"),
                "p50 B (ms)": shown["p50_b"].map(lambda v: f"{v:.4g}" if not math.isnan(v) else "—"),
                "speed B/A": shown["speed_b_over_a"].map(times),
                "flag": shown["flag"] + [" **regression**" if r else "" for r in shown["regression"]],
            }
        )
        parts += ["## Flagged rows", "", tables.markdown(view), ""]
    if only.any():
        ops = table[only].groupby(["flag", "op"]).size().reset_index(name="rows")
        parts += ["## Ops measured in one folder only", "", tables.markdown(ops), ""]
    per_op = both.groupby("op")["speed_b_over_a"].apply(
        lambda s: math.exp(s[s > 0].map(math.log).mean()) if (s > 0).any() else math.nan
    )
    if not per_op.empty:
        summary = pd.DataFrame({"op": per_op.index, "geomean speed B/A": per_op.map(times).to_numpy()})
        parts += ["## Per op", "", tables.markdown(summary), ""]
    parts += ["All rows: `compare.csv`.", "", "![comparison](compare.png)", ""]
    return "\n".join(parts)


def plot(table: pd.DataFrame, path: pathlib.Path, threshold: float, title: str) -> None:
    """Speed B/A of every row present in both folders, grouped by op (one colour each), sorted within the op;
    flagged rows ringed orange, regressions red and named."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    both = table.dropna(subset=["speed_b_over_a"]).sort_values(["op", "speed_b_over_a"]).reset_index(drop=True)
    fig, ax = plt.subplots(figsize=(10, 4.5))
    for op, group in both.groupby("op", sort=False):
        ax.scatter(group.index, group["speed_b_over_a"], s=16, label=op)
    flagged = both[(both["flag"] != "") & ~both["regression"]]
    ax.scatter(flagged.index, flagged["speed_b_over_a"], s=70, facecolors="none", edgecolors="tab:orange")
    regressions = both[both["regression"]]
    ax.scatter(regressions.index, regressions["speed_b_over_a"], s=90, facecolors="none", edgecolors="tab:red")
    for i, row in regressions.head(10).iterrows():
        ax.annotate(f" {row['impl']} {size(row['x_value'])}", (i, row["speed_b_over_a"]), fontsize=7, color="tab:red")
    ax.axhline(1.0, color="black", linewidth=0.8)
    for bound in (1 / (1 + threshold), 1 / (1 - threshold)):
        ax.axhline(bound, color="gray", linestyle="--", linewidth=0.8)
    ax.set_yscale("log")
    ax.set_xticks([])
    ax.set_xlabel("rows present in both folders, by op (ringed: orange flagged, red regression)")
    ax.set_ylabel("speed B / A (A's p50 / B's p50)")
    ax.set_title(title, fontsize=9)
    ax.grid(True, axis="y", which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Sequence[str]) -> int:
    args = parser().parse_args(argv)
    for folder in (args.a, args.b):
        if not folder.is_dir():
            fail("touchstone compare", f"{folder}: no such folder")
    try:
        a, b = load(args.a), load(args.b)
    except (FileNotFoundError, ValueError) as err:
        fail("touchstone compare", str(err))
    table = compare(a, b, args.threshold, args.min_ms)
    args.out.mkdir(parents=True, exist_ok=True)
    tables.write(args.out / "compare.csv", table)
    (args.out / "compare.md").write_text(markdown(table, args.a, args.b, args.threshold, args.min_ms))
    plot(table, args.out / "compare.png", args.threshold, f"{args.b} vs {args.a}")
    flagged = table[(table["flag"].str.len() > 0) & ~table["flag"].str.startswith("only in")]
    for row in flagged.itertuples():
        speed = times(row.speed_b_over_a) if not math.isnan(row.speed_b_over_a) else "—"
        mark = " REGRESSION" if row.regression else ""
        print(f"{row.op} {row.impl} {size(row.x_value)}: {speed} ({row.flag}){mark}")
    gated = table[table["regression"] & table["gated"]]
    both = table["speed_b_over_a"].notna().sum()
    only = table["flag"].str.startswith("only in")
    print(
        f"compared {both} rows: {len(flagged)} flagged, {int(table['regression'].sum())} regressions "
        f"({len(gated)} in gated impls); {int(only.sum())} rows in one folder only; "
        f"wrote {args.out}/compare.csv, .md, .png",
        file=sys.stdout,
    )
    return 1 if args.fail_on_regression and len(gated) else 0
