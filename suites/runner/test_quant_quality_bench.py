"""`python -m bench.llm.quant_quality --smoke` runs end to end on the embedded model and writes its report; the
mxfp4 row's perplexity equals the torchao-emulated model's (equal bytes); nvfp4's differs in a measured few blocks.
The smoke runs the two FP4 schemes (the FP8 ones take the same path through the bench, without torchao)."""

from __future__ import annotations

import pandas as pd
import pytest

from suites.runner.conftest import one_thread, require_model_packages


def test_quality_report_smoke(tmp_path):
    require_model_packages()
    from bench.llm.quant_quality import main

    with one_thread():
        assert main(["--smoke", "--schemes", "mxfp4,nvfp4", "--out", str(tmp_path)]) == 0
    (folder,) = tmp_path.iterdir()
    rows = pd.read_csv(folder / "quant_quality.csv").set_index("scheme")
    assert list(rows.index) == ["unquantized (fp32)", "mxfp4", "nvfp4"]
    assert rows.loc["mxfp4", "perplexity"] == rows.loc["mxfp4", "torchao_emulated_perplexity"]
    assert rows.loc["mxfp4", "torchao_weights_differing"] == 0
    # NVFP4: torchao computes a block's E4M3 scale as (amax / 6) / per-tensor scale, two roundings where the
    # reference takes one (amax * (s_enc / 6)); one block in a few thousand lands on the neighbouring byte
    assert 0 < rows.loc["nvfp4", "torchao_weights_differing"] < 1e-3
    nvfp4 = rows.loc["nvfp4"]
    assert abs(nvfp4["perplexity"] / nvfp4["torchao_emulated_perplexity"] - 1) < 0.02
    assert (rows["perplexity"] > 1).all() and (rows.iloc[1:]["top1_agreement"] <= 1).all()
    assert len(pd.read_csv(folder / "quant_quality_layers.csv")) == 2 * 4 * 30
    assert (folder / "quant_quality.png").stat().st_size > 0


def test_an_unknown_scheme_is_refused_by_name(capsys):
    from bench.llm.quant_quality import main

    with pytest.raises(SystemExit):
        main(["--schemes", "fp8,int3"])
    assert "--schemes: unknown ['int3']" in capsys.readouterr().err
