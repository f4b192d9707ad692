"""Llama-family causal LM over a paged KV cache (the model side of the runner contract).

    h = embed(input_ids)
    per layer: h = h + o_proj(attn(rope(q), rope(k), v))  with q, k, v = split(qkv_proj(rms_norm(h)))
               h = h + down_proj(silu(gate) * up)          with gate, up = split(gate_up_proj(rms_norm(h)))
    hidden = rms_norm(h);  logits = hidden @ lm_head^T  (lm_head = the embedding when tied)

Module and parameter names follow HF's LlamaForCausalLM, except that q/k/v_proj are fused into
`self_attn.qkv_proj` and gate/up_proj into `mlp.gate_up_proj`: `load_weights` takes HF-named tensors and
sends each shard to its fused parameter's weight_loader (runner.model.layers). A tied model has no
lm_head parameter: `compute_logits` reads the embedding (a checkpoint's `lm_head.weight`, if present, is
ignored for a tied config, as HF does).

Parameters are allocated (uninitialised) at construction, on `device` in `dtype`; nothing is usable before
load_weights has filled every one of them (it raises naming what is missing).
"""

from __future__ import annotations

from collections.abc import Iterable
from types import MappingProxyType

import torch
from torch import nn

from runner.model.attention import AttentionBatch, paged_attention
from runner.model.config import LlamaConfig
from runner.model.layers import Embedding, GateUpLinear, Linear, QKVLinear, RMSNorm, RotaryEmbedding, SiluAndMul
from runner.model.moe import CHECKPOINT_SCALE, CODES, EXPERT_PART, EXPERT_TENSOR, SparseMoE, expert_param
from runner.model.quant.activation import Fp8Groups, wants_fp8_groups

# (fused parameter's name part, checkpoint name part, shard id)
STACKED_PARAMS = (
    (".qkv_proj.", ".q_proj.", "q"),
    (".qkv_proj.", ".k_proj.", "k"),
    (".qkv_proj.", ".v_proj.", "v"),
    (".gate_up_proj.", ".gate_proj.", 0),
    (".gate_up_proj.", ".up_proj.", 1),
)


def _scheme(quant, prefix: str):
    """The quantization scheme of the layer named `prefix` (None: unquantized); `quant` is the config the model
    made for itself (`QuantConfig.for_model`), which holds the model class's fused-layer mapping."""
    return None if quant is None else quant.scheme_for(prefix)


class LlamaAttention(nn.Module):
    def __init__(self, config: LlamaConfig, dtype: torch.dtype, device, quant=None, prefix: str = "") -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = (
            config.num_attention_heads,
            config.num_key_value_heads,
            config.head_dim,
        )
        self.scale = self.head_dim**-0.5
        self.qkv_proj = QKVLinear(
            config.hidden_size,
            self.head_dim,
            self.num_heads,
            self.num_kv_heads,
            dtype,
            device,
            _scheme(quant, f"{prefix}.qkv_proj"),
        )
        self.o_proj = Linear(config.q_size, config.hidden_size, dtype, device, _scheme(quant, f"{prefix}.o_proj"))
        self.qk_norm = config.qk_norm
        if config.qk_norm:  # Qwen3: RMSNorm over each head's q and k, before the rotary embedding
            self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps, dtype, device)
            self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps, dtype, device)

    def forward(
        self,
        rotary_emb: RotaryEmbedding,
        positions: torch.Tensor,
        x: torch.Tensor | Fp8Groups,
        batch: AttentionBatch,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
    ) -> torch.Tensor:
        """rotary_emb: the model's one RotaryEmbedding (its cos/sin table is shared by every layer)."""
        q, k, v = self.qkv_proj.split(self.qkv_proj(x))  # x: a tensor, or Fp8Groups for a block-FP8 qkv_proj
        tokens = q.shape[0]
        q = q.view(tokens, self.num_heads, self.head_dim)
        k = k.view(tokens, self.num_kv_heads, self.head_dim)
        v = v.view(tokens, self.num_kv_heads, self.head_dim)
        if self.qk_norm:
            q = self.q_norm(q.reshape(-1, self.head_dim)).view(tokens, self.num_heads, self.head_dim)
            k = self.k_norm(k.reshape(-1, self.head_dim)).view(tokens, self.num_kv_heads, self.head_dim)
        q, k = rotary_emb(positions, q, k)
        out = paged_attention(q, k, v, kv_cache[0], kv_cache[1], batch, self.scale)
        return self.o_proj(out.reshape(tokens, self.num_heads * self.head_dim))


class LlamaMLP(nn.Module):
    def __init__(self, config: LlamaConfig, dtype: torch.dtype, device, quant=None, prefix: str = "") -> None:
        super().__init__()
        h, inter = config.hidden_size, config.intermediate_size
        self.gate_up_proj = GateUpLinear(h, inter, dtype, device, _scheme(quant, f"{prefix}.gate_up_proj"))
        self.act = SiluAndMul()
        self.down_proj = Linear(inter, h, dtype, device, _scheme(quant, f"{prefix}.down_proj"))

    def forward(self, x: torch.Tensor | Fp8Groups) -> torch.Tensor:
        h = self.gate_up_proj(x)
        return self.down_proj(self.act(h, wants_fp8_groups(self.down_proj, h, h.shape[-1] // 2)))


def _expert_scheme(quant, mlp: str, config: LlamaConfig):
    """The scheme of a sparse layer's experts (`mlp`: the layer's MLP prefix): None (unquantized), online MXFP4, or a
    checkpoint's scheme that SparseMoE takes (CHECKPOINT_SCALE: block FP8, MXFP4; every expert's parts alike);
    ValueError naming what is not implemented."""
    if quant is None:
        return None
    if quant.online:
        if quant.name != "mxfp4":
            raise ValueError(
                f"quantization: {quant.name} MoE experts are not implemented; experts take online 'mxfp4' "
                "or stay unquantized"
            )
        return quant.scheme_for(f"{mlp}.experts.0.{config.expert_part_names[0]}")
    names = [f"{mlp}.experts.{e}.{part}" for e in range(config.num_local_experts) for part in config.expert_part_names]
    found: dict[str | None, str] = {}
    for name in names:
        found.setdefault(quant.scheme_of(name), name)
    if len(found) > 1:
        named = {layer: scheme or "unquantized" for scheme, layer in found.items()}
        raise ValueError(f"quantization: the experts of {mlp!r} have different schemes: {named}")
    scheme = next(iter(found))
    if scheme is not None and scheme not in CHECKPOINT_SCALE:
        raise ValueError(
            f"quantization: {scheme} MoE experts in a checkpoint are not implemented ({mlp!r}); block FP8 "
            "(fp8_block) and MXFP4 W4A16 (mxfp4) experts are, and unquantized ones"
        )
    if scheme is None:
        return None
    experts = quant.scheme_for(names[0])
    if experts.tensor_name("weight") not in CODES:
        raise ValueError(
            f"quantization: {scheme} MoE experts stored as {experts.tensor_name('weight')!r} are not implemented "
            f"({mlp!r}); their codes load from one of {list(CODES)}"
        )
    return experts


class LlamaDecoderLayer(nn.Module):
    def __init__(
        self, config: LlamaConfig, dtype: torch.dtype, device, quant=None, prefix: str = "", index: int = 0
    ) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype, device)
        self.self_attn = LlamaAttention(config, dtype, device, quant, f"{prefix}.self_attn")
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype, device)
        if config.is_sparse_layer(index):
            experts = _expert_scheme(quant, f"{prefix}.{config.sparse_mlp_name}", config)
            checkpoint = None
            if experts is not None and not experts.online:
                checkpoint = (experts.name, experts.tensor_name(CHECKPOINT_SCALE[experts.name]))
            moe = SparseMoE(
                config.hidden_size,
                config.expert_intermediate_size,
                config.num_local_experts,
                config.num_experts_per_tok,
                config.norm_topk_prob,
                dtype,
                device,
                mxfp4=experts is not None and experts.online,
                checkpoint=checkpoint,
            )
            self.mlp_name = config.sparse_mlp_name
            setattr(self, self.mlp_name, moe)
        else:
            self.mlp_name = "mlp"
            self.mlp = LlamaMLP(config, dtype, device, quant, f"{prefix}.mlp")

    def forward(
        self, rotary_emb, positions, x: torch.Tensor, residual: torch.Tensor | None, batch, kv_cache
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The residual stream h is carried as (x, residual) with h = x + residual (residual None: h = x), so
        each residual add fuses into the norm after it: h = h + attn(norm(h)); h = h + mlp(norm(h)), with the
        same roundings (one per add)."""
        columns = x.shape[-1]
        quantized = wants_fp8_groups(self.self_attn.qkv_proj, x, columns)  # a block-FP8 qkv_proj takes Fp8Groups
        if residual is None:
            x, residual = self.input_layernorm(x, fp8_groups=quantized), x
        else:
            x, residual = self.input_layernorm(x, residual, fp8_groups=quantized)
        x = self.self_attn(rotary_emb, positions, x, batch, kv_cache)
        mlp = getattr(self, self.mlp_name)
        quantized = isinstance(mlp, LlamaMLP) and wants_fp8_groups(mlp.gate_up_proj, x, columns)
        x, residual = self.post_attention_layernorm(x, residual, fp8_groups=quantized)
        return mlp(x), residual


class LlamaModel(nn.Module):
    def __init__(self, config: LlamaConfig, dtype: torch.dtype, device, quant=None) -> None:
        super().__init__()
        self.embed_tokens = Embedding(config.vocab_size, config.hidden_size, dtype, device)
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(config, dtype, device, quant, f"model.layers.{i}", i)
            for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype, device)
        self.rotary_emb = RotaryEmbedding(
            config.head_dim, config.rope_theta, config.max_position_embeddings, device
        )  # shared by every layer


class LlamaForCausalLM(nn.Module):
    # fused layer -> the checkpoint layers it is made of, in row order. Read-only: a subclass that adds entries
    # builds its own ({**LlamaForCausalLM.packed_modules_mapping, ...}), so no two models share a mutable one;
    # the quantization config gets a copy of the class's (`QuantConfig.for_model`), its own entries on top.
    packed_modules_mapping = MappingProxyType(
        {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
    )

    def __init__(self, config: LlamaConfig, dtype: torch.dtype, device, quant=None) -> None:
        """quant: a runner.model.quant.QuantConfig (None: every layer unquantized)."""
        super().__init__()
        if not isinstance(config, LlamaConfig):
            raise TypeError(f"config: must be a LlamaConfig, got {type(config).__name__}")
        quant = None if quant is None else quant.for_model(type(self).packed_modules_mapping)
        self.config, self.dtype, self.quant = config, dtype, quant
        self.model = LlamaModel(config, dtype, device, quant)
        self.lm_head = (
            None if config.tie_word_embeddings else Linear(config.hidden_size, config.vocab_size, dtype, device)
        )

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        batch: AttentionBatch,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
    ) -> torch.Tensor:
        """Hidden states [T, hidden] of the step's T new tokens (the final norm applied)."""
        if len(kv_caches) != len(self.model.layers):
            raise ValueError(
                f"kv_caches: need one (k_cache, v_cache) per layer ({len(self.model.layers)}), got {len(kv_caches)}"
            )
        if input_ids.shape != positions.shape or input_ids.dim() != 1:
            raise ValueError(
                f"input_ids, positions: must both be [T], got {tuple(input_ids.shape)} and {tuple(positions.shape)}"
            )
        h = self.model.embed_tokens(input_ids)
        residual = None
        for layer, kv_cache in zip(self.model.layers, kv_caches, strict=True):
            h, residual = layer(self.model.rotary_emb, positions, h, residual, batch, kv_cache)
        return self.model.norm(h, residual)[0]

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits [N, vocab] in fp32 of hidden states [N, hidden]."""
        head = self.model.embed_tokens if self.lm_head is None else self.lm_head
        return torch.nn.functional.linear(hidden, head.weight).float()

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Fill every parameter from HF-named tensors; ValueError naming an unknown, duplicate or missing one.
        RuntimeError while an offloader holds the weights (they live in its host copies, not in the parameters)."""
        if getattr(self, "offloader", None) is not None:
            raise RuntimeError(
                "load_weights: the model's weights are offloaded (runner.model.offload); detach the offloader "
                "first (Offloader.detach), then reload and attach a new one"
            )
        params = dict(self.named_parameters())
        # Everything that must be loaded: plain parameters whole, fused ones shard by shard (MoE experts: one
        # shard per expert and part).
        pending = {
            (name, None)
            for name, p in params.items()
            if ".qkv_proj." not in name and ".gate_up_proj." not in name and not hasattr(p, "expert_shards")
        }
        for name, p in params.items():
            pending.update((name, shard) for shard in getattr(p, "expert_shards", ()))
            for fused, _, shard in STACKED_PARAMS:
                if fused in name:
                    pending.add((name, shard))
        for name, tensor in weights:
            if name.endswith("rotary_emb.inv_freq") or (name == "lm_head.weight" and self.lm_head is None):
                continue  # recomputed from the config / the tied embedding
            target, shard = name, None
            if expert := EXPERT_TENSOR.match(name):
                prefix, e, part, tensor_name = expert.groups()
                part = EXPERT_PART[part]
                target = f"{prefix}.{expert_param('w2' if part == 'w2' else 'w13', tensor_name)}"
                shard = (int(e), part)
            else:
                for fused, part, shard_id in STACKED_PARAMS:
                    if part in name:
                        target, shard = name.replace(part, fused), shard_id
                        break
            if target not in params:
                raise ValueError(f"weights: checkpoint tensor {name!r} has no parameter in this model")
            if expert and shard not in params[target].expert_shards:
                raise ValueError(f"weights: checkpoint tensor {name!r}: expert {shard[0]} does not exist in this model")
            if (target, shard) not in pending:
                fused_on_disk = shard is None and any(f in target for f, _, _ in STACKED_PARAMS)
                raise ValueError(
                    f"weights: checkpoint tensor {name!r} "
                    + (
                        "is stored fused; give its shards (q/k/v_proj, gate/up_proj) separately"
                        if fused_on_disk
                        else "given twice"
                    )
                )
            param = params[target]
            try:
                if shard is None:
                    param.weight_loader(param, tensor)
                else:
                    param.weight_loader(param, tensor, shard)
            except ValueError as err:
                raise ValueError(f"weights: {name!r}: {err}") from err
            pending.discard((target, shard))
        if pending:
            missing = sorted(f"{n}" + ("" if s is None else f" (shard {s!r})") for n, s in pending)
            raise ValueError(f"weights: {len(missing)} parameters not in the checkpoint, first: {missing[:5]}")
        for layer, module in self.named_modules():  # online schemes processed each layer as its last shard arrived
            try:
                if isinstance(module, Linear) and not module.processed:
                    module.process_weights_after_loading()
                elif isinstance(module, SparseMoE):
                    module.process_weights_after_loading()
            except ValueError as err:  # a checkpoint's tensor the scheme refuses: name the layer it is in
                raise ValueError(f"weights: layer {layer!r}: {err}") from err
