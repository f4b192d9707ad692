"""transformers as the peer engine: continuous batching (`generate_batch`, paged|sdpa) on CUDA, plain
`generate` on CPU. transformers 5.17 names the cache `ContinuousBatchingConfig.block_size` and the attention
`paged|sdpa`; without flash-attn, and with no network for the kernels hub, sdpa is the usable choice."""

from __future__ import annotations

import time

import torch

# Field names of runner.model's config -> transformers LlamaConfig keyword.
HF_FIELDS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "rms_norm_eps",
    "rope_theta",
    "tie_word_embeddings",
    "max_position_embeddings",
)


def hf_llama_config(config):
    """A transformers config of the same shape as the runner's config (random weights for the peer): LlamaConfig,
    or for a MoE model its own architecture's (MixtralConfig, Qwen3MoeConfig) with the experts' fields."""
    import transformers

    fields = {name: getattr(config, name) for name in HF_FIELDS if hasattr(config, name)}
    model_type = getattr(config, "model_type", "llama")
    if model_type != "llama":
        fields.update(num_experts_per_tok=config.num_experts_per_tok)
    if model_type == "qwen3_moe":
        fields.update(
            num_experts=config.num_local_experts,
            moe_intermediate_size=config.expert_intermediate_size,
            norm_topk_prob=config.norm_topk_prob,
            decoder_sparse_step=config.decoder_sparse_step,
            mlp_only_layers=list(config.mlp_only_layers),
            head_dim=config.head_dim,
        )
    elif model_type == "mixtral":
        fields.update(num_local_experts=config.num_local_experts, head_dim=config.head_dim)
    kind = {"qwen3_moe": "Qwen3MoeConfig", "mixtral": "MixtralConfig"}.get(model_type, "LlamaConfig")
    hf = getattr(transformers, kind)(**fields, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    if "rope_theta" in fields:  # 5.x keeps RoPE settings in rope_parameters
        hf.rope_parameters = {"rope_type": "default", "rope_theta": fields["rope_theta"]}
    return hf


def dummy_model(config, dtype: torch.dtype, device: str, paged: bool = True):
    """Randomly initialised transformers model of `config`'s shape; paged|sdpa attention for continuous
    batching (it refuses a plain forward), else sdpa."""
    from transformers import AutoModelForCausalLM

    with torch.device(device):
        model = AutoModelForCausalLM.from_config(hf_llama_config(config), attn_implementation="sdpa", dtype=dtype)
    if paged:
        model.set_attn_implementation("paged|sdpa")
    return model.eval()


def gguf_model(path: str, dtype: torch.dtype = torch.float32):
    """The GGUF checkpoint through transformers' own GGUF loader (dequantized at load), sdpa attention."""
    import pathlib

    from transformers import AutoModelForCausalLM

    file = pathlib.Path(path)
    return AutoModelForCausalLM.from_pretrained(
        str(file.parent), gguf_file=file.name, dtype=dtype, attn_implementation="sdpa"
    ).eval()


def generate_batch(
    model,
    prompts: list[list[int]],
    output_len: int,
    block_size: int = 256,
    num_blocks: int | None = None,
    max_batch_tokens: int | None = None,
) -> dict:
    """Greedy continuous batching, every request exactly `output_len` tokens (eos disabled with -1).
    Returns tokens, wall seconds of the whole call (it includes HF's own warm-up: graph capture), and the
    request span (first request created -> last finished), which excludes that warm-up. `num_blocks` and
    `max_batch_tokens` None: HF sizes them from free GPU memory (on CPU they must be given)."""
    from transformers import ContinuousBatchingConfig, GenerationConfig

    gen = GenerationConfig(max_new_tokens=output_len, do_sample=False, eos_token_id=-1, pad_token_id=0)
    cb = ContinuousBatchingConfig(block_size=block_size, num_blocks=num_blocks, max_batch_tokens=max_batch_tokens)
    started = time.perf_counter()
    # No torch.inference_mode() here: HF runs the batching loop in its own thread, where the mode does not
    # carry over, and that loop updates its (then inference) tensors in place: every request failed with
    # "Inplace update to inference tensor outside InferenceMode" and 0 tokens came back. HF's loop runs under no_grad.
    out = model.generate_batch(prompts, generation_config=gen, continuous_batching_config=cb, max_new_tokens=output_len)
    wall = time.perf_counter() - started
    results = list(out.values())
    tokens = sum(len(r.generated_tokens) for r in results)
    span = max(r.lifespan[1] for r in results) - min(r.created_time for r in results) if results else wall
    errors = [r.error for r in results if r.error is not None]
    if not errors and tokens != len(prompts) * output_len:
        errors = [f"{tokens} tokens for {len(prompts)} requests x {output_len} (eos disabled: each must give all)"]
    return dict(tokens=tokens, wall=wall, span=span, errors=errors, token_ids=[r.generated_tokens for r in results])


def check(result: dict, impl: str) -> dict:
    """`result` unchanged if the peer produced every token; else RuntimeError naming the first error (a failed
    peer must never become a silent 0 tok/s row)."""
    if result["errors"]:
        raise RuntimeError(
            f"{impl}: {len(result['errors'])} request errors, {result['tokens']} tokens; first: {result['errors'][0]}"
        )
    return result


def generate_greedy(model, prompts: list[list[int]], output_len: int) -> dict:
    """Plain `generate`, one prompt at a time (no padding effects), greedy, eos disabled."""
    started = time.perf_counter()
    outs = []
    with torch.inference_mode():
        for prompt in prompts:
            ids = torch.tensor([prompt], device=model.device)
            seq = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=output_len,
                min_new_tokens=output_len,
                do_sample=False,
                pad_token_id=0,
            )
            outs.append(seq[0, len(prompt) :].tolist())
    wall = time.perf_counter() - started
    return dict(tokens=sum(map(len, outs)), wall=wall, span=wall, errors=[], token_ids=outs)
