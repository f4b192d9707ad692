"""Rows of the runner throughput benches, written as CSV + Markdown under reports/<backend>-<device>/."""

from __future__ import annotations

import csv
import pathlib
import sys
from collections.abc import Sequence

from bench.environment import Environment

COLUMNS = ("workload", "impl", "requests", "input_tokens", "output_tokens", "seconds", "output_tok_per_s",
           "steps", "schedule_s", "prepare_s", "model_s", "sample_s", "postprocess_s", "note", "device", "torch",
           "triton", "transformers", "git_sha", "dirty", "command")


def _fmt(value: object) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def write(out: pathlib.Path, env: Environment, name: str, rows: Sequence[dict], headline: str) -> pathlib.Path:
    """Write <out>/<backend>-<slug>/<name>.csv and .md; returns the folder."""
    from importlib.metadata import version

    folder = out / f"{env.backend}-{env.slug}"
    folder.mkdir(parents=True, exist_ok=True)
    common = dict(device=env.device, torch=env.torch, triton=env.triton, transformers=version("transformers"),
                  git_sha=env.git_sha, dirty=env.dirty, command="python -m " + " ".join(
                      [sys.modules["__main__"].__spec__.name if sys.modules["__main__"].__spec__ else "?",
                       *sys.argv[1:]]))
    full = [{col: _fmt(row.get(col, common.get(col, ""))) for col in COLUMNS} for row in rows]
    with open(folder / f"{name}.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(full)
    shown = ("impl", "requests", "input_tokens", "output_tokens", "seconds", "output_tok_per_s", "steps",
             "schedule_s", "prepare_s", "model_s", "sample_s", "postprocess_s", "note")
    lines = [f"# {name}", "", headline, "",
             f"{env.device}; torch {env.torch}, triton {env.triton}, transformers {common['transformers']}; "
             f"git {env.git_sha} dirty={env.dirty}", "", f"`{common['command']}`", "",
             "| " + " | ".join(shown) + " |", "|" + "---|" * len(shown)]
    lines += ["| " + " | ".join(row[col] for col in shown) + " |" for row in full]
    (folder / f"{name}.md").write_text("\n".join(lines) + "\n")
    return folder
