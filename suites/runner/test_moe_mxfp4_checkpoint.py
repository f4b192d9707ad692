"""An MXFP4 MoE checkpoint in the runner: AMD Quark's W4A16 layout for every expert matrix (`weight` uint8 E2M1 pairs
[N, K / 2], `weight_scale` E8M0 [N, K / 32]; attention, routers and head left out through `exclude`), written by
Quark's published layout from a tiny transformers Mixtral (Quark's quantizer does not take transformers 5's fused
expert modules on the CPU tier) with the reference quantizer in Quark's "even" scale mode. Oracle: transformers'
own MixtralForCausalLM on the same checkpoint with each expert matrix replaced by its decoded values: greedy tokens
equal, first-step logits within the runner-against-transformers row; transformers on the unquantized experts
instead disagrees (the negative control). Also: -0 codes are stored as +0; refused by name: an E8M0 0xFF scale,
an intermediate size off the 32-wide block, W4A4 experts."""

from __future__ import annotations

import json

import pytest
import torch

from kernels.tolerances import assert_agree, families
from reference.formats.nibbles import unpack_nibbles
from reference.quant.mxfp4 import dequantize_mxfp4, quantize_mxfp4
from runner.model import load_model
from suites.runner.hf_moe import NEW_TOKENS, PROMPTS, hf_greedy, save_tiny
from suites.runner.model_driver import greedy

transformers = pytest.importorskip("transformers")
EXPERTS = 4
MX = {"dtype": "fp4", "qscheme": "per_group", "group_size": 32, "scale_format": "e8m0", "ch_axis": -1}
QUARK = {
    "quant_method": "quark",
    "global_quant_config": {"weight": MX, "input_tensors": None, "output_tensors": None},
    "layer_quant_config": {},
    "exclude": ["lm_head", "*self_attn*", "*block_sparse_moe.gate"],
}


def _tiny(path, inter: int = 64):
    from transformers import MixtralConfig, MixtralForCausalLM

    config = MixtralConfig(
        vocab_size=96, hidden_size=64, intermediate_size=inter, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, num_local_experts=EXPERTS, num_experts_per_tok=2, max_position_embeddings=128,
        rms_norm_eps=1e-5, tie_word_embeddings=False, eos_token_id=None,  # transformers' generate runs all the steps
    )  # fmt: skip
    return save_tiny(MixtralForCausalLM, config, path)[0]


def _write(source, target, quantization=QUARK, edit=None, quantize: bool = True):
    """`source`'s checkpoint with every expert matrix as MXFP4 codes and scales (reference quantizer, "even"; left
    as it is where not `quantize`), and `quantization` as its config; `edit(tensors)` may change tensors before
    they are saved."""
    from safetensors.torch import load_file, save_file

    tensors = {}
    for name, t in load_file(str(source / "model.safetensors")).items():
        if ".experts." in name and quantize:
            tensors[name], tensors[name.replace(".weight", ".weight_scale")] = quantize_mxfp4(t, scale_mode="even")
        else:
            tensors[name] = t
    if edit is not None:
        edit(tensors)
    target.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(target / "model.safetensors"))
    config = json.loads((source / "config.json").read_text())
    config["quantization_config"] = quantization
    (target / "config.json").write_text(json.dumps(config))
    return target, tensors


def _decoded(source, target, tensors, experts: bool = True):
    """The unquantized checkpoint with each expert matrix replaced by its decoded values (`experts`), or left as it
    was (the negative control's oracle)."""
    from safetensors.torch import load_file, save_file

    plain = load_file(str(source / "model.safetensors"))
    if experts:
        for name in plain:
            if ".experts." in name:
                scales = tensors[name.replace(".weight", ".weight_scale")]
                plain[name] = dequantize_mxfp4(tensors[name], scales, dtype=torch.float32)
    target.mkdir(parents=True, exist_ok=True)
    save_file(plain, str(target / "model.safetensors"))
    (target / "config.json").write_text((source / "config.json").read_text())
    return target


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    source = _tiny(tmp_path_factory.mktemp("mixtral"))
    path, tensors = _write(source, tmp_path_factory.mktemp("mixtral_mxfp4"))
    return source, path, tensors


def _run(path):
    model, _, _ = load_model(str(path), dtype=torch.float32, device="cpu", tokenizer=False)
    return model, greedy(model, PROMPTS, NEW_TOKENS)


def _transformers(path):
    from transformers import MixtralForCausalLM

    return MixtralForCausalLM.from_pretrained(str(path)).float().eval()


def _agrees_with_transformers(logits, tokens, hf) -> None:
    for prompt, got, got_logits in zip(PROMPTS, tokens, logits, strict=True):
        want, want_logits = hf_greedy(hf, prompt)
        assert_agree(families.LLAMA_VS_HF, got_logits, want_logits, "first-step logits")
        assert got == want


def test_mxfp4_experts_equal_transformers_on_the_decoded_experts(checkpoints, tmp_path):
    source, path, tensors = checkpoints
    model, (tokens, logits) = _run(path)
    moe = model.model.layers[0].block_sparse_moe
    assert moe.checkpoint == "mxfp4" and moe.expert_layout == "interchange" and not hasattr(moe, "w13")
    assert moe.w13_codes.shape == (EXPERTS, 128, 32) and moe.w2_scales.shape == (EXPERTS, 64, 2)
    assert model.model.layers[0].self_attn.qkv_proj.scheme.name == "unquantized"
    _agrees_with_transformers(logits, tokens, _transformers(_decoded(source, tmp_path / "decoded", tensors)))


def test_negative_control_unquantized_experts_are_caught(checkpoints, tmp_path):
    source, path, tensors = checkpoints
    _, (tokens, logits) = _run(path)
    with pytest.raises(AssertionError):
        _agrees_with_transformers(logits, tokens, _transformers(_decoded(source, tmp_path / "plain", tensors, False)))


def test_negative_zero_codes_are_stored_as_positive_zero(checkpoints):
    _, path, tensors = checkpoints
    nibbles = unpack_nibbles(tensors["model.layers.0.block_sparse_moe.experts.0.w1.weight"])
    assert (nibbles == 0x8).any(), "the checkpoint holds -0 codes (else this test is moot)"
    model, _, _ = load_model(str(path), dtype=torch.float32, device="cpu", tokenizer=False)
    assert not (unpack_nibbles(model.model.layers[0].block_sparse_moe.w13_codes) == 0x8).any()


def test_a_nan_scale_is_refused(checkpoints, tmp_path):
    source, _, _ = checkpoints

    def nan_scale(tensors):
        tensors["model.layers.1.block_sparse_moe.experts.2.w2.weight_scale"][3, 1] = 0xFF

    path, _ = _write(source, tmp_path / "nan", edit=nan_scale)
    with pytest.raises(
        ValueError, match=r"layers.1.block_sparse_moe.*w2_weight_scale: E8M0 0xFF \(NaN\) at \[2, 3, 1\]"
    ):
        load_model(str(path), dtype=torch.float32, device="cpu", tokenizer=False)


def test_an_intermediate_size_off_the_block_is_refused(tmp_path):
    source = _tiny(tmp_path / "odd", inter=48)
    path, _ = _write(source, tmp_path / "odd_mxfp4", quantize=False)  # refused before any tensor is read
    with pytest.raises(ValueError, match="intermediate size a multiple of 32, got 48"):
        load_model(str(path), dtype=torch.float32, device="cpu", tokenizer=False)


def test_w4a4_experts_are_refused(checkpoints, tmp_path):
    source, _, _ = checkpoints
    inputs = {**MX, "is_dynamic": True, "scale_calculation_mode": "even"}
    w4a4 = {**QUARK, "global_quant_config": {**QUARK["global_quant_config"], "input_tensors": inputs}}
    path, _ = _write(source, tmp_path / "w4a4", quantization=w4a4)
    with pytest.raises(ValueError, match="mxfp4_w4a4 MoE experts in a checkpoint are not implemented"):
        load_model(str(path), dtype=torch.float32, device="cpu", tokenizer=False)
