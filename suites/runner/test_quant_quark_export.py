"""Checkpoints made by AMD Quark itself, loaded by the runner. A tiny transformers Llama goes through Quark's
`ModelQuantizer` (on the CPU) and `export_safetensors` with its defaults (real-quantized, pack method "reorder");
the runner loads the folder as an AMD Quark checkpoint (test_quant_checkpoints.py writes one by the format's
description). W4A16 also runs on the embedded SmolLM2 itself: its weights as the runner loads them from the GGUF
file, saved as a transformers checkpoint (`producers.save_runner_model_as_hf`; transformers on it gives the
runner's logits, `test_smollm2_as_saved_is_the_runners_model`). Three configs:
- W4A16: weights FP4 per group of 32 with E8M0 scales in scale mode "even", activations unquantized (mxfp4);
- W4A4: the same weights, activations in the same format scaled at run time (mxfp4_w4a4: fake-quantized);
- PTPC_FP8 (Quark's PTPC scheme): E4M3 weights with a scale per output row (`weight_scale` [N]), activations
  E4M3 per token at run time (fp8_channel).

The oracle is Quark's own quantized model in memory, run in transformers:
- every linear weight the runner holds, decoded, is Quark's fake-quantized weight, bit for bit;
- each layer given one input returns what Quark's modules return, within fp32 summation order (W4A4: the
  activation's codes and scales are Quark's, so the products are the same);
- greedy tokens equal, the first step's logits within that order (no W4A4 activation code flipped in 12 of 12
  llm-compressor MXFP4 models: test_quant_llmcompressor.py); for PTPC_FP8 up to a flipped E4M3 activation code
  (test_quant_llmcompressor.py's FLIP_BOUND, measured there on the same per-token arithmetic)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from kernels.tolerances import assert_exact
from reference.quant.mxfp4 import dequantize_mxfp4
from runner.model import load_model
from suites.runner import quark_oracle
from suites.runner.conftest import one_thread
from suites.runner.producers import FLIP_BOUND, check_greedy, check_outputs, pairs, save_base_model

# fp32 summation order, as a fraction of the largest output: 1.4e-6 measured on the first-step logits
ORDER_BOUND = 1e-5
SCHEMES = {"W4A16": "mxfp4", "W4A4": "mxfp4_w4a4", "PTPC_FP8": "fp8_channel", "W4A16 SmolLM2": "mxfp4"}
BOUNDS = {"W4A16": ORDER_BOUND, "W4A4": ORDER_BOUND, "PTPC_FP8": FLIP_BOUND, "W4A16 SmolLM2": ORDER_BOUND}


def _layer_config(name: str):
    """Quark's QLayerConfig of a named config (module doc)."""
    from quark.torch.quantization.config.config import FP4PerGroupSpec, FP8E4M3PerChannelSpec, QLayerConfig

    name = name.split()[0]  # the config; a second word names the model
    if name == "PTPC_FP8":  # as Quark's own PTPCFP8Scheme template builds it
        weight = FP8E4M3PerChannelSpec(is_dynamic=False, ch_axis=0).to_quantization_spec()
        inputs = FP8E4M3PerChannelSpec(is_dynamic=True, ch_axis=1).to_quantization_spec()
        return QLayerConfig(weight=weight, input_tensors=inputs)
    spec = FP4PerGroupSpec(
        ch_axis=-1, group_size=32, scale_format="e8m0", scale_calculation_mode="even", is_dynamic=False
    )
    inputs = dataclasses.replace(spec, is_dynamic=True).to_quantization_spec() if name == "W4A4" else None
    return QLayerConfig(weight=spec.to_quantization_spec(), input_tensors=inputs)


def test_smollm2_as_saved_is_the_runners_model(smollm2, smollm2_hf):
    from transformers import LlamaForCausalLM

    from kernels.tolerances import assert_agree, families
    from suites.runner.model_driver import greedy

    hf = LlamaForCausalLM.from_pretrained(smollm2_hf, dtype=torch.float32).eval()
    prompt = [1, 504, 3458, 314, 253, 1789]
    with one_thread(), torch.no_grad():
        _, logits = greedy(smollm2[0], [prompt], 1)
        want = hf(torch.tensor([prompt])).logits[0, -1]
    assert_agree(families.LLAMA_VS_HF, logits[0], want, "first-step logits")


@pytest.fixture(scope="module", params=list(SCHEMES))
def exported(request, tmp_path_factory):
    """(Quark's quantized transformers model, the runner's model of the checkpoint Quark exported, the config's
    name)."""
    quark = quark_oracle.quark_torch()
    from quark.torch.quantization.config.config import QConfig
    from transformers import LlamaForCausalLM

    folder = tmp_path_factory.mktemp("quark")
    base = request.getfixturevalue("smollm2_hf") if "SmolLM2" in request.param else save_base_model(folder)
    config = QConfig(global_quant_config=_layer_config(request.param), exclude=["lm_head"])
    # static weights and dynamic activations: nothing is calibrated on it
    calibration = torch.utils.data.DataLoader([torch.tensor([5, 17, 33, 2])], batch_size=1)
    with one_thread():
        # Twice: the export freezes and converts the model it is given; the oracle is a second, identical run
        models = []
        for _ in range(2):
            model = LlamaForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
            models.append(quark.ModelQuantizer(config).quantize_model(model, calibration))
        quark.export_safetensors(models[1], folder / "quark")
        ours = load_model(str(folder / "quark"), dtype=torch.float32, device="cpu", tokenizer=False)[0]
    return models[0], ours, request.param


def test_the_layers_take_the_configs_scheme_and_the_head_is_excluded(exported):
    theirs, ours, name = exported
    assert {layer.scheme.name for layer, _ in pairs(theirs, ours)} == {SCHEMES[name]}
    assert ours.lm_head is None or ours.lm_head.scheme.name == "unquantized"  # SmolLM2 ties it to the embedding


def _check_weights(layer_pairs) -> None:
    from runner.model.quant.dequantized import dequantized_weight

    for layer, parts in layer_pairs:
        with torch.no_grad():
            want = torch.cat([p.get_quant_weight(p.weight) for p in parts])
        assert_exact(dequantized_weight(layer), want, f"{layer.scheme.name} weight")


def test_weights_are_quarks_fake_quantized_weights(exported):
    _check_weights(pairs(*exported[:2]))


def test_each_layer_returns_quarks_output(exported):
    check_outputs(pairs(*exported[:2]), rtol=ORDER_BOUND)


def test_greedy_decoding_is_quarks(exported):
    check_greedy(*exported[:2], bound=BOUNDS[exported[2]])


@pytest.mark.parametrize("exported", ["PTPC_FP8"], indirect=True)
def test_a_scale_read_from_the_neighbouring_row_is_caught(exported):
    """Negative control: one layer's per-row scales rolled by one row fail the weight and layer checks."""
    layer, parts = next(pairs(*exported[:2]))
    good = layer.weight_scale_cols
    layer.weight_scale_cols = good.roll(1, dims=-1)
    try:
        with pytest.raises(AssertionError):
            _check_weights([(layer, parts)])
        with pytest.raises(AssertionError):
            check_outputs([(layer, parts)], rtol=ORDER_BOUND)
    finally:
        layer.weight_scale_cols = good


@pytest.mark.parametrize("exported", ["W4A16", "W4A4"], indirect=True)
def test_a_swapped_nibble_order_is_caught(exported):
    """Negative control: one layer's codes read with the two E2M1 values of each byte swapped (the nibble-order
    bug of FP4 loaders) fail the weight check."""
    from runner.model.quant.mxfp4 import interchange_weight

    layer, parts = next(pairs(*exported[:2]))
    codes, scales = interchange_weight(layer)
    swapped = (codes >> 4) | (codes << 4)
    with torch.no_grad():
        want = torch.cat([p.get_quant_weight(p.weight) for p in parts])
    got = dequantize_mxfp4(swapped, scales, dtype=torch.float32)[:, : layer.in_features]
    with pytest.raises(AssertionError):
        assert_exact(got, want, "mxfp4 weight")
