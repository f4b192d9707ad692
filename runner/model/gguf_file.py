"""GGUF checkpoints (llama.cpp's file format) as HF-named, dequantized tensors and a LlamaConfig.

Read with gguf-py's GGUFReader (memory-mapped); every tensor, whatever its type (F32, F16, Q8_0, Q4_1, ...),
is dequantized by gguf-py's own `gguf.quants.dequantize` to float32. Tensor names map to HF's:
    token_embd -> model.embed_tokens, output_norm -> model.norm, output -> lm_head,
    blk.N.attn_norm / ffn_norm -> model.layers.N.input_layernorm / post_attention_layernorm,
    blk.N.attn_q/k/v/output -> ...self_attn.q/k/v/o_proj, blk.N.ffn_gate/up/down -> ...mlp.gate/up/down_proj.
A file without `output.weight` ties the output to the embedding.

The q/k permutation. llama.cpp applies RoPE to adjacent pairs (dims 2i, 2i+1) while HF Llama rotates halves
(dims i, i + d/2); its converter therefore reorders the rows of each head of q_proj and k_proj so that HF's
half-pairs become adjacent: per head, GGUF row 2i + j is HF row i + j*d/2 (j in {0, 1}), i.e. the head's rows
viewed as [2, d/2] are transposed to [d/2, 2]. `unpermute_qk` undoes it (q with the query head count, k with
the KV head count), after which the weights are HF's and the model uses rotate-half RoPE. `permute_qk` is the
converter's direction (used by the tests' round trip and to write GGUF files).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from runner.model.config import LlamaConfig

_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_BLOCK = re.compile(r"blk\.(\d+)\.(\w+)\.(weight)$")


def hf_name(gguf_name: str) -> str:
    """The HF name of a GGUF tensor name; ValueError for a tensor this Llama model has no place for."""
    if m := _BLOCK.fullmatch(gguf_name):
        layer, part, kind = m.groups()
        if part in _LAYER_NAMES:
            return f"model.layers.{layer}.{_LAYER_NAMES[part]}.{kind}"
    else:
        base, _, kind = gguf_name.rpartition(".")
        if base in _TOP_NAMES and kind == "weight":
            return f"{_TOP_NAMES[base]}.weight"
    raise ValueError(
        f"weights: GGUF tensor {gguf_name!r} has no place in a Llama model (rope_freqs, biases and "
        f"other architectures are not supported)"
    )


def _check_heads(w: torch.Tensor, heads: int) -> int:
    if w.dim() != 2 or heads < 1 or w.shape[0] % (2 * heads):
        raise ValueError(f"weight: {tuple(w.shape)} rows are not {heads} heads of an even size")
    return w.shape[0] // heads


def permute_qk(w: torch.Tensor, heads: int) -> torch.Tensor:
    """HF rows -> llama.cpp rows (per head: [2, d/2] -> [d/2, 2])."""
    d = _check_heads(w, heads)
    return w.reshape(heads, 2, d // 2, w.shape[1]).transpose(1, 2).reshape(w.shape)


def unpermute_qk(w: torch.Tensor, heads: int) -> torch.Tensor:
    """llama.cpp rows -> HF rows (per head: [d/2, 2] -> [2, d/2]); the inverse of permute_qk."""
    d = _check_heads(w, heads)
    return w.reshape(heads, d // 2, 2, w.shape[1]).transpose(1, 2).reshape(w.shape)


def _value(field):
    return field.contents()


@functools.cache
def plain_array_reader(base: type) -> type:
    """`base` (gguf-py's GGUFReader) reading through a plain ndarray view of its memory map. gguf-py slices its
    `data` once per metadata element (about 250,000 slices for SmolLM2's vocabulary and merges), and
    numpy.memmap's subclass hooks on every slice made a read ~3x slower: 2.8 s against 0.9 s for the embedded
    model on this project's 2-core CPU machine. The bytes are the same, still paged in lazily from the file
    (the view keeps the map alive). A subclass of whatever class is passed, so a test's own reader still runs."""

    class PlainArrayReader(base):
        @property
        def data(self):
            return self._plain_data

        @data.setter
        def data(self, value) -> None:
            self._plain_data = value.view(np.ndarray) if isinstance(value, np.memmap) else value

    return PlainArrayReader


class GGUFCheckpoint:
    """One GGUF file, read once (gguf-py parses every metadata key when it opens the file, ~2 s on the CPU for
    the 135M model): `metadata` (key -> value, the tokenizer's arrays left out), `config` (LlamaConfig),
    `tokenizer_metadata()` and `weights()` (HF-named fp32)."""

    def __init__(self, path: str | Path) -> None:
        import gguf

        self.path = Path(path)
        if not self.path.is_file():
            raise ValueError(f"model: GGUF file {self.path} does not exist")
        try:
            self._reader = plain_array_reader(gguf.GGUFReader)(str(self.path))
        except Exception as err:  # gguf-py's own checks (magic, version) and numpy's on a truncated file
            raise ValueError(f"model: {self.path} is not a readable GGUF file ({err})") from err
        self.metadata = {
            key: _value(field)
            for key, field in self._reader.fields.items()
            if not key.startswith("tokenizer.ggml.") or key.endswith("_id")
        }
        self.tensor_names = [t.name for t in self._reader.tensors]
        if "llama.vocab_size" not in self.metadata:  # older files: the embedding's row count (shape is [in, out])
            embd = [t for t in self._reader.tensors if t.name == "token_embd.weight"]
            if embd:
                self.metadata["llama.vocab_size"] = int(embd[0].shape[-1])
        self.config = config_from_metadata(self.metadata, tied="output.weight" not in self.tensor_names)

    def tokenizer_metadata(self) -> dict:
        """Every `tokenizer.*` key (the vocabulary and merges too, which `metadata` leaves out) and
        `general.architecture`: what runner.model.tokenizer builds the tokenizer from, without reading the
        file again."""
        return {
            key: _value(field)
            for key, field in self._reader.fields.items()
            if key.startswith("tokenizer.") or key == "general.architecture"
        }

    def weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(HF name, float32 tensor [HF shape]) per tensor, dequantized and with q/k rows unpermuted."""
        from gguf.quants import dequantize

        cfg = self.config
        for t in self._reader.tensors:
            name = hf_name(t.name)
            values = np.ascontiguousarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
            if not values.flags.writeable:  # an F32 tensor comes back as the read-only memory map itself
                values = values.copy()
            w = torch.from_numpy(values)
            if name.endswith("q_proj.weight"):
                w = unpermute_qk(w, cfg.num_attention_heads)
            elif name.endswith("k_proj.weight"):
                w = unpermute_qk(w, cfg.num_key_value_heads)
            yield name, w


def config_from_metadata(meta: dict, tied: bool) -> LlamaConfig:
    """LlamaConfig from GGUF metadata (`{arch}.*` keys; the token ids from `tokenizer.ggml.*`)."""
    arch = meta.get("general.architecture")
    if arch != "llama":
        raise ValueError(f"model: GGUF architecture {arch!r} is not supported (only 'llama')")

    def get(key, default=None):
        value = meta.get(f"llama.{key}", default)
        if value is None:
            raise ValueError(f"model: GGUF metadata lacks llama.{key}")
        return value

    heads = int(get("attention.head_count"))
    hidden = int(get("embedding_length"))
    head_dim = int(meta.get("llama.attention.key_length") or meta.get("llama.rope.dimension_count") or hidden // heads)
    if (
        meta.get("llama.rope.scaling.type", "none") not in ("none", "linear")
        or float(meta.get("llama.rope.scaling.factor", 1.0) or 1.0) != 1.0
    ):
        raise ValueError("model: GGUF rope scaling is not supported (plain RoPE only)")
    vocab = meta.get("llama.vocab_size")
    if vocab is None:
        raise ValueError("model: GGUF metadata lacks llama.vocab_size")
    return LlamaConfig(
        vocab_size=int(vocab),
        hidden_size=hidden,
        intermediate_size=int(get("feed_forward_length")),
        num_hidden_layers=int(get("block_count")),
        num_attention_heads=heads,
        num_key_value_heads=int(get("attention.head_count_kv", heads)),
        head_dim=head_dim,
        rms_norm_eps=float(get("attention.layer_norm_rms_epsilon")),
        rope_theta=float(get("rope.freq_base", 10000.0)),
        max_position_embeddings=int(get("context_length")),
        tie_word_embeddings=tied,
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
        eos_token_id=meta.get("tokenizer.ggml.eos_token_id"),
    )
