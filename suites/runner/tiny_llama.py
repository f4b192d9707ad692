"""The small Llama shapes the engine tests run, with seeded dummy weights: one definition for every suite."""

from __future__ import annotations

import dataclasses

import torch

from runner.model.config import LlamaConfig
from runner.model.llama import LlamaForCausalLM
from runner.model.weights import dummy_weights

# CPU: two layers of 64; a tied head puts almost all mass on the input token, an untied one spreads it (sampled
# and greedy tokens vary; ranks and top-k alternatives are exercised).
TINY_TIED = LlamaConfig(
    vocab_size=97,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    rope_theta=10_000.0,
    tie_word_embeddings=True,
    max_position_embeddings=256,
)
TINY = dataclasses.replace(TINY_TIED, tie_word_embeddings=False)
# Quantized checkpoints: every fused part on 128-row tiles (q 256, k and v 128, gate and up 384), so block-FP8
# scale tiles never straddle two parts.
ALIGNED_128 = dataclasses.replace(
    TINY, hidden_size=256, intermediate_size=384, num_attention_heads=4, num_key_value_heads=2, head_dim=64
)
# GPU: head_dim 64 and bf16, shapes the Triton kernels take.
SMALL_GPU = LlamaConfig(
    vocab_size=512,
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    rope_theta=10_000.0,
    tie_word_embeddings=False,
    max_position_embeddings=256,
)


def model(
    config: LlamaConfig,
    device="cpu",
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    quantization: str | None = None,
) -> LlamaForCausalLM:
    """The seeded dummy-weight model; `quantization` an online scheme applied as the weights load."""
    from runner.model.quant import online_config

    net = LlamaForCausalLM(config, dtype, device, online_config(quantization) if quantization else None)
    net.load_weights(dummy_weights(config, seed=seed, device=device, dtype=dtype))
    return net.eval()
