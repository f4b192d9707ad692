"""Rows of the runner throughput benches, written as CSV + Markdown + PNG under reports/<backend>-<device>/.

The PNG has two panels: output tok/s of every row (log scale: the runner and HF differ by ~45x on the H200),
and where the runner's step time goes (seconds per phase, summed over the phase-timed rerun's steps)."""

from __future__ import annotations

import pathlib
import sys
from collections.abc import Sequence

from bench import tables
from bench.environment import Environment

COLUMNS = (
    "workload",
    "impl",
    "requests",
    "input_tokens",
    "output_tokens",
    "seconds",
    "output_tok_per_s",
    "timed_steps",
    "gpu_ms_per_step",
    "host_ms_per_step",
    "wait_ms_per_step",
    "steps",
    "schedule_s",
    "prepare_s",
    "model_s",
    "sample_s",
    "postprocess_s",
    "note",
    "device",
    "torch",
    "triton",
    "transformers",
    "git_sha",
    "dirty",
    "command",
)
SHOWN = (
    "impl",
    "requests",
    "input_tokens",
    "output_tokens",
    "seconds",
    "output_tok_per_s",
    "timed_steps",
    "gpu_ms_per_step",
    "host_ms_per_step",
    "wait_ms_per_step",
    "steps",
    "schedule_s",
    "prepare_s",
    "model_s",
    "sample_s",
    "postprocess_s",
    "note",
)


def write(out: pathlib.Path, env: Environment, name: str, rows: Sequence[dict], headline: str) -> pathlib.Path:
    """Write <out>/<backend>-<slug>/<name>.csv, .md and .png; returns the folder."""
    from importlib.metadata import version

    main = sys.modules["__main__"].__spec__
    command = "python -m " + " ".join([main.name if main else "?", *sys.argv[1:]])
    folder = tables.write_report(
        out,
        env,
        name,
        rows,
        COLUMNS,
        SHOWN,
        headline,
        dict(transformers=version("transformers"), command=command),
        [f"`{command}`"],
    )
    plot(folder / f"{name}.png", rows, headline)
    return folder


PHASES = ("schedule_s", "prepare_s", "model_s", "sample_s", "postprocess_s")


def plot(path: pathlib.Path, rows: Sequence[dict], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (rate, split) = plt.subplots(1, 2, figsize=(11, 3.2), gridspec_kw=dict(width_ratios=(3, 2)))
    names = [row["impl"] for row in rows]
    values = [row["output_tok_per_s"] for row in rows]
    rate.barh(names, values, color=["tab:blue" if n == "touchstone" else "tab:gray" for n in names])
    rate.set_xscale("log")
    rate.invert_yaxis()
    rate.set_xlabel("output tokens / s (log)")
    for y, v in enumerate(values):
        rate.text(v, y, f" {v:,.0f}", va="center")
    ours = next((row for row in rows if all(p in row for p in PHASES)), None)
    if ours is not None:
        left = 0.0
        for phase in PHASES:
            split.barh([ours["impl"]], [ours[phase]], left=left, label=phase.removesuffix("_s"))
            left += ours[phase]
        split.set_xlabel(f"seconds over {ours.get('steps', '?')} steps (phase-timed rerun)")
        split.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.35), ncol=3)
    else:
        split.axis("off")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
