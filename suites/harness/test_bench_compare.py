"""`touchstone compare` on the committed H200 reports: a copy of two ops with one planted 10 % slowdown and one
planted correctness change is flagged, and --fail-on-regression turns the slowdown into exit status 1."""

from __future__ import annotations

import pathlib

import pandas as pd
import pytest

from bench import compare, rows, tables

H200 = pathlib.Path(__file__).resolve().parents[2] / "reports" / "cuda-h200"
OPS = ("mxfp4_quantize", "kv_zero_fa_bf16")


@pytest.fixture
def rerun(tmp_path) -> pathlib.Path:
    """A second report folder: two ops of the committed H200 one, with the triton row at 1 GiB of mxfp4_quantize
    10 % slower and one kv_zero row turned into a mismatch."""
    folder = tmp_path / "cuda-h200-rerun"
    for op in OPS:
        frame = rows.read(H200 / f"{op}.csv")
        if op == "mxfp4_quantize":
            slow = (frame["impl"] == "triton") & (frame["x_value"] == frame["x_value"].max())
            frame.loc[slow, "p50"] *= 1.10
        else:
            wrong = (frame["impl"] == "triton") & (frame["x_value"] == frame["x_value"].min())
            frame.loc[wrong, "correctness"] = "mismatch 12/4096"
        tables.write(folder / f"{op}.csv", frame)
    return folder


def test_planted_slowdown_is_flagged_and_fails_the_gate(rerun, tmp_path, capsys):
    out = tmp_path / "cmp"
    assert compare.main([str(H200), str(rerun), "--out", str(out)]) == 0
    assert compare.main([str(H200), str(rerun), "--out", str(out), "--fail-on-regression"]) == 1
    printed = capsys.readouterr().out
    assert "mxfp4_quantize triton 1024: 0.91x (slower 10%) REGRESSION" in printed
    assert "correctness right -> wrong" in printed
    table = pd.read_csv(out / "compare.csv")
    flagged = table[table["flag"].fillna("") != ""]
    moved = flagged[~flagged["flag"].str.startswith("only in")]
    assert len(moved) == 2 and moved["regression"].all()  # nothing else moved: the other rows are copies
    assert (table["flag"] == "only in A").sum() > 0 and (table["flag"] == "only in B").sum() == 0
    md = (out / "compare.md").read_text()
    assert "## Flagged rows" in md and "**regression**" in md and "![comparison](compare.png)" in md
    assert (out / "compare.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_threshold_above_the_change_flags_nothing_but_the_correctness(rerun, tmp_path):
    table = compare.compare(compare.load(H200), compare.load(rerun), threshold=0.2)
    both = table[~table["flag"].str.startswith("only in")]
    assert list(both[both["flag"] != ""]["flag"]) == ["correctness right -> wrong"]


def test_an_identical_folder_compares_clean(tmp_path):
    table = compare.compare(compare.load(H200), compare.load(H200), threshold=0.05)
    assert (table["flag"] == "").all() and not table["regression"].any()
    assert (table["speed_b_over_a"].dropna() == 1.0).all()
