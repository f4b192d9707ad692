"""`python -m bench.llm.quant_quality --smoke` runs end to end on the embedded model and writes its report; the
mxfp4 row's perplexity equals the torchao-emulated model's (the bytes are equal, so must the model be)."""

from __future__ import annotations

import pandas as pd

from suites.runner.conftest import one_thread, require_model_packages


def test_quality_report_smoke(tmp_path):
    require_model_packages()
    from bench.llm.quant_quality import main

    with one_thread():
        assert main(["--smoke", "--out", str(tmp_path)]) == 0
    (folder,) = tmp_path.iterdir()
    rows = pd.read_csv(folder / "quant_quality.csv").set_index("scheme")
    assert list(rows.index) == ["unquantized (fp32)", "fp8", "fp8_block", "mxfp4"]
    assert rows.loc["mxfp4", "perplexity"] == rows.loc["mxfp4", "torchao_emulated_perplexity"]
    assert (rows["perplexity"] > 1).all() and (rows.loc[["fp8", "fp8_block", "mxfp4"], "top1_agreement"] <= 1).all()
    assert len(pd.read_csv(folder / "quant_quality_layers.csv")) == 3 * 4 * 30
    assert (folder / "quant_quality.png").stat().st_size > 0
