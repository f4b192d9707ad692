"""An FP8 checkpoint made by NVIDIA ModelOpt itself, loaded by the runner. A tiny transformers Llama goes through
`modelopt.torch.quantization.quantize` with FP8_DEFAULT_CFG (E4M3 weights and inputs, one static scale each,
calibrated on one sequence; on the CPU) and `export_hf_checkpoint`; the runner loads it as per-tensor FP8 with
static input scales. The same runs on the embedded SmolLM2 itself (its weights as the runner loads them from the
GGUF file, saved as a transformers checkpoint: `producers.save_runner_model_as_hf`). (ModelOpt's NVFP4
calibration asserts a CUDA tensor, so its NVFP4 export cannot run on this tier; test_quant_checkpoints.py writes
one by the format's description.)

The oracle is ModelOpt's quantized model in memory, run in transformers:
- every linear weight the runner holds is the export's, bit for bit; the export and ModelOpt's fake-quantized
  weights differ only at exact E4M3 ties, which the two round two ways: the export divides by fp32(amax / 448)
  and the fake quantization multiplies by fp32(448 / amax), so a weight w with w * 448 / amax = 84 exactly
  becomes code 80 (ties to even) in the file and 88 in memory (84.0000076). SmolLM2's weights are bf16 values and
  hit 1,646 such ties in its first down_proj (0.19 %); the tiny Llama's fp32 ones hit none;
- each layer given one input returns ModelOpt's output (its own input quantizer, the export's weights) within
  fp32 summation order; the fused q/k/v and gate/up keep each part's weight scale on its rows
  (runner.model.quant.fp8_tensor), as ModelOpt's modules do;
- greedy decoding: the runner's tokens are ModelOpt's until a step where ModelOpt's two best logits are within
  the bound of a flipped activation code (a static scale, but the inputs of two fp32 forwards differ in their
  last bits: now and then one activation lands on the neighbouring E4M3 code; a tie rounded the other way moves
  one weight by one code)."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from kernels.tolerances import assert_exact
from runner.model import load_model
from runner.model.quant.dequantized import dequantized_weight
from suites.runner.conftest import one_thread
from suites.runner.producers import FLIP_BOUND, check_greedy, check_outputs, pairs, save_base_model

ORDER_BOUND = 1e-5  # fp32 summation order: 1.7e-7 measured


@pytest.fixture(scope="module", params=["tiny Llama", "SmolLM2"])
def exported(request, tmp_path_factory):
    """(ModelOpt's quantized transformers model, the runner's model of the checkpoint ModelOpt exported, the
    export's tensors)."""
    mtq = pytest.importorskip("modelopt.torch.quantization")
    from modelopt.torch.export import export_hf_checkpoint
    from transformers import LlamaForCausalLM

    folder = tmp_path_factory.mktemp("modelopt")
    base = request.getfixturevalue("smollm2_hf") if request.param == "SmolLM2" else save_base_model(folder)

    def calibrate(model):
        model(torch.tensor([[5, 17, 33, 2, 9, 41, 60, 3]]))

    with one_thread():
        # Twice: the export converts the model it is given; the oracle is a second, identical calibration
        models = []
        for _ in range(2):
            model = LlamaForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
            models.append(mtq.quantize(model, mtq.FP8_DEFAULT_CFG, calibrate))
        export_hf_checkpoint(models[1], export_dir=str(folder / "fp8"))
        ours = load_model(str(folder / "fp8"), dtype=torch.float32, device="cpu", tokenizer=False)[0]
    return models[0], ours, load_file(folder / "fp8" / "model.safetensors")


def _pairs(exported):
    return pairs(exported[0], exported[1])


def test_the_layers_are_static_fp8_and_the_head_is_excluded(exported):
    assert {(layer.scheme.name, layer.scheme.static_input) for layer, _ in _pairs(exported)} == {("fp8", True)}
    assert exported[1].lm_head is None or exported[1].lm_head.scheme.name == "unquantized"  # SmolLM2 ties it


def _written(exported) -> dict:
    """Each of ModelOpt's linear modules -> its weight as the export wrote it, decoded (codes x weight_scale)."""
    names = {module: name for name, module in exported[0].named_modules()}
    tensors = exported[2]
    return {
        p: tensors[f"{names[p]}.weight"].float() * tensors[f"{names[p]}.weight_scale"]
        for _, parts in _pairs(exported)
        for p in parts
    }


def test_weights_are_the_exports_and_differ_from_the_fake_quantized_only_at_exact_ties(exported):
    written = _written(exported)
    for layer, parts in _pairs(exported):
        assert_exact(dequantized_weight(layer), torch.cat([written[p] for p in parts]), "weight")
        for p in parts:
            amax = p.weight_quantizer.amax.float()
            with torch.no_grad():
                memory = (p.weight_quantizer(p.weight) * 448 / amax).to(torch.float8_e4m3fn).double()
            file = (written[p] * 448 / amax).to(torch.float8_e4m3fn).double()
            exact = p.weight.detach().double() * 448 / amax.double()
            apart = file != memory
            assert torch.equal(exact[apart], (file[apart] + memory[apart]) / 2), "a difference that is not a tie"


def test_each_layer_returns_modelopts_output(exported):
    fused = [[float(p.weight_quantizer.amax) for p in parts] for _, parts in _pairs(exported) if len(parts) > 1]
    assert all(len(set(amax)) > 1 for amax in fused)  # the parts' scales differ: one scale per layer would not do
    written = _written(exported)

    def as_exported(p):  # ModelOpt's module with its input quantizer and the export's weight
        return lambda x: torch.nn.functional.linear(p.input_quantizer(x), written[p], p.bias)

    check_outputs([(layer, [as_exported(p) for p in parts]) for layer, parts in _pairs(exported)], rtol=ORDER_BOUND)


def test_a_weight_rounded_the_other_way_is_caught(exported):
    """Negative control: one weight of the first layer moved by one E4M3 code (what a tie rounded the other way
    does): the weight check fails."""
    layer, parts = next(_pairs(exported))
    good = layer.weight_fp8
    layer.weight_fp8 = good.clone()
    layer.weight_fp8.view(torch.uint8).view(-1)[0] += 1
    try:
        with pytest.raises(AssertionError):
            assert_exact(dequantized_weight(layer), torch.cat([_written(exported)[p] for p in parts]), "weight")
    finally:
        layer.weight_fp8 = good


def test_greedy_decoding_follows_modelopt(exported):
    check_greedy(exported[0], exported[1], bound=FLIP_BOUND)
