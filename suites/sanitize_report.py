"""The sanitizer tier's report: reports/<backend>-<slug>/sanitizer.md and .csv (one row per tool and kernel
module: cases run and failed, sanitizer error records), the negative control's line, and the verdict."""

from __future__ import annotations

import datetime
import os
import pathlib
import subprocess

# A tool's errors past the records it printed (compute-sanitizer's --print-limit): counted, named by no record
UNPRINTED = "not printed (past the print limit)"


def write_report(
    out: pathlib.Path, runs: dict, control: tuple[int, int], probes: dict[str, tuple[str, int, int]] | None = None
) -> tuple[pathlib.Path, bool]:
    import pandas as pd

    from kernels.platform import detect_platform

    platform = detect_platform()
    folder = out / f"{platform.backend}-{platform.slug}"
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for tool, run in runs.items():
        for kernel, (cases, failed) in run.cases.items():
            rows.append(
                {"tool": tool, "kernel": kernel, "cases": cases, "failed": failed, "errors": run.errors.get(kernel, 0)}
            )
        for module, count in run.errors.items():
            if module not in run.cases:  # a kernel reached by another module's cases, or none of kernels/
                rows.append({"tool": tool, "kernel": module, "cases": 0, "failed": 0, "errors": count})
        unprinted = run.total_errors - sum(run.errors.values())
        if unprinted > 0:  # the tool counts every error but prints the first PRINT_LIMIT records
            rows.append({"tool": tool, "kernel": UNPRINTED, "cases": 0, "failed": 0, "errors": unprinted})
    frame = pd.DataFrame(rows, columns=["tool", "kernel", "cases", "failed", "errors"])
    frame.to_csv(folder / "sanitizer.csv", index=False)
    totals = {tool: run.total_errors for tool, run in runs.items()}
    attributed, control_total = control
    caught = attributed > 0
    ok = all(n == 0 for n in totals.values()) and int(frame["failed"].sum()) == 0 and caught
    ok = ok and all(run.returncode == 0 for run in runs.values())
    summary = ", ".join(f"{tool} {n} errors" for tool, n in totals.items())
    lines = [
        "# sanitizer",
        "",
        f"compute-sanitizer over every kernel's named cases ({int(frame.drop_duplicates('kernel')['cases'].sum())} "
        f"cases a tool): {summary}; {int(frame['failed'].sum())} failed cases. Negative control (the W4A16 GEMM "
        f"reading one scale past the end, under memcheck): {'caught' if caught else 'NOT caught'}, "
        f"{attributed} of {control_total} error records in its kernel.",
        "",
        f"{platform.device_name}; {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC; git {_git_sha()}; "
        "command: `python -m suites.sanitize` (torch's caching allocator off)",
        "",
        frame.to_markdown(index=False),
        "",
    ]
    if probes:
        table = pd.DataFrame(
            [
                {"probe": name, "tool": tool, "errors": n if rc == 0 else f"did not run (exit {rc})"}
                for name, (tool, n, rc) in probes.items()
            ]
        )
        lines += [
            "## Tool probes",
            "",
            "Minimal kernels, none of the project's (`suites/sanitizer/tool_probes.py`, whose docstring says what "
            "each shows): what the tool reports for Triton's warp-specialize dispatch (racecheck) and for a TMA "
            "store (initcheck). Not in the verdict; records of the same kind in the table above are of the "
            "mechanism, not of the kernel.",
            "",
            table.to_markdown(index=False),
            "",
        ]
    (folder / "sanitizer.md").write_text("\n".join(lines))
    return folder, ok


def _git_sha() -> str:
    """TOUCHSTONE_GIT_SHA when the caller sets it (a copy of the tree without its history), else git's HEAD."""
    if sha := os.environ.get("TOUCHSTONE_GIT_SHA"):
        return sha
    done = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=False)
    return done.stdout.strip() or "unknown"
