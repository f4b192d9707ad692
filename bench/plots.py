"""Per-op PNG: GB/s (or TFLOP/s for GEMM-roofed ops) vs size per impl, p20-p80 bars, the roof as a line.

The figure describes itself: op, dtype, device, backend/arch and git sha are in the title, so a PNG lifted
out of its report still says what it shows. Drawn with the Agg backend (no display on the GPU machines).
"""

from __future__ import annotations

import pathlib
from collections.abc import Sequence

import pandas as pd

from bench.formatting import size


def _throughput(rows: pd.DataFrame, ms: pd.Series) -> pd.Series:
    seconds = ms * 1e-3
    work = rows["bytes"] / 1e9 if rows["roof_name"].iloc[0] == "memcpy" else rows["flops"] / 1e12
    return work / seconds


def _unique(rows: pd.DataFrame, column: str) -> str:
    return " / ".join(str(v) for v in rows[column].unique())


def plot_op(rows: pd.DataFrame, impls: Sequence[str], path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedFormatter, FixedLocator, NullLocator

    timed = rows.dropna(subset=["p50"])
    roof_name = rows["roof_name"].iloc[0]
    unit = "GB/s" if roof_name == "memcpy" else "TFLOP/s"
    fig, ax = plt.subplots(figsize=(8, 5))
    values: list[float] = []
    for impl in impls:
        points = timed[timed["impl"] == impl].sort_values("x_value")
        if points.empty:
            continue
        ys = _throughput(points, points["p50"])
        low, high = ys - _throughput(points, points["p80"]), _throughput(points, points["p20"]) - ys
        ax.errorbar(points["x_value"], ys, yerr=[low, high], marker="o", capsize=3, label=impl)
        values += list(ys)
    for roof in rows["roof_value"].unique():
        ax.axhline(roof, linestyle="--", color="gray", label=f"{roof_name} roof {roof:.4g} {unit}")
        values.append(roof)
    if values and min(values) > 0 and max(values) / min(values) > 20:
        ax.set_yscale("log")
    ax.set_xscale("log", base=2)
    sizes = sorted(rows["x_value"].unique())
    ax.xaxis.set_major_locator(FixedLocator(sizes))
    ax.xaxis.set_major_formatter(FixedFormatter([size(x) for x in sizes]))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel(rows["x_name"].iloc[0])
    ax.set_ylabel(f"{unit} at p50 (bars: p20-p80)")
    shas = ", ".join(
        dict.fromkeys(
            f"{sha[:10]}{'+dirty' if dirty == 'true' else ''}"
            for sha, dirty in zip(rows["git_sha"], rows["dirty"], strict=True)
        )
    )
    ax.set_title(
        f"{rows['op'].iloc[0]} ({_unique(rows, 'dtype')}) on {_unique(rows, 'device')}\n"
        f"{_unique(rows, 'backend')} {_unique(rows, 'arch')}, git {shas}",
        fontsize=10,
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
