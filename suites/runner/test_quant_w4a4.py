"""W4A4 FP4 checkpoint layers (runner.model.quant.fp4_w4a4) on their kernel branch: the activation's fake
quantization through the Triton quantize and dequantize kernels is the references' (the Triton interpreter runs
them on this tier), and on the GPU a W4A4 model decodes through CUDA graphs to the tokens it decodes eagerly.
The producers' checkpoints against their own fake-quantized models: test_quant_llmcompressor.py (MXFP4, NVFP4),
test_quant_quark_export.py (MXFP4), test_quant_checkpoints.py (ModelOpt NVFP4 by the format's description)."""

from __future__ import annotations

import pytest
import torch

from kernels.tolerances import assert_exact
from reference.quant.mxfp4 import quantize_mxfp4
from reference.quant.nvfp4 import quantize_nvfp4
from reference.quant.nvfp4_global_scale import DecodeScale, EncodeScale, tensor_amax
from runner.model.llama import LlamaForCausalLM
from runner.model.quant import fp4_w4a4
from runner.model.quant.config import QuantConfig
from runner.model.weights import dummy_weights
from suites.runner.model_driver import eager_and_graph_tokens, greedy

pytestmark = pytest.mark.filterwarnings("ignore::reference.quant.nvfp4_fused_w13.W13ScaleMismatchWarning")
SCHEMES = ("mxfp4_w4a4", "nvfp4_w4a4")
PROMPTS = [[5, 17, 33, 2, 9, 41], [60, 3, 3, 71]]


def _activation(dtype: torch.dtype) -> torch.Tensor:
    """[5, 64]: rows five decades apart, an outlier, a zero block and a negative zero."""
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(5, 64, generator=gen) * torch.logspace(-3, 2, 5).reshape(-1, 1)
    x[1, 7], x[2, :32], x[3, 40] = 900.0, 0.0, -0.0
    return x.to(dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize(
    ("fake_quantize", "argument"),
    [
        (fp4_w4a4.fake_quantize_mxfp4, "even"),
        (fp4_w4a4.fake_quantize_mxfp4, "floor"),
        (fp4_w4a4.fake_quantize_nvfp4, EncodeScale(2688.0 / 900.0)),
        (fp4_w4a4.fake_quantize_nvfp4, DecodeScale(900.0 / 2688.0)),
    ],
    ids=["mxfp4_even", "mxfp4_floor", "nvfp4_encode", "nvfp4_decode"],
)
def test_the_kernel_branch_gives_the_references_bytes(monkeypatch, fake_quantize, argument, dtype, device):
    x = _activation(dtype)
    want = fake_quantize(x, argument)  # the references' branch: a CPU tensor
    monkeypatch.setattr(fp4_w4a4, "uses_kernels", lambda x: True)
    if isinstance(argument, (EncodeScale, DecodeScale)):
        argument = type(argument)(argument.value.to(device))
    got = fake_quantize(x.to(device), argument).cpu()
    assert_exact(got, want, "fake-quantized activation")
    assert got.dtype == dtype and not torch.equal(got, x)  # something was quantized


def _checkpoint(config, scheme: str):
    """The seeded dummy weights with every decoder linear weight in `scheme`'s checkpoint tensors (ModelOpt's
    names and decode global scales for NVFP4; an input scale of amax 8 for every layer)."""
    for name, w in dummy_weights(config, seed=0):
        if w.dim() != 2 or ".layers." not in name:
            yield name, w
            continue
        base = name.removesuffix(".weight")
        if scheme == "mxfp4_w4a4":
            codes, scales = quantize_mxfp4(w, scale_mode="even")
            yield from ((f"{base}.weight", codes), (f"{base}.weight_scale", scales))
            continue
        scale = DecodeScale.from_amax(tensor_amax(w))
        codes, scales = quantize_nvfp4(w, scale)
        yield from ((f"{base}.weight", codes), (f"{base}.weight_scale", scales.view(torch.float8_e4m3fn)))
        yield from ((f"{base}.weight_scale_2", scale.value), (f"{base}.input_scale", torch.tensor(8.0 / 2688)))


def w4a4_model(config, scheme: str, device, dtype: torch.dtype) -> LlamaForCausalLM:
    quant = QuantConfig("test", lambda layer: None if layer == "lm_head" else scheme)
    model = LlamaForCausalLM(config, dtype, device, quant)
    model.load_weights(_checkpoint(config, scheme))
    return model.eval()


@pytest.mark.parametrize("scheme", SCHEMES)
def test_a_w4a4_model_is_its_w4a16_model_with_fake_quantized_inputs(scheme):
    """fp32 on the CPU: the W4A4 model's logits differ from those of the same weights run W4A16 (the activation
    quantization is applied), and equal them when every layer's fake quantization is the identity."""
    from suites.runner import tiny_llama

    config = tiny_llama.ALIGNED_128
    model = w4a4_model(config, scheme, "cpu", torch.float32)
    _, logits = greedy(model, PROMPTS, 1)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(fp4_w4a4, f"fake_quantize_{scheme[:5]}", lambda x, _: x)
        _, weight_only = greedy(model, PROMPTS, 1)
    assert not torch.equal(logits, weight_only)
    plain = QuantConfig("test", lambda layer: None if layer == "lm_head" else scheme[:5])
    w4a16 = LlamaForCausalLM(config, torch.float32, "cpu", plain)
    names = {"mxfp4_w4a4": (), "nvfp4_w4a4": ("input_scale",)}[scheme]
    w4a16.load_weights((n, t) for n, t in _checkpoint(config, scheme) if n.rpartition(".")[2] not in names)
    assert_exact(greedy(w4a16.eval(), PROMPTS, 1)[1], weight_only, "weight-only logits")


@pytest.mark.gpu_only(reason="runs the FP4 quantize, dequantize and W4A16 kernels, eagerly and through CUDA graphs")
@pytest.mark.parametrize("scheme", SCHEMES)
def test_gpu_graph_decode_gives_the_eager_tokens(device, scheme):
    from suites.runner import tiny_llama

    config = tiny_llama.SMALL_GPU
    tokens = eager_and_graph_tokens(w4a4_model(config, scheme, device, torch.bfloat16), config, device, PROMPTS * 3)
    assert tokens[True] == tokens[False]
