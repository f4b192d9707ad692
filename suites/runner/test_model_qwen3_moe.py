"""A Qwen3-MoE-architecture model in the runner against transformers' own Qwen3MoeForCausalLM: a tiny config with
random weights, saved by transformers and loaded by the runner from that directory; greedy tokens equal and
first-step logits close, fp32 on the CPU. The config exercises what Qwen3-MoE adds to Mixtral: per-head q/k
RMSNorm, the experts' own intermediate size, a dense layer among sparse ones (mlp_only_layers), and top-k
weights with and without renormalization (norm_topk_prob). Also: the dummy format builds the same names."""

from __future__ import annotations

import pytest
import torch

from kernels.tolerances import assert_agree, families
from runner.model import load_model
from runner.model.config import LlamaConfig
from runner.model.llama import LlamaMLP
from runner.model.moe import SparseMoE
from runner.model.weights import dummy_weights
from suites.runner.hf_moe import NEW_TOKENS, PROMPTS, hf_greedy, save_tiny
from suites.runner.model_driver import greedy

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module", params=[True, False], ids=["norm_topk", "raw_topk"])
def checkpoint(request, tmp_path_factory):
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    config = Qwen3MoeConfig(
        vocab_size=96, hidden_size=64, intermediate_size=80, moe_intermediate_size=48, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=8, num_experts_per_tok=2,
        max_position_embeddings=128, decoder_sparse_step=1, mlp_only_layers=[1], norm_topk_prob=request.param,
        rms_norm_eps=1e-6, tie_word_embeddings=False,
    )  # fmt: skip
    return save_tiny(Qwen3MoeForCausalLM, config, tmp_path_factory.mktemp("qwen3_moe"))


def test_greedy_tokens_and_logits_equal_transformers(checkpoint):
    path, hf = checkpoint
    model, _, config = load_model(str(path), dtype=torch.float32, device="cpu", tokenizer=False)
    layers = model.model.layers
    assert config.qk_norm and config.norm_topk_prob == hf.config.norm_topk_prob
    assert [type(layer.mlp) for layer in layers] == [SparseMoE, LlamaMLP, SparseMoE]
    assert layers[0].mlp.inter == 48 and layers[1].mlp.down_proj.in_features == 80
    tokens, logits = greedy(model, PROMPTS, NEW_TOKENS)
    for prompt, got, got_logits in zip(PROMPTS, tokens, logits, strict=True):
        want, want_logits = hf_greedy(hf, prompt)
        assert got == want
        assert_agree(families.LLAMA_VS_HF, got_logits, want_logits, "first-step logits")


def test_the_engine_serves_it(checkpoint):
    from runner import LLM, SamplingParams

    path, hf = checkpoint
    llm = LLM(str(path), device="cpu")
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True), use_tqdm=False)
    assert [o.token_ids for o in outs] == [hf_greedy(hf, p)[0] for p in PROMPTS]


def test_dummy_weights_name_every_parameter(checkpoint):
    """The dummy format's names for this config are exactly the checkpoint's (both load without a gap)."""
    import json

    from safetensors.torch import load_file

    path, _ = checkpoint
    config = LlamaConfig.from_hf(json.loads((path / "config.json").read_text()))
    saved = load_file(str(path / "model.safetensors"))
    made = dict(dummy_weights(config))
    assert sorted(made) == sorted(saved)
    assert all(made[k].shape == saved[k].shape for k in saved)


def test_negative_control_renormalization_flipped_is_caught(checkpoint):
    """The parity check sees the routing convention: the same model with norm_topk_prob flipped in every sparse
    layer disagrees with transformers' first-step logits."""
    path, hf = checkpoint
    model, _, _ = load_model(str(path), dtype=torch.float32, device="cpu", tokenizer=False)
    for layer in model.model.layers:
        if isinstance(layer.mlp, SparseMoE):
            layer.mlp.renormalize = not layer.mlp.renormalize
    _, logits = greedy(model, PROMPTS, NEW_TOKENS)
    with pytest.raises(AssertionError):
        for prompt, got_logits in zip(PROMPTS, logits, strict=True):
            assert_agree(families.LLAMA_VS_HF, got_logits, hf_greedy(hf, prompt)[1], "first-step logits")
