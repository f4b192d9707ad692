"""MXFP4 checkpoints made by AMD Quark itself, loaded by the runner. A tiny transformers Llama goes through
Quark's `ModelQuantizer` (on the CPU) and `export_safetensors` with its defaults (real-quantized, pack method
"reorder"); the runner loads the folder as an AMD Quark checkpoint (test_quant_checkpoints.py writes one by the
format's description). Two configs: weights FP4 per group of 32 with E8M0 scales in scale mode "even" and
- W4A16: activations unquantized (the runner's mxfp4);
- W4A4: activations in the same format, scaled at run time (mxfp4_w4a4: fake-quantized in the runner).

The oracle is Quark's own quantized model in memory, run in transformers:
- every linear weight the runner holds, decoded, is Quark's fake-quantized weight, bit for bit;
- each layer given one input returns what Quark's modules return, within fp32 summation order (W4A4: the
  activation's codes and scales are Quark's, so the products are the same);
- greedy tokens equal, the first step's logits within that order (no W4A4 activation code flipped in 12 of 12
  llm-compressor MXFP4 models: test_quant_llmcompressor.py)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from kernels.tolerances import assert_exact
from reference.quant.mxfp4 import dequantize_mxfp4
from runner.model import load_model
from suites.runner import quark_oracle
from suites.runner.conftest import one_thread
from suites.runner.producers import check_greedy, check_outputs, pairs, save_base_model

# fp32 summation order, as a fraction of the largest output: 1.4e-6 measured on the first-step logits
ORDER_BOUND = 1e-5


@pytest.fixture(scope="module", params=["W4A16", "W4A4"])
def exported(request, tmp_path_factory):
    """(Quark's quantized transformers model, the runner's model of the checkpoint Quark exported)."""
    quark = quark_oracle.quark_torch()
    from quark.torch.quantization.config.config import FP4PerGroupSpec, QConfig, QLayerConfig
    from transformers import LlamaForCausalLM

    folder = tmp_path_factory.mktemp("quark")
    base = save_base_model(folder)
    spec = FP4PerGroupSpec(
        ch_axis=-1, group_size=32, scale_format="e8m0", scale_calculation_mode="even", is_dynamic=False
    )
    inputs = dataclasses.replace(spec, is_dynamic=True).to_quantization_spec() if request.param == "W4A4" else None
    config = QConfig(
        global_quant_config=QLayerConfig(weight=spec.to_quantization_spec(), input_tensors=inputs), exclude=["lm_head"]
    )  # fmt: skip
    # static weights and dynamic activations: nothing is calibrated on it
    calibration = torch.utils.data.DataLoader([torch.tensor([5, 17, 33, 2])], batch_size=1)
    with one_thread():
        # Twice: the export freezes and converts the model it is given; the oracle is a second, identical run
        models = []
        for _ in range(2):
            model = LlamaForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
            models.append(quark.ModelQuantizer(config).quantize_model(model, calibration))
        quark.export_safetensors(models[1], folder / "mxfp4")
        ours = load_model(str(folder / "mxfp4"), dtype=torch.float32, device="cpu", tokenizer=False)[0]
    return models[0], ours


def test_the_layers_are_mxfp4_and_the_head_is_excluded(exported):
    want = "mxfp4_w4a4" if exported[0].model.layers[0].mlp.down_proj._input_quantizer is not None else "mxfp4"
    assert {layer.scheme.name for layer, _ in pairs(*exported)} == {want}
    assert exported[1].lm_head.scheme.name == "unquantized"


def test_weights_are_quarks_fake_quantized_weights(exported):
    from runner.model.quant.dequantized import dequantized_weight

    for layer, parts in pairs(*exported):
        with torch.no_grad():
            want = torch.cat([p.get_quant_weight(p.weight) for p in parts])
        assert_exact(dequantized_weight(layer), want, "mxfp4 weight")


def test_each_layer_returns_quarks_output(exported):
    check_outputs(pairs(*exported), rtol=ORDER_BOUND)


def test_greedy_decoding_is_quarks(exported):
    check_greedy(*exported, bound=ORDER_BOUND)


def test_a_swapped_nibble_order_is_caught(exported):
    """Negative control: one layer's codes read with the two E2M1 values of each byte swapped (the nibble-order
    bug of FP4 loaders) fail the weight check."""
    from runner.model.quant.mxfp4 import interchange_weight

    layer, parts = next(pairs(*exported))
    codes, scales = interchange_weight(layer)
    swapped = (codes >> 4) | (codes << 4)
    with torch.no_grad():
        want = torch.cat([p.get_quant_weight(p.weight) for p in parts])
    got = dequantize_mxfp4(swapped, scales, dtype=torch.float32)[:, : layer.in_features]
    with pytest.raises(AssertionError):
        assert_exact(got, want, "mxfp4 weight")
