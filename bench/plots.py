"""Per-op PNG: GB/s (or TFLOP/s for GEMM-roofed ops) vs size per impl, p20-p80 bars, the roof as a line.

The figure describes itself: op, dtype, device, backend/arch and git sha are in the title, so a PNG lifted
out of its report still says what it shows. Drawn with the Agg backend (no display on the GPU machines).
"""

from __future__ import annotations

import pathlib
from collections.abc import Sequence

from bench.formatting import size
from bench.rows import Row


def _throughput(row: Row, ms: float) -> float:
    seconds = ms * 1e-3
    return row["bytes"] / seconds / 1e9 if row["roof_name"] == "memcpy" else row["flops"] / seconds / 1e12


def _unique(rows: Sequence[Row], column: str) -> str:
    return " / ".join(dict.fromkeys(str(row[column]) for row in rows))


def plot_op(rows: Sequence[Row], impls: Sequence[str], path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedFormatter, FixedLocator, NullLocator

    timed = [row for row in rows if row["p50"] is not None]
    roof_name = rows[0]["roof_name"]
    unit = "GB/s" if roof_name == "memcpy" else "TFLOP/s"
    fig, ax = plt.subplots(figsize=(8, 5))
    values: list[float] = []
    for impl in impls:
        points = sorted((row for row in timed if row["impl"] == impl), key=lambda row: row["x_value"])
        if not points:
            continue
        xs = [row["x_value"] for row in points]
        ys = [_throughput(row, row["p50"]) for row in points]
        low = [y - _throughput(row, row["p80"]) for y, row in zip(ys, points, strict=True)]
        high = [_throughput(row, row["p20"]) - y for y, row in zip(ys, points, strict=True)]
        ax.errorbar(xs, ys, yerr=[low, high], marker="o", capsize=3, label=impl)
        values += ys
    for roof in dict.fromkeys(row["roof_value"] for row in rows):
        ax.axhline(roof, linestyle="--", color="gray", label=f"{roof_name} roof {roof:.4g} {unit}")
        values.append(roof)
    if values and min(values) > 0 and max(values) / min(values) > 20:
        ax.set_yscale("log")
    ax.set_xscale("log", base=2)
    sizes = sorted({row["x_value"] for row in rows})
    ax.xaxis.set_major_locator(FixedLocator(sizes))
    ax.xaxis.set_major_formatter(FixedFormatter([size(x) for x in sizes]))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel(rows[0]["x_name"])
    ax.set_ylabel(f"{unit} at p50 (bars: p20-p80)")
    shas = ", ".join(
        dict.fromkeys(f"{row['git_sha'][:10]}{'+dirty' if row['dirty'] == 'true' else ''}" for row in rows)
    )
    ax.set_title(
        f"{rows[0]['op']} ({_unique(rows, 'dtype')}) on {_unique(rows, 'device')}\n"
        f"{_unique(rows, 'backend')} {_unique(rows, 'arch')}, git {shas}",
        fontsize=10,
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
