"""Checkpoints made by llm-compressor itself, loaded by the runner. A tiny transformers Llama goes through the
library's `oneshot` with its presets (on the CPU; the ones with static activation scales, or FP4 activations, on
two token sequences of calibration data), and the library saves the checkpoint compressed:
- FP8_DYNAMIC: E4M3 weights with a scale per output row, activations quantized per token at run time (the
  runner's fp8_channel);
- FP8_BLOCK: 128 x 128 weight tiles, 1 x 128 activation groups (fp8_block; its scales named `weight_scale`);
- MXFP4A16 and NVFP4A16: FP4 weights (`weight_packed`) with E8M0 scales per 32, or E4M3 scales per 16 under an
  encode global scale (`weight_global_scale`); activations unquantized (mxfp4, nvfp4);
- FP8: E4M3 weights with a scale per tensor, activations quantized per tensor with a static scale calibrated on
  a few sequences (`input_scale`; the runner's fp8 with static input scales);
- MXFP4 and NVFP4: the same FP4 weights with FP4 activations, MXFP4's scaled per token and 32 columns at run time,
  NVFP4's per token and 16 columns under a global scale calibrated on a few sequences (`input_global_scale`): the
  runner fake-quantizes them (mxfp4_w4a4, nvfp4_w4a4).
NVFP4A16 also runs on the embedded SmolLM2 itself (its weights as the runner loads them from the GGUF file, saved
as a transformers checkpoint: `producers.save_runner_model_as_hf`); its dimensions (576, 192-row k and v) are not
multiples of the 128-row tiles FP8_BLOCK's fused parts need.

The oracle is the producer's own fake-quantized model, the one `oneshot` leaves in memory, run in transformers:
- every linear weight the runner holds, decoded, is the producer's fake-quantized weight (bit for bit up to the
  sign of zero; NVFP4 within one rounding, `_check_weights`);
- each quantized layer, given one input, returns what the producer's modules return (the fused q/k/v and gate/up
  layers: their parts' outputs side by side), within fp32 summation order;
- greedy decoding: the runner's tokens are the producer's until a step where the producer's two best logits are
  within the preset's bound, and the first step's logits agree within it. For the presets that quantize
  activations the bound covers a flipped activation code (quantization turns the last-bit differences of two
  fp32 forwards into a different E4M3 or E2M1 code now and then: one activation moves by a step of its format);
  the weight-only presets have no activation to flip.
Bad tensors are refused naming them, and a scale read from the neighbouring row is caught (negative control);
W4A4 layers run weight-only, or with their activations scaled otherwise, are caught too."""

from __future__ import annotations

import copy
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from kernels.tolerances import assert_exact
from runner.model import load_model
from runner.model.quant.dequantized import dequantized_weight
from suites.runner.conftest import one_thread
from suites.runner.producers import (
    FLIP_BOUND,
    FP4_FLIP_BOUND,
    check_greedy,
    check_outputs,
    fake_quantized_weight,
    pairs,
    save_base_model,
)

SCHEMES = {
    "FP8_DYNAMIC": "fp8_channel", "FP8_BLOCK": "fp8_block", "MXFP4A16": "mxfp4", "NVFP4A16": "nvfp4",
    "MXFP4": "mxfp4_w4a4", "NVFP4": "nvfp4_w4a4", "FP8": "fp8", "NVFP4A16 SmolLM2": "nvfp4",
}  # fmt: skip
CALIBRATED = ("MXFP4", "NVFP4", "FP8")  # oneshot runs them on data (static input scales, or dynamic ones alike)
# The weight-only presets quantize no activation: nothing can flip, their logits agree within fp32 order
BOUNDS = {"FP8_DYNAMIC": FLIP_BOUND, "FP8_BLOCK": FLIP_BOUND, "FP8": FLIP_BOUND, "MXFP4A16": 1e-5, "NVFP4A16": 1e-5}
BOUNDS["NVFP4A16 SmolLM2"] = 1e-5
BOUNDS |= {"MXFP4": FP4_FLIP_BOUND, "NVFP4": FP4_FLIP_BOUND}
CALIBRATION = [[5, 17, 33, 2, 9, 41, 60, 3, 3, 71, 11, 12], [40, 41, 42, 7, 7, 90, 1, 2]]


def _calibration():
    """oneshot's dataset and processor for the presets that calibrate (NVFP4's input global scale): a few
    token sequences, and a word-level tokenizer over the tiny model's vocabulary (oneshot wants one with data)."""
    from datasets import Dataset
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(97)}
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, "t0")), pad_token="t0")
    rows = {"input_ids": CALIBRATION, "attention_mask": [[1] * len(c) for c in CALIBRATION]}
    return {"dataset": Dataset.from_dict(rows), "processor": tokenizer, "num_calibration_samples": len(CALIBRATION)}


@pytest.fixture(scope="module", params=list(SCHEMES))
def produced(request, tmp_path_factory):
    """(preset, the producer's fake-quantized transformers model, the runner's model of its saved checkpoint, the
    checkpoint's folder)."""
    pytest.importorskip("llmcompressor")
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier
    from transformers import LlamaForCausalLM

    name, folder = request.param, tmp_path_factory.mktemp("llmcompressor")
    preset = name.split()[0]  # the preset; a second word names the model
    base = request.getfixturevalue("smollm2_hf") if "SmolLM2" in name else save_base_model(folder)
    with one_thread():
        # Twice: saving compresses the model in place (its weights become the codes), so the oracle is a second
        # run of the same data-free recipe (min-max scales: the same every run).
        quantized = []
        for _ in range(2):
            model = LlamaForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
            recipe = QuantizationModifier(targets="Linear", scheme=preset, ignore=["lm_head"])
            oneshot(model=model, recipe=recipe, **(_calibration() if preset in CALIBRATED else {}))
            quantized.append(model)
        quantized[1].save_pretrained(folder / preset, save_compressed=True)
        ours = load_model(str(folder / preset), dtype=torch.float32, device="cpu", tokenizer=False)[0]
    return name, quantized[0], ours, folder / preset


def _pairs(produced):
    return pairs(produced[1], produced[2])


def test_the_layers_take_the_presets_scheme(produced):
    preset, _, ours, _ = produced
    assert {layer.scheme.name for layer, _ in _pairs(produced)} == {SCHEMES[preset]}
    assert ours.lm_head is None or ours.lm_head.scheme.name == "unquantized"  # ignored; SmolLM2 ties it


def _check_weights(layer_pairs) -> None:
    """Bit for bit up to the sign of zero (MXFP4 loads -0 codes as +0: runner.model.quant.mxfp4), except that
    NVFP4 decodes with fp32(1 / the encode global scale) where compressed-tensors divides by it: one rounding
    apart, within 2**-22 of each weight."""
    for layer, parts in layer_pairs:
        # x + 0.0 is +0 for a -0 x, else x
        want = torch.cat([fake_quantized_weight(p) for p in parts]) + 0.0
        got = dequantized_weight(layer) + 0.0
        if layer.scheme.name.startswith("nvfp4"):
            assert torch.allclose(got, want, rtol=2**-22, atol=0), "nvfp4 weight"
        else:
            assert_exact(got, want, f"{layer.scheme.name} weight")


def test_weights_are_the_producers_fake_quantized_weights(produced):
    _check_weights(_pairs(produced))


def test_each_layer_returns_the_producers_output(produced):
    check_outputs(_pairs(produced))


# The buffer holding each scheme's scales, and the dimension of its output rows
SCALES = {"fp8_channel": ("weight_scale_cols", -1), "fp8_block": ("weight_scale_inv", 0), "mxfp4": ("weight_scales", 0)}
SCALES["fp8"] = SCALES["fp8_channel"]  # per-tensor: each part's scale on its rows
SCALES |= {name: SCALES["mxfp4"] for name in ("nvfp4", "mxfp4_w4a4", "nvfp4_w4a4")}


def test_a_scale_read_from_the_neighbouring_row_or_tile_is_caught(produced):
    """Negative control: the runner's scales rolled by one output row (one 128-row tile for fp8_block), in one
    layer: both checks above fail."""
    layer, parts = next(_pairs(produced))
    name, rows = SCALES[layer.scheme.name]
    good = getattr(layer, name)
    setattr(layer, name, good.roll(1, dims=rows))
    try:
        with pytest.raises(AssertionError):
            _check_weights([(layer, parts)])
        with pytest.raises(AssertionError):
            check_outputs([(layer, parts)])
    finally:
        setattr(layer, name, good)


@pytest.mark.parametrize("produced", ["MXFP4", "NVFP4"], indirect=True)
def test_activations_left_unquantized_or_scaled_otherwise_are_caught(produced):
    """Negative control for the W4A4 presets: the layer run weight-only (the W4A16 scheme's apply), or with
    MXFP4 activation scales rounded "floor" / NVFP4's input global scale read as a decode scale: each layer
    check fails."""
    layer, parts = next(_pairs(produced))
    scheme = layer.scheme
    wrong = {"input_scale_mode": "floor"} if scheme.name == "mxfp4_w4a4" else {"global_scale": "decode"}
    for planted in (super(type(scheme), scheme).apply, _replaced(scheme, wrong).apply):
        layer.scheme = copy.copy(scheme)
        layer.scheme.apply = planted
        try:
            with pytest.raises(AssertionError):
                check_outputs([(layer, parts)])
        finally:
            layer.scheme = scheme


def _replaced(scheme, fields: dict):
    twin = copy.copy(scheme)
    twin.__dict__.update(fields)
    return twin


def test_greedy_decoding_follows_the_producer(produced):
    check_greedy(produced[1], produced[2], BOUNDS[produced[0]])


L0, L1 = "model.layers.0.", "model.layers.1."


def _set_first(tensors, name, value):
    tensors[name].view(-1)[0] = value


def _bad_cases(preset: str) -> dict:
    """{case: (edit of the checkpoint's tensors, the refusal's message)} for a preset's checkpoint."""
    k_scale, up, down = L0 + "self_attn.k_proj.weight_scale", L1 + "mlp.up_proj.", L1 + "mlp.down_proj."
    cases = {
        "scale_shape": (
            lambda t: t.__setitem__(k_scale, t[k_scale].flatten().repeat(2)),
            r"'model.layers.0.self_attn.k_proj.weight_scale': shard 'k' must be (\[|a scalar)",
        ),
        "missing_scale": (
            lambda t: t.pop(L0 + "self_attn.v_proj.weight_scale"),
            r"qkv_proj.weight_scale \(shard 'v'\)",
        ),
    }
    layer = r"layer 'model.layers.1.mlp.gate_up_proj': "
    if preset.startswith("FP8"):
        cases["bad_scale"] = (lambda t: _set_first(t, up + "weight_scale", 0.0), layer + "weight_scale: must be finite")
        cases["codes_dtype"] = (
            lambda t: t.__setitem__(down + "weight", t[down + "weight"].float()),
            r"'model.layers.1.mlp.down_proj.weight'.*must be torch.float8_e4m3fn",
        )
        return cases
    if preset.startswith("MXFP4"):
        cases["bad_scale"] = (lambda t: _set_first(t, up + "weight_scale", 0xFF), layer + r"weight_scale: E8M0 0xFF")
    elif preset == "NVFP4A16":
        cases["bad_scale"] = (
            lambda t: _set_first(t, up + "weight_global_scale", float("nan")),
            layer + "weight_global_scale: must be finite",
        )
    else:  # the activation's global scale
        cases["bad_scale"] = (
            lambda t: _set_first(t, up + "input_global_scale", 0.0),
            layer + "input_global_scale: must be finite and > 0",
        )
    cases["codes_dtype"] = (
        lambda t: t.__setitem__(down + "weight_packed", t[down + "weight_packed"].to(torch.int8)),
        r"'model.layers.1.mlp.down_proj.weight_packed'.*must be torch.uint8",
    )
    return cases


@pytest.mark.parametrize("case", ["scale_shape", "missing_scale", "bad_scale", "codes_dtype"])
def test_a_bad_tensor_is_refused_by_name(produced, tmp_path, case):
    edit, message = _bad_cases(produced[0].split()[0])[case]
    folder = tmp_path / "bad"
    shutil.copytree(produced[3], folder)
    tensors = load_file(folder / "model.safetensors")
    edit(tensors)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=message):
        load_model(str(folder), dtype=torch.float32, device="cpu", tokenizer=False)


def test_the_cuda_branch_is_the_fp32_path_rounded_once(monkeypatch):
    """fp8_channel's CUDA branch (row-wise `torch._scaled_mm`, which torch also runs on the CPU) against the
    layer's fp32 path, on bf16 activations: the same products and scales, summed in another order; the bf16
    results at most one bf16 step apart. Outlier rows and columns keep the scales far apart."""
    from runner.model.layers import Linear
    from runner.model.quant import fp8_tensor, make_scheme

    gen = torch.Generator().manual_seed(7)
    layer = Linear(256, {"a": 32, "b": 16}, torch.bfloat16, "cpu", make_scheme("fp8_channel", online=False))
    for shard, rows in layer.shard_sizes.items():
        w = torch.randn(rows, 256, generator=gen) * torch.logspace(-3, 2, rows).reshape(-1, 1)
        scale = w.abs().amax(1, keepdim=True) / 448
        layer.weight_loader(layer.weight, (w / scale).to(torch.float8_e4m3fn), shard)
        layer.weight_loader(layer.weight_scale, scale, shard)
    layer.process_weights_after_loading()
    x = (torch.randn(5, 256, generator=gen) * torch.logspace(-2, 3, 5).reshape(-1, 1)).to(torch.bfloat16)
    plain = layer(x).float()
    monkeypatch.setattr(fp8_tensor, "uses_kernels", lambda x: True)
    got = layer(x).float()
    step = 2.0 ** (torch.frexp(plain)[1].float() - 8)  # one bf16 step at each value
    assert bool(((got - plain).abs() <= step).all())
    assert not torch.equal(plain, torch.zeros_like(plain))
