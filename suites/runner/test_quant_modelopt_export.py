"""An FP8 checkpoint made by NVIDIA ModelOpt itself, loaded by the runner. A tiny transformers Llama goes through
`modelopt.torch.quantization.quantize` with FP8_DEFAULT_CFG (E4M3 weights and inputs, one static scale each,
calibrated on one sequence; on the CPU) and `export_hf_checkpoint`; the runner loads it as per-tensor FP8 with
static input scales. (ModelOpt's NVFP4 calibration asserts a CUDA tensor, so its NVFP4 export cannot run on this
tier; test_quant_checkpoints.py writes one by the format's description.)

The oracle is ModelOpt's quantized model in memory, run in transformers:
- each layer given one input returns ModelOpt's output within fp32 summation order; the fused q/k/v and gate/up
  keep each part's weight scale on its rows (runner.model.quant.fp8_tensor), as ModelOpt's modules do;
- greedy decoding: the runner's tokens are ModelOpt's until a step where ModelOpt's two best logits are within
  the bound of a flipped activation code (a static scale, but the inputs of two fp32 forwards differ in their
  last bits: now and then one activation lands on the neighbouring E4M3 code)."""

from __future__ import annotations

import pytest
import torch

from runner.model import load_model
from suites.runner.conftest import one_thread
from suites.runner.producers import FLIP_BOUND, check_greedy, check_outputs, pairs, save_base_model

ORDER_BOUND = 1e-5  # fp32 summation order: 1.7e-7 measured


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """(ModelOpt's quantized transformers model, the runner's model of the checkpoint ModelOpt exported)."""
    mtq = pytest.importorskip("modelopt.torch.quantization")
    from modelopt.torch.export import export_hf_checkpoint
    from transformers import LlamaForCausalLM

    folder = tmp_path_factory.mktemp("modelopt")
    base = save_base_model(folder)

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
    return models[0], ours


def test_the_layers_are_static_fp8_and_the_head_is_excluded(exported):
    assert {(layer.scheme.name, layer.scheme.static_input) for layer, _ in pairs(*exported)} == {("fp8", True)}
    assert exported[1].lm_head.scheme.name == "unquantized"


def test_each_layer_returns_modelopts_output(exported):
    fused = [[float(p.weight_quantizer.amax) for p in parts] for _, parts in pairs(*exported) if len(parts) > 1]
    assert all(len(set(amax)) > 1 for amax in fused)  # the parts' scales differ: one scale per layer would not do
    check_outputs(pairs(*exported), rtol=ORDER_BOUND)


def test_greedy_decoding_follows_modelopt(exported):
    check_greedy(*exported, bound=FLIP_BOUND)
