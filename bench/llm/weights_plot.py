"""Figures of the weight-side runner reports: fused projections and weight offload."""

from __future__ import annotations

import pathlib
from collections.abc import Sequence


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_fused(path: pathlib.Path, rows: Sequence[dict], title: str) -> None:
    """Speed-up of the fused projections over separate GEMMs, per token count."""
    plt = _pyplot()
    layer = [r for r in rows if r["measure"].startswith("layer")]
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.plot([r["tokens"] for r in layer], [r["fused_speedup"] for r in layer], marker="o")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("tokens (M)")
    ax.set_ylabel("unfused time / fused time")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_offload(path: pathlib.Path, rows: Sequence[dict]) -> None:
    """Decode step time with and without offload, beside the floor the host->device bandwidth sets."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    labels = [f"{r['offload']} ({r['offloaded_layers']} layers)" for r in rows]
    ax.bar(
        labels,
        [r["step_ms"] for r in rows],
        color=["tab:blue", "tab:orange", "tab:green"][: len(rows)],
        label="measured",
    )
    ax.scatter(labels, [r["copy_floor_ms"] for r in rows], color="black", zorder=3, label="copy floor")
    ax.set_ylabel("decode step (ms)")
    ax.set_title(f"batch {rows[0]['batch']}; pinned host->device {rows[0]['h2d_gib_per_s']:.1f} GiB/s", fontsize=9)
    ax.legend()
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
