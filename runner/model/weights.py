"""Checkpoint sources that yield HF-named tensors for `LlamaForCausalLM.load_weights`: an HF directory
(config.json + *.safetensors), and `dummy` weights (seeded random values of a config's shapes, for
benchmarks). The GGUF source is runner.model.gguf_file.

Tensors are yielded one at a time (a safetensors file is memory-mapped and read per tensor), so loading
never holds a second copy of the whole model.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

import torch

from runner.model.config import LlamaConfig


def hf_tensor_shapes(config: LlamaConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor an HF Llama (or Mixtral) checkpoint of `config` holds, by name (lm_head only when untied)."""
    h, kv, inter = config.hidden_size, config.kv_size, config.intermediate_size
    shapes = {"model.embed_tokens.weight": (config.vocab_size, h)}
    for i in range(config.num_hidden_layers):
        p = f"model.layers.{i}."
        shapes.update(
            {
                p + "input_layernorm.weight": (h,),
                p + "post_attention_layernorm.weight": (h,),
                p + "self_attn.q_proj.weight": (config.q_size, h),
                p + "self_attn.k_proj.weight": (kv, h),
                p + "self_attn.v_proj.weight": (kv, h),
                p + "self_attn.o_proj.weight": (h, config.q_size),
            }
        )
        if config.qk_norm:
            shapes[p + "self_attn.q_norm.weight"] = (config.head_dim,)
            shapes[p + "self_attn.k_norm.weight"] = (config.head_dim,)
        if config.is_sparse_layer(i):  # the router, then each expert's gate, down and up projections
            mixtral = config.model_type == "mixtral"
            moe = f"{p}{config.sparse_mlp_name}."
            shapes[moe + "gate.weight"] = (config.num_local_experts, h)
            ei = config.expert_intermediate_size
            names = ("w1", "w2", "w3") if mixtral else ("gate_proj", "down_proj", "up_proj")
            for e in range(config.num_local_experts):
                for part, shape in zip(names, ((ei, h), (h, ei), (ei, h)), strict=True):
                    shapes[f"{moe}experts.{e}.{part}.weight"] = shape
        else:
            shapes.update(
                {
                    p + "mlp.gate_proj.weight": (inter, h),
                    p + "mlp.up_proj.weight": (inter, h),
                    p + "mlp.down_proj.weight": (h, inter),
                }
            )
    shapes["model.norm.weight"] = (h,)
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = (config.vocab_size, h)
    return shapes


def dummy_weights(
    config: LlamaConfig, seed: int = 0, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32
) -> Iterator[tuple[str, torch.Tensor]]:
    """Seeded random weights: norms 1, matrices N(0, 1/in_features) (activations keep unit scale through the
    layers, so logits stay finite in bf16), drawn on `device` tensor by tensor."""
    gen = torch.Generator(device=device).manual_seed(seed)
    for name, shape in hf_tensor_shapes(config).items():
        if len(shape) == 1:
            yield name, torch.ones(shape, dtype=dtype, device=device)
            continue
        std = 1.0 if name == "model.embed_tokens.weight" else 1.0 / math.sqrt(shape[1])
        yield name, torch.randn(shape, generator=gen, device=device, dtype=dtype).mul_(std)


def read_hf_config(directory: str | Path) -> LlamaConfig:
    path = Path(directory) / "config.json"
    if not path.is_file():
        raise ValueError(f"model: {directory} has no config.json (an HF checkpoint directory needs one)")
    return LlamaConfig.from_hf(json.loads(path.read_text()))


def safetensors_files(directory: str | Path) -> list[Path]:
    files = sorted(Path(directory).glob("*.safetensors"))
    if not files:
        raise ValueError(f"model: {directory} holds no *.safetensors file")
    return files


def safetensors_weights(directory: str | Path) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) of every tensor in the directory's *.safetensors files, in file then key order."""
    from safetensors import safe_open

    for path in safetensors_files(directory):
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)
