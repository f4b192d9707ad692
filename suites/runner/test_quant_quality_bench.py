"""`python -m bench.llm.quant_quality --smoke` runs end to end on the embedded model and writes its report; the
mxfp4 row's perplexity equals the torchao-emulated model's (equal bytes); nvfp4's differs in a measured few blocks.
The FP4 schemes' smoke and fp8's (its weights-only row beside torchao's per-tensor E4M3 weights) run apart."""

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
    assert list(rows.index) == ["unquantized (fp32)", "bf16 weights", "mxfp4", "nvfp4"]
    assert rows.loc["bf16 weights", "perplexity_vs_bf16"] == 1.0
    assert (rows["vs_bf16_ci95_low"] <= rows["perplexity_vs_bf16"]).all()
    assert (rows["perplexity_vs_bf16"] <= rows["vs_bf16_ci95_high"]).all()
    assert rows.loc["mxfp4", "perplexity"] == rows.loc["mxfp4", "torchao_emulated_perplexity"]
    assert rows.loc["mxfp4", "torchao_weights_differing"] == 0
    # NVFP4: torchao computes a block's E4M3 scale as (amax / 6) / per-tensor scale, two roundings where the
    # reference takes one (amax * (s_enc / 6)); one block in a few thousand lands on the neighbouring byte
    assert 0 < rows.loc["nvfp4", "torchao_weights_differing"] < 1e-3
    nvfp4 = rows.loc["nvfp4"]
    assert abs(nvfp4["perplexity"] / nvfp4["torchao_emulated_perplexity"] - 1) < 0.02
    assert (rows["perplexity"] > 1).all() and (rows.iloc[2:]["top1_agreement"] <= 1).all()
    assert len(pd.read_csv(folder / "quant_quality_layers.csv")) == 2 * 4 * 30
    assert (folder / "quant_quality.png").stat().st_size > 0


def test_fp8_rows_beside_torchao_smoke(tmp_path):
    """fp8's weights-only row beside torchao's per-tensor E4M3 weights: the same codes but for exact ties, which
    torchao's w / scale and the runner's w * (1 / scale) (vLLM's order) round apart; the per-channel row is
    scored."""
    require_model_packages()
    from bench.llm.quant_quality import main

    with one_thread():
        assert main(["--smoke", "--schemes", "fp8", "--out", str(tmp_path)]) == 0
    (folder,) = tmp_path.iterdir()
    rows = pd.read_csv(folder / "quant_quality.csv").set_index("scheme")
    only, channel = "fp8 weights only", "fp8 weights only, per channel (torchao)"
    assert list(rows.index) == ["unquantized (fp32)", "bf16 weights", "fp8", only, channel]
    assert 0 < rows.loc[only, "torchao_weights_differing"] < 1e-3
    assert abs(rows.loc[only, "perplexity"] / rows.loc[only, "torchao_emulated_perplexity"] - 1) < 0.01
    assert rows.loc[channel, "perplexity"] > 1


def test_the_ratio_interval_is_a_paired_bootstrap():
    """Equal per-token shifts give a point interval at exp(shift); a shift on one token in ten spreads the
    interval around the ratio; the pairing cancels what both models share."""
    import math

    import torch

    from bench.llm.quant_quality import ratio_interval

    base = torch.rand(500, dtype=torch.float64, generator=torch.Generator().manual_seed(1)) * 8
    low, high = ratio_interval(base + 0.05, base)
    assert low == high == pytest.approx(math.exp(0.05), rel=1e-12)
    shifted = base.clone()
    shifted[::10] += 0.5
    low, high = ratio_interval(shifted, base)
    assert low < math.exp(0.05) < high and high - low > 0.02
    assert ratio_interval(base, base) == (1.0, 1.0)


def test_an_unknown_scheme_is_refused_by_name(capsys):
    from bench.llm.quant_quality import main

    with pytest.raises(SystemExit):
        main(["--schemes", "fp8,int3"])
    assert "--schemes: unknown ['int3']" in capsys.readouterr().err
