"""An FP8 checkpoint made by NVIDIA ModelOpt itself, loaded by the runner. A tiny transformers Llama goes through
`modelopt.torch.quantization.quantize` with FP8_DEFAULT_CFG (E4M3 weights and inputs, one static scale each,
calibrated on one sequence; on the CPU) and `export_hf_checkpoint`; the runner loads it as per-tensor FP8 with
static input scales. (ModelOpt's NVFP4 calibration asserts a CUDA tensor, so its NVFP4 export cannot run on this
tier; test_quant_checkpoints.py writes one by the format's description.)

The oracle is ModelOpt's quantized model in memory, run in transformers, layer by layer on one input:
- o_proj and down_proj (one checkpoint part each) return ModelOpt's output within fp32 summation order;
- the fused q/k/v and gate/up layers re-encode their parts onto the largest part's weight scale, as vLLM does
  (runner.model.quant.fp8_tensor), where ModelOpt's model keeps a scale per part: they agree within that
  re-encoding's error, 2.5e-2 of the largest output at most here (each re-encoded code moves by at most half an
  E4M3 step)."""

from __future__ import annotations

import pytest
import torch

from runner.model import load_model
from suites.runner.conftest import one_thread
from suites.runner.producers import check_outputs, pairs, save_base_model

ORDER_BOUND = 1e-5  # fp32 summation order: 1.7e-7 measured
REENCODED_BOUND = 5e-2  # the fused layers' re-encoding onto the largest scale: 2.5e-2 measured


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


def test_single_part_layers_return_modelopts_output(exported):
    check_outputs([(layer, parts) for layer, parts in pairs(*exported) if len(parts) == 1], rtol=ORDER_BOUND)


def test_fused_layers_return_modelopts_output_within_the_re_encoding(exported):
    fused = [(layer, parts) for layer, parts in pairs(*exported) if len(parts) > 1]
    scales = [[float(p.weight_quantizer.amax) for p in parts] for _, parts in fused]
    assert all(len(set(s)) > 1 for s in scales)  # the parts' scales differ: the re-encoding runs
    check_outputs(fused, rtol=REENCODED_BOUND)
