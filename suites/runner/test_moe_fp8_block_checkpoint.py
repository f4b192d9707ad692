"""A block-FP8 MoE checkpoint in the runner: HF's fine-grained FP8 (`quant_method` "fp8", weight_block_size
[128, 128]: each expert matrix E4M3 with an fp32 `weight_scale_inv` per 128 x 128 tile; attention, routers and head
left unquantized through `modules_to_not_convert`), written by the format's published description from a tiny
Qwen3-MoE made by transformers (no producer of block-FP8 MoE checkpoints runs on the CPU tier). Oracles: the loaded
experts hold the checkpoint's codes and scales, w1's (gate) rows then w3's (up); each sparse layer's output equals
`reference.moe.quantized.block_fp8_moe_mirror` on the checkpoint's tensors as the test assembles them (the CPU runs
that mirror; on a GPU the layer runs `kernels.block_fp8_moe`, within the mirror's lossy row), and the same
assembly with gate and up swapped is caught; the model's first-step logits track the unquantized model's at the
W8A8 loss. Refused by name: experts of mixed schemes, a hidden size off the 128-wide block, a quantized router."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from kernels.tolerances import assert_exact, assert_lossy, families, sqnr_db
from reference.moe.quantized import block_fp8_moe_ideal, block_fp8_moe_mirror
from reference.moe.routing import softmax_topk
from reference.quant.fp8 import quantize_fp8_blocks
from runner.model import load_model
from suites.runner.hf_moe import PROMPTS, save_tiny
from suites.runner.model_driver import greedy

transformers = pytest.importorskip("transformers")
EXPERTS, LAYERS = 4, 2
PARTS = ("gate_proj", "up_proj", "down_proj")
HF_FP8 = {"quant_method": "fp8", "weight_block_size": [128, 128], "activation_scheme": "dynamic"}


def _tiny(path, hidden: int = 128):
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    config = Qwen3MoeConfig(
        vocab_size=96, hidden_size=hidden, intermediate_size=128, moe_intermediate_size=128,
        num_hidden_layers=LAYERS, num_attention_heads=4, num_key_value_heads=2, head_dim=32, num_experts=EXPERTS,
        num_experts_per_tok=2, max_position_embeddings=128, decoder_sparse_step=1, mlp_only_layers=[],
        norm_topk_prob=True, rms_norm_eps=1e-6, tie_word_embeddings=False,
    )  # fmt: skip
    return save_tiny(Qwen3MoeForCausalLM, config, path)[0]


def _write_fp8(source, target, skip=("self_attn", "lm_head", "gate"), quantize=lambda name: ".experts." in name):
    """`source`'s checkpoint with every tensor `quantize` picks as E4M3 codes (`weight`) and tile scales
    (`weight_scale_inv`, the reference's `quantize_fp8_blocks`), config.json with HF's FP8 quantization_config."""
    from safetensors.torch import load_file, save_file

    tensors = {}
    for name, t in load_file(str(source / "model.safetensors")).items():
        if quantize(name):
            tensors[name], tensors[name.replace(".weight", ".weight_scale_inv")] = quantize_fp8_blocks(t)
        else:
            tensors[name] = t
    target.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(target / "model.safetensors"))
    config = json.loads((source / "config.json").read_text())
    config["quantization_config"] = {**HF_FP8, "modules_to_not_convert": list(skip)}
    (target / "config.json").write_text(json.dumps(config))
    return target, tensors


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    source = _tiny(tmp_path_factory.mktemp("qwen3_moe"))
    path, tensors = _write_fp8(source, tmp_path_factory.mktemp("qwen3_moe_fp8"))
    return source, path, tensors


def _load(path, device="cpu", dtype=torch.float32):
    return load_model(str(path), dtype=dtype, device=device, tokenizer=False)[0]


def _assembled(tensors, layer: int, swap: bool = False):
    """(w13, w13 scales, w2, w2 scales) of a layer's experts stacked from the checkpoint's tensors: gate rows then
    up rows (`swap`: up first, the planted bug)."""
    first, second = ("up_proj", "gate_proj") if swap else ("gate_proj", "up_proj")
    out = []
    for parts in ((first, second), ("down_proj",)):
        for suffix in ("weight", "weight_scale_inv"):
            out.append(
                torch.stack([
                    torch.cat([tensors[f"model.layers.{layer}.mlp.experts.{e}.{p}.{suffix}"] for p in parts])
                    for e in range(EXPERTS)
                ])
            )  # fmt: skip
    return out


def test_experts_hold_the_checkpoints_codes_and_scales(checkpoint):
    _, path, tensors = checkpoint
    model = _load(path)
    for i, layer in enumerate(model.model.layers):
        moe = layer.mlp
        assert moe.checkpoint == "fp8_block" and moe.scale_params == ("w13_weight_scale_inv", "w2_weight_scale_inv")
        w13, s13, w2, s2 = _assembled(tensors, i)
        assert_exact(moe.w13.view(torch.uint8), w13.view(torch.uint8), f"layer {i} w13 codes")
        assert_exact(moe.w13_weight_scale_inv, s13, f"layer {i} w13 scales")
        assert_exact(moe.w2.view(torch.uint8), w2.view(torch.uint8), f"layer {i} w2 codes")
        assert_exact(moe.w2_weight_scale_inv, s2, f"layer {i} w2 scales")
    assert model.model.layers[0].self_attn.qkv_proj.scheme.name == "unquantized"


@pytest.mark.parametrize("swap", [False, True], ids=["assembled", "negative_control_gate_up_swapped"])
def test_each_sparse_layer_is_the_mirror_of_the_checkpoint(checkpoint, swap):
    _, path, tensors = checkpoint
    model = _load(path)
    x = torch.randn(5, 128, generator=torch.Generator().manual_seed(1))
    for i, layer in enumerate(model.model.layers):
        moe = layer.mlp
        weights, ids = softmax_topk(F.linear(x, moe.gate.weight), 2, renormalize=True)
        want = block_fp8_moe_mirror(x, *_assembled(tensors, i, swap), weights, ids)
        if swap:
            assert not torch.equal(moe(x), want)
        else:
            assert_exact(moe(x), want, f"layer {i}")


def test_logits_track_the_unquantized_model(checkpoint):
    """The W8A8 experts' loss: first-step logits 28.9, 26.5 and 27.4 dB from the unquantized model's over the three
    prompts (measured on the CPU tier; a broken layer gives ~0 dB or less)."""
    source, path, _ = checkpoint
    _, quantized = greedy(_load(path), PROMPTS, 1)
    _, plain = greedy(_load(source), PROMPTS, 1)
    for got, want in zip(quantized, plain, strict=True):
        assert 20.0 < sqnr_db(got, want) < 45.0


@pytest.mark.gpu_only(reason="runs the experts as kernels.block_fp8_moe")
def test_gpu_layer_is_within_the_mirrors_row(checkpoint, device):
    _, path, tensors = checkpoint
    model = _load(path, device, torch.bfloat16)
    x = torch.randn(7, 128, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    for i, layer in enumerate(model.model.layers):
        moe = layer.mlp
        got = moe(x.to(device)).cpu()
        weights, ids = softmax_topk(F.linear(x, moe.gate.weight.cpu()), 2, renormalize=True)
        args = (x, *_assembled(tensors, i), weights, ids)
        assert_lossy(families.BLOCK_FP8_MOE, got, block_fp8_moe_mirror(*args), block_fp8_moe_ideal(*args), f"{i}")


def test_experts_of_mixed_schemes_are_refused(checkpoint, tmp_path):
    source, _, _ = checkpoint
    path, _ = _write_fp8(
        source, tmp_path / "mixed", skip=("self_attn", "lm_head", "gate", "model.layers.0.mlp.experts.3.down_proj")
    )
    with pytest.raises(ValueError, match=r"experts of 'model.layers.0.mlp' have different schemes.*unquantized"):
        _load(path)


def test_a_hidden_size_off_the_block_is_refused(tmp_path):
    source = _tiny(tmp_path / "small", hidden=96)
    path, _ = _write_fp8(source, tmp_path / "small_fp8", quantize=lambda name: False)
    with pytest.raises(ValueError, match="multiples of 128, got 96 and 128"):
        _load(path)


def test_a_quantized_router_is_refused(checkpoint, tmp_path):
    source, _, _ = checkpoint
    path, _ = _write_fp8(source, tmp_path / "router", quantize=lambda name: ".experts." in name or ".mlp.gate." in name)
    with pytest.raises(ValueError, match=r"router loads unquantized, got torch.float8_e4m3fn|weight_scale_inv"):
        _load(path)
