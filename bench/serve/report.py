"""Serving-benchmark rows -> reports/<backend>-<device>/serve_<name>.csv, .md and .pytorch.json (through
bench.tables.write_report) and .png, a self-describing figure: TTFT / TPOT / ITL p50 and p99 and output tok/s
against the swept concurrency or rate."""

from __future__ import annotations

import pathlib
from collections.abc import Sequence

from bench import tables
from bench.environment import Environment

SHOWN = (
    "mode",
    "value",
    "completed",
    "failed",
    "duration_s",
    "output_tok_per_s",
    "req_per_s",
    "ttft_p50_ms",
    "ttft_p99_ms",
    "tpot_p50_ms",
    "tpot_p99_ms",
    "itl_p50_ms",
    "itl_p99_ms",
    "e2el_p50_ms",
    "offline_output_tok_per_s",
    "served_over_offline",
)
COLUMNS = (
    *SHOWN,
    "requests",
    "input_len",
    "output_len",
    "input_tokens",
    "output_tokens",
    "e2el_p99_ms",
    "server",
    "first_error",
    *tables.RUN_COLUMNS,
)


def write(
    out: pathlib.Path, env: Environment, name: str, rows: Sequence[dict], headline: str, common: dict
) -> pathlib.Path:
    folder = tables.write_report(
        out,
        env,
        name,
        rows,
        COLUMNS,
        SHOWN,
        headline,
        common,
        [f"server: {common['server']}", f"`{common['command']}`"],
    )
    _plot(rows, folder / f"{name}.png", f"{name}: {env.device}, git {env.git_sha[:10]}")
    return folder


def _plot(rows: Sequence[dict], path: pathlib.Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [row["value"] for row in rows]
    fig, (lat, thr) = plt.subplots(1, 2, figsize=(12, 4.5))
    for metric in ("ttft", "tpot", "itl"):
        for q, style in (("p50", "-o"), ("p99", "--x")):
            lat.plot(xs, [row[f"{metric}_{q}_ms"] for row in rows], style, label=f"{metric.upper()} {q}")
    lat.set_yscale("log")
    lat.set_ylabel("ms")
    thr.plot(xs, [row["output_tok_per_s"] for row in rows], "-o", label="output tok/s")
    thr.set_ylabel("output tokens / s")
    for ax in (lat, thr):
        ax.set_xscale("log", base=2)
        ax.set_xlabel(rows[0]["mode"])
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
