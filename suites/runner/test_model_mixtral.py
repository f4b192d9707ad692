"""A Mixtral-architecture model in the runner (runner.model.moe) against transformers' own MixtralForCausalLM:
a tiny config with random weights, saved by transformers and loaded by the runner from that directory; greedy
tokens equal and first-step logits close, fp32 on the CPU (the experts through reference.moe's mirror). Also:
a checkpoint missing one expert's matrix, or with an expert the config does not have, is refused by name."""

from __future__ import annotations

import pytest
import torch

from kernels.tolerances import assert_agree, families
from runner.model import load_model
from suites.runner.hf_moe import NEW_TOKENS, PROMPTS, hf_greedy, save_tiny
from suites.runner.model_driver import greedy

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from transformers import MixtralConfig, MixtralForCausalLM

    config = MixtralConfig(
        vocab_size=96, hidden_size=64, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, num_local_experts=8, num_experts_per_tok=2, max_position_embeddings=128,
        rms_norm_eps=1e-5, tie_word_embeddings=False,
    )  # fmt: skip
    return save_tiny(MixtralForCausalLM, config, tmp_path_factory.mktemp("mixtral"))


def test_greedy_tokens_and_logits_equal_transformers(checkpoint):
    path, hf = checkpoint
    model, _, config = load_model(str(path), dtype=torch.float32, device="cpu", tokenizer=False)
    assert config.num_local_experts == 8 and model.model.layers[0].block_sparse_moe.top_k == 2
    tokens, logits = greedy(model, PROMPTS, NEW_TOKENS)
    for prompt, got, got_logits in zip(PROMPTS, tokens, logits, strict=True):
        want, want_logits = hf_greedy(hf, prompt)
        assert got == want
        assert_agree(families.LLAMA_VS_HF, got_logits, want_logits, "first-step logits")


def test_a_missing_or_extra_expert_is_refused_by_name(checkpoint, tmp_path):
    import shutil

    from safetensors.torch import load_file, save_file

    path, _ = checkpoint
    tensors = load_file(str(path / "model.safetensors"))
    shutil.copy(path / "config.json", tmp_path / "config.json")
    missing = {k: v for k, v in tensors.items() if k != "model.layers.1.block_sparse_moe.experts.3.w3.weight"}
    save_file(missing, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"block_sparse_moe.w13 \(shard \(3, 'w3'\)\)"):
        load_model(str(tmp_path), dtype=torch.float32, device="cpu", tokenizer=False)
    extra = {**tensors, "model.layers.0.block_sparse_moe.experts.8.w1.weight": torch.zeros(48, 64)}
    save_file(extra, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"experts.8.w1.weight.*expert 8 does not exist"):
        load_model(str(tmp_path), dtype=torch.float32, device="cpu", tokenizer=False)


def test_the_engine_serves_it(checkpoint):
    """`LLM` on the directory (scheduler, paged cache, sampler): the same greedy tokens as transformers."""
    from runner import LLM, SamplingParams

    path, hf = checkpoint
    llm = LLM(str(path), device="cpu")
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True), use_tqdm=False)
    assert [o.token_ids for o in outs] == [hf_greedy(hf, p)[0] for p in PROMPTS]


@pytest.mark.gpu_only(reason="runs the experts as kernels.fused_moe inside captured decode graphs")
def test_cuda_graphs_and_eager_agree_in_bf16(checkpoint):
    """bf16 on CUDA: the engine with decode CUDA graphs (the fused MoE kernel captured) gives the eager engine's
    greedy tokens, and both stay within greedy reach of the fp32 CPU tokens for the first step."""
    from runner import LLM, SamplingParams

    path, hf = checkpoint
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
    runs = [
        [o.token_ids for o in LLM(str(path), device="cuda", dtype=torch.bfloat16, enforce_eager=eager).generate(
            PROMPTS, params, use_tqdm=False)]
        for eager in (True, False)
    ]  # fmt: skip
    assert runs[0] == runs[1]
    assert [tokens[0] for tokens in runs[0]] == [hf_greedy(hf, p)[0][0] for p in PROMPTS]
