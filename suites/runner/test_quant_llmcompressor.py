"""Checkpoints made by llm-compressor itself, loaded by the runner. A tiny transformers Llama goes through the
library's `oneshot` with its data-free FP8 presets (on the CPU): FP8_DYNAMIC (E4M3 weights with a scale per output
row, activations quantized per token at run time: the runner's fp8_channel) and FP8_BLOCK (128 x 128 weight tiles,
1 x 128 activation groups: fp8_block); the library saves the checkpoint compressed (E4M3 codes and `weight_scale`).

The oracle is the producer's own fake-quantized model, the one `oneshot` leaves in memory, run in transformers:
- every linear weight the runner holds, dequantized, is the producer's fake-quantized weight, bit for bit;
- each quantized layer, given one input, returns what the producer's modules return (the fused q/k/v and gate/up
  layers: their parts' outputs side by side), within fp32 summation order;
- greedy decoding: the runner's tokens are the producer's until a step where the producer's two best logits are
  within the bound below (dynamic activation quantization turns the last-bit differences of two fp32 forwards
  into a different E4M3 code now and then: one activation moves by an E4M3 step), and the first step's logits
  agree within that bound."""

from __future__ import annotations

import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from kernels.tolerances import assert_exact
from runner.model import load_model
from suites.runner.conftest import one_thread
from suites.runner.producers import check_greedy, check_outputs, pairs, save_base_model

# First-step logits against the producer's, as a fraction of the largest: 5.0e-2 was the worst of 24 models (12
# seeds x both presets, every position of two 10-12 token sequences, teacher-forced); a model without a flipped
# activation code agrees within 2.5e-5 (fp32 order).
FLIP_BOUND = 0.1


@pytest.fixture(scope="module", params=["FP8_DYNAMIC", "FP8_BLOCK"])
def produced(request, tmp_path_factory):
    """(preset, the producer's fake-quantized transformers model, the runner's model of its saved checkpoint, the
    checkpoint's folder)."""
    pytest.importorskip("llmcompressor")
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier
    from transformers import LlamaForCausalLM

    preset, folder = request.param, tmp_path_factory.mktemp("llmcompressor")
    base = save_base_model(folder)
    with one_thread():
        # Twice: saving compresses the model in place (its weights become the codes), so the oracle is a second
        # run of the same data-free recipe (min-max scales: the same every run).
        quantized = []
        for _ in range(2):
            model = LlamaForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
            oneshot(model=model, recipe=QuantizationModifier(targets="Linear", scheme=preset, ignore=["lm_head"]))
            quantized.append(model)
        quantized[1].save_pretrained(folder / preset, save_compressed=True)
        ours = load_model(str(folder / preset), dtype=torch.float32, device="cpu", tokenizer=False)[0]
    return preset, quantized[0], ours, folder / preset


def _producer_weight(module) -> torch.Tensor:
    from compressed_tensors.quantization.lifecycle.forward import forward_quantize

    return forward_quantize(module, module.weight.data, "weight", module.quantization_scheme.weights)


def _runner_weight(layer) -> torch.Tensor:
    codes = layer.weight_fp8.to(torch.float32)[:, : layer.in_features]
    if layer.scheme.name == "fp8_channel":
        return codes * layer.weight_scale.reshape(-1, 1)
    tiles = layer.weight_scale_inv.repeat_interleave(128, 0).repeat_interleave(128, 1)
    return codes * tiles[: codes.shape[0], : codes.shape[1]]


def _pairs(produced):
    return pairs(produced[1], produced[2])


def test_the_layers_take_the_presets_scheme(produced):
    preset, _, ours, _ = produced
    want = {"FP8_DYNAMIC": "fp8_channel", "FP8_BLOCK": "fp8_block"}[preset]
    assert {layer.scheme.name for layer, _ in _pairs(produced)} == {want}
    assert ours.lm_head.scheme.name == "unquantized"  # the recipe's ignore list


def _check_weights(layer_pairs) -> None:
    for layer, parts in layer_pairs:
        want = torch.cat([_producer_weight(p) for p in parts])
        assert_exact(_runner_weight(layer), want, f"{layer.scheme.name} weight")


def test_weights_are_the_producers_fake_quantized_weights(produced):
    _check_weights(_pairs(produced))


def test_each_layer_returns_the_producers_output(produced):
    check_outputs(_pairs(produced))


def test_a_scale_read_from_the_neighbouring_row_or_tile_is_caught(produced):
    """Negative control: the runner's scales rolled by one output row (fp8_channel) or one 128-row tile
    (fp8_block), in one layer: both checks above fail."""
    layer, parts = next(_pairs(produced))
    name = "weight_scale" if layer.scheme.name == "fp8_channel" else "weight_scale_inv"
    good = getattr(layer, name)
    setattr(layer, name, good.roll(1, dims=-1 if layer.scheme.name == "fp8_channel" else 0))
    try:
        with pytest.raises(AssertionError):
            _check_weights([(layer, parts)])
        with pytest.raises(AssertionError):
            check_outputs([(layer, parts)])
    finally:
        setattr(layer, name, good)


def test_greedy_decoding_follows_the_producer(produced):
    check_greedy(produced[1], produced[2], FLIP_BOUND)


L0, L1 = "model.layers.0.", "model.layers.1."


def _zero_first(tensors, name):
    tensors[name].view(-1)[0] = 0.0


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda t: t.__setitem__(
                L0 + "self_attn.k_proj.weight_scale", t[L0 + "self_attn.k_proj.weight_scale"].flatten()
            ),
            r"'model.layers.0.self_attn.k_proj.weight_scale': shard 'k' must be \[",
        ),
        (
            lambda t: _zero_first(t, L1 + "mlp.up_proj.weight_scale"),
            r"layer 'model.layers.1.mlp.gate_up_proj': weight_scale: must be finite and > 0, got 0.0",
        ),
        (lambda t: t.pop(L0 + "self_attn.v_proj.weight_scale"), r"qkv_proj.weight_scale \(shard 'v'\)"),
        (
            lambda t: t.__setitem__(L1 + "mlp.down_proj.weight", t[L1 + "mlp.down_proj.weight"].float()),
            r"'model.layers.1.mlp.down_proj.weight'.*must be torch.float8_e4m3fn",
        ),
    ],
    ids=["scale_shape", "zero_scale", "missing_scale", "codes_dtype"],
)
def test_a_bad_tensor_is_refused_by_name(produced, tmp_path, edit, message):
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
    from runner.model.quant import fp8_channel, make_scheme

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
    monkeypatch.setattr(fp8_channel, "uses_kernels", lambda x: True)
    got = layer(x).float()
    step = 2.0 ** (torch.frexp(plain)[1].float() - 8)  # one bf16 step at each value
    assert bool(((got - plain).abs() <= step).all())
    assert not torch.equal(plain, torch.zeros_like(plain))
