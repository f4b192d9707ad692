"""What the suites that load producers' own checkpoints share: a tiny transformers Llama (the model a producer
quantizes), the pairing of the runner's fused layers with the producer's modules, and the checks against the
producer's fake-quantized model (each layer's output on one input; greedy decoding)."""

from __future__ import annotations

import pathlib

import torch

from suites.runner.conftest import one_thread
from suites.runner.model_driver import greedy

PROMPTS = [[5, 17, 33, 2, 9, 41], [60, 3, 3, 71], [11, 12, 13, 14, 15, 16, 17, 18, 19]]
# First-step logits against the producer's, as a fraction of the largest, where activations are quantized at run
# time (`check_greedy`'s bound): two fp32 forwards differ in their last bits, and now and then one activation lands
# on the neighbouring code. Measured with llm-compressor's presets (test_quant_llmcompressor.py; every position of
# two 10-12 token sequences, teacher-forced): 5.0e-2 the worst of 24 models (12 seeds x both dynamic FP8 presets),
# 2.3e-2 of 12 with the static FP8 preset; a model without a flipped activation code agrees within 2.5e-5.
FLIP_BOUND = 0.1
# The same with FP4 activations, whose codes are further apart: NVFP4's worst was 8.4e-2 of 36 models (seeds
# 0-35; two flipped, the rest within 4.5e-7); MXFP4 agreed exactly in 12 of 12 (its fake-quantized products are
# exact in fp32, and each layer's input quantization absorbs the last-bit differences before it).
FP4_FLIP_BOUND = 0.2
NEW_TOKENS = 8
LAYERS = ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")


def save_base_model(folder: pathlib.Path) -> pathlib.Path:
    """A seeded tiny transformers Llama saved to folder/base (producers load a model from a path): every fused
    part on 128-row tiles (q 256, k and v 128, gate and up 384), so block-FP8 scale tiles never straddle parts."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=97, hidden_size=256, intermediate_size=384, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=64, tie_word_embeddings=False, max_position_embeddings=256,
        initializer_range=0.16,  # 8x transformers' default: logits sharp enough for greedy decoding to mean something
    )  # fmt: skip
    torch.manual_seed(0)
    with one_thread():
        LlamaForCausalLM(config).save_pretrained(folder / "base")
    return folder / "base"


def save_runner_model_as_hf(model, config, folder: pathlib.Path) -> pathlib.Path:
    """A runner Llama (its weights as loaded, e.g. the embedded SmolLM2 from its GGUF file) saved as a transformers
    Llama checkpoint in folder/hf: the fused layers split back into their checkpoint parts
    (`packed_modules_mapping`, in row order), config.json from the runner's config."""
    from safetensors.torch import save_file
    from transformers import LlamaConfig

    fused = type(model).packed_modules_mapping
    tensors = {}
    for name, module in model.named_modules():
        weight = getattr(module, "weight", None)
        if not isinstance(weight, torch.nn.Parameter):
            continue
        head, _, leaf = name.rpartition(".")
        if leaf in fused:
            for part, rows in zip(fused[leaf], weight.detach().split(list(module.shard_sizes.values())), strict=True):
                tensors[f"{head}.{part}.weight"] = rows.contiguous()
        else:
            tensors[f"{name}.weight"] = weight.detach().contiguous()
    hf = LlamaConfig(
        vocab_size=config.vocab_size, hidden_size=config.hidden_size, intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_hidden_layers, num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads, head_dim=config.head_dim, rms_norm_eps=config.rms_norm_eps,
        rope_theta=config.rope_theta, max_position_embeddings=config.max_position_embeddings,
        tie_word_embeddings=config.tie_word_embeddings, bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id, architectures=["LlamaForCausalLM"],  # as a model's save_pretrained writes
    )  # fmt: skip
    (folder / "hf").mkdir(parents=True, exist_ok=True)
    hf.save_pretrained(folder / "hf")
    save_file(tensors, str(folder / "hf" / "model.safetensors"))
    return folder / "hf"


def fake_quantized_weight(module) -> torch.Tensor:
    """A compressed-tensors module's weight as its quantization scheme fake-quantizes it (llm-compressor's model in
    memory after `oneshot`)."""
    from compressed_tensors.quantization.lifecycle.forward import forward_quantize

    return forward_quantize(module, module.weight.data, "weight", module.quantization_scheme.weights)


def pairs(theirs, ours):
    """(runner layer, the producer's modules it fuses, in order) of every decoder linear layer."""
    from runner.model.llama import LlamaForCausalLM

    fused = LlamaForCausalLM.packed_modules_mapping
    for i in range(len(ours.model.layers)):
        for name in LAYERS:
            owner, leaf = name.split(".")
            modules = getattr(theirs.model.layers[i], owner)
            parts = [getattr(modules, p) for p in fused.get(leaf, (leaf,))]
            yield getattr(getattr(ours.model.layers[i], owner), leaf), parts


def check_outputs(layer_pairs, rtol: float = 1e-5) -> None:
    """Each runner layer given one input returns what the producer's modules return side by side, within `rtol`
    of the largest output. The input is [batch, tokens, features], as transformers calls a layer (compressed-
    tensors' per-token scales reduce every dimension after the first two: a 2-D input would get one scale for
    the whole tensor), with an outlier so that one token's scale differs from the others'."""
    generator = torch.Generator().manual_seed(3)
    for layer, parts in layer_pairs:
        x = torch.randn(1, 7, layer.in_features, generator=generator) * 3
        x[0, 2, 5] = 200.0
        with torch.no_grad():
            want = torch.cat([p(x) for p in parts], dim=-1)[0]
            got = layer(x[0])
        assert torch.allclose(got, want, rtol=rtol, atol=rtol * float(want.abs().max())), layer.scheme.name


def check_greedy(theirs, ours, bound: float) -> None:
    """The runner's greedy tokens are the producer's (transformers' `generate`), except from a step where the
    producer's two best logits are within `bound` of its largest first-step logit; the first step's logits agree
    within that bound."""
    with one_thread(), torch.no_grad():
        tokens, first = greedy(ours, PROMPTS, NEW_TOKENS)
        for prompt, got, logits in zip(PROMPTS, tokens, first, strict=True):
            out = theirs.generate(
                torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, min_new_tokens=0, eos_token_id=None,
                do_sample=False, output_logits=True, return_dict_in_generate=True, pad_token_id=0,
            )  # fmt: skip
            want, steps = out.sequences[0, len(prompt) :].tolist(), [s[0].float() for s in out.logits]
            scale = float(steps[0].abs().max())
            assert float((logits - steps[0]).abs().max()) <= bound * scale
            for step, (a, b) in enumerate(zip(got, want, strict=True)):
                if a != b:
                    top = steps[step].topk(2).values
                    assert float(top[0] - top[1]) <= bound * scale, f"step {step}: {a} against {b}"
                    break
