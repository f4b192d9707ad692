"""CSV + Markdown of a bench that lives outside the op registry (the runner's throughput benches, the serving
benchmark): every CSV row carries the environment, and the Markdown is a title, a headline, the environment
line, any further lines (the command, the server) and a table of the `shown` columns, then the figure."""

from __future__ import annotations

import csv
import math
import pathlib
from collections.abc import Sequence

from bench.environment import Environment
from bench.formatting import md_table


def cell(value: object) -> str:
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.4g}"
    return str(value)


def write(
    out: pathlib.Path,
    env: Environment,
    name: str,
    rows: Sequence[dict],
    columns: Sequence[str],
    shown: Sequence[str],
    headline: str,
    common: dict,
    intro: Sequence[str] = (),
) -> pathlib.Path:
    """<out>/<backend>-<slug>/<name>.csv (`columns`; a row's missing value comes from `common`, then the
    environment) and <name>.md (links <name>.png, which the caller draws); returns the folder."""
    folder = out / f"{env.backend}-{env.slug}"
    folder.mkdir(parents=True, exist_ok=True)
    base = dict(device=env.device, torch=env.torch, triton=env.triton, git_sha=env.git_sha, dirty=env.dirty, **common)
    full = [{col: cell(row.get(col, base.get(col, ""))) for col in columns} for row in rows]
    with open(folder / f"{name}.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(full)
    versions = ", ".join(f"{k} {base[k]}" for k in ("torch", "triton", "transformers") if k in base)
    lines = [f"# {name}", "", headline, "", f"{env.device}; {versions}; git {env.git_sha} dirty={env.dirty}", ""]
    lines += [part for line in intro for part in (line, "")]
    lines += [md_table(shown, [[row[col] for col in shown] for row in full]), "", f"![{name}]({name}.png)"]
    (folder / f"{name}.md").write_text("\n".join(lines) + "\n")
    return folder
