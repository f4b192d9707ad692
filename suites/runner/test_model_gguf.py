"""GGUF loading: the q/k row permutation (round trip, and what it means: llama.cpp's adjacent-pair RoPE on
permuted rows is HF's rotate-half RoPE on the original rows), tensor names, metadata -> LlamaConfig, and a
small GGUF file written with gguf-py (F32, F16 and Q8_0 tensors, permuted q/k) read back through
load_model: every tensor is the dequantized original, q/k un-permuted."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kernels.tolerances import assert_exact
from runner.model.config import LlamaConfig
from runner.model.layers import RotaryEmbedding
from runner.model.weights import dummy_weights

gguf = pytest.importorskip("gguf", reason="gguf-py (the runner extra) is needed to read and write GGUF files")

from runner.model.gguf_file import config_from_metadata, hf_name, permute_qk, unpermute_qk  # noqa: E402


@given(heads=st.integers(1, 8), half=st.integers(1, 8), cols=st.integers(1, 5), seed=st.integers(0, 2**16))
def test_permutation_round_trip(heads, half, cols, seed):
    w = torch.randn((heads * 2 * half, cols), generator=torch.Generator().manual_seed(seed))
    assert_exact(unpermute_qk(permute_qk(w, heads), heads), w)
    assert_exact(permute_qk(unpermute_qk(w, heads), heads), w)


def test_permutation_places_half_pairs_side_by_side():
    """Per head, HF rows (i, i + d/2) become GGUF rows (2i, 2i + 1)."""
    w = torch.arange(2 * 8, dtype=torch.float32)[:, None]  # 2 heads of d = 8: row value = HF row index
    got = permute_qk(w, 2)[:, 0].tolist()
    assert got == [0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15]


def test_pair_rope_on_permuted_rows_is_rotate_half_on_hf_rows():
    """Why the permutation exists: RoPE rotating adjacent pairs (llama.cpp) applied to the GGUF rows' output
    equals, after un-permuting, rotate-half RoPE (HF, this model) on the HF rows' output."""
    heads, d, hidden, tokens = 3, 8, 5, 4
    gen = torch.Generator().manual_seed(0)
    w_hf, x = torch.randn((heads * d, hidden), generator=gen), torch.randn((tokens, hidden), generator=gen)
    positions = torch.arange(tokens) * 7
    rope = RotaryEmbedding(d, 10_000.0, 64, "cpu")
    want, _ = rope(positions, (x @ w_hf.T).view(tokens, heads, d), torch.zeros(tokens, 1, d))
    y = (x @ permute_qk(w_hf, heads).T).view(tokens, heads, d // 2, 2)  # adjacent pairs (2i, 2i + 1)
    cos, sin = (rope.cos_sin_cache[positions][:, None, : d // 2], rope.cos_sin_cache[positions][:, None, d // 2 :])
    pairs = torch.stack((y[..., 0] * cos - y[..., 1] * sin, y[..., 0] * sin + y[..., 1] * cos), dim=-1)
    got = unpermute_qk(pairs.reshape(tokens * heads, d).T, 1)  # per head: pairs -> halves (columns = rows of T)
    torch.testing.assert_close(got.T.reshape(tokens, heads, d), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("gguf_name", "want"),
    [
        ("token_embd.weight", "model.embed_tokens.weight"),
        ("output.weight", "lm_head.weight"),
        ("output_norm.weight", "model.norm.weight"),
        ("blk.12.attn_k.weight", "model.layers.12.self_attn.k_proj.weight"),
        ("blk.0.ffn_norm.weight", "model.layers.0.post_attention_layernorm.weight"),
        ("blk.3.ffn_up.weight", "model.layers.3.mlp.up_proj.weight"),
    ],
)
def test_tensor_names(gguf_name, want):
    assert hf_name(gguf_name) == want


@pytest.mark.parametrize("gguf_name", ["rope_freqs.weight", "blk.0.attn_q.bias", "blk.0.ffn_gate_exps.weight"])
def test_tensor_names_refused(gguf_name):
    with pytest.raises(ValueError, match=f"GGUF tensor '{gguf_name}' has no place"):
        hf_name(gguf_name)


SMALL = LlamaConfig(
    vocab_size=64,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    rms_norm_eps=1e-5,
    rope_theta=5000.0,
    max_position_embeddings=256,
    tie_word_embeddings=True,
    bos_token_id=1,
    eos_token_id=2,
)


def _metadata(config: LlamaConfig) -> dict:
    return {
        "general.architecture": "llama",
        "llama.block_count": config.num_hidden_layers,
        "llama.context_length": config.max_position_embeddings,
        "llama.embedding_length": config.hidden_size,
        "llama.feed_forward_length": config.intermediate_size,
        "llama.attention.head_count": config.num_attention_heads,
        "llama.attention.head_count_kv": config.num_key_value_heads,
        "llama.rope.freq_base": config.rope_theta,
        "llama.attention.layer_norm_rms_epsilon": config.rms_norm_eps,
        "llama.vocab_size": config.vocab_size,
        "llama.rope.dimension_count": config.head_dim,
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
    }


def test_metadata_to_config():
    assert config_from_metadata(_metadata(SMALL), tied=True) == SMALL
    assert not config_from_metadata(_metadata(SMALL), tied=False).tie_word_embeddings
    with pytest.raises(ValueError, match="architecture 'qwen3' is not supported"):
        config_from_metadata({**_metadata(SMALL), "general.architecture": "qwen3"}, tied=True)
    meta = _metadata(SMALL)
    del meta["llama.feed_forward_length"]
    with pytest.raises(ValueError, match=r"lacks llama\.feed_forward_length"):
        config_from_metadata(meta, tied=True)


def _gguf_name(hf: str) -> str:
    for gguf_name in (
        "token_embd.weight",
        "output_norm.weight",
        *(
            f"blk.{i}.{part}.weight"
            for i in range(SMALL.num_hidden_layers)
            for part in (
                "attn_norm",
                "ffn_norm",
                "attn_q",
                "attn_k",
                "attn_v",
                "attn_output",
                "ffn_gate",
                "ffn_up",
                "ffn_down",
            )
        ),
    ):
        if hf_name(gguf_name) == hf:
            return gguf_name
    raise AssertionError(hf)


def test_written_gguf_reads_back_dequantized_and_unpermuted(tmp_path):
    from runner.model import load_model

    Q = gguf.GGMLQuantizationType
    original = dict(dummy_weights(SMALL, seed=5))
    path = tmp_path / "small.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(SMALL.num_hidden_layers)
    writer.add_context_length(SMALL.max_position_embeddings)
    writer.add_embedding_length(SMALL.hidden_size)
    writer.add_feed_forward_length(SMALL.intermediate_size)
    writer.add_head_count(SMALL.num_attention_heads)
    writer.add_head_count_kv(SMALL.num_key_value_heads)
    writer.add_rope_freq_base(SMALL.rope_theta)
    writer.add_layer_norm_rms_eps(SMALL.rms_norm_eps)
    writer.add_vocab_size(SMALL.vocab_size)
    writer.add_rope_dimension_count(SMALL.head_dim)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    expected = {}
    for i, (name, w) in enumerate(original.items()):
        stored = w
        if name.endswith("q_proj.weight"):
            stored = permute_qk(w, SMALL.num_attention_heads)
        elif name.endswith("k_proj.weight"):
            stored = permute_qk(w, SMALL.num_key_value_heads)
        qtype = Q.F32 if w.dim() == 1 else (Q.Q8_0, Q.F16)[i % 2]
        data = gguf.quants.quantize(stored.numpy(), qtype)
        writer.add_tensor(_gguf_name(name), data, raw_dtype=qtype)
        back = torch.from_numpy(gguf.quants.dequantize(data, qtype).copy()).reshape(w.shape)
        expected[name] = back if stored is w else unpermute_qk(back, stored.shape[0] // SMALL.head_dim)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    model, tok, config = load_model(str(path), device="cpu", tokenizer=False)
    assert config == LlamaConfig(**{**SMALL.__dict__, "rms_norm_eps": float(torch.tensor(1e-5).item())})
    assert tok is None
    layer = model.model.layers[1]
    fused = torch.cat([expected[f"model.layers.1.self_attn.{x}_proj.weight"] for x in "qkv"])
    assert_exact(layer.self_attn.qkv_proj.weight.data, fused)
    assert_exact(layer.mlp.down_proj.weight.data, expected["model.layers.1.mlp.down_proj.weight"])
    assert_exact(model.model.embed_tokens.weight.data, expected["model.embed_tokens.weight"])
    assert not torch.equal(
        expected["model.layers.1.self_attn.q_proj.weight"], original["model.layers.1.self_attn.q_proj.weight"]
    )  # Q8_0/F16 are lossy: real dequant
    torch.testing.assert_close(
        expected["model.layers.1.self_attn.q_proj.weight"],
        original["model.layers.1.self_attn.q_proj.weight"],
        rtol=0.02,
        atol=0.02,
    )


def test_the_plain_array_reader_reads_what_gguf_py_reads(tmp_path):
    """The reader behind GGUFCheckpoint (gguf-py's, through a plain ndarray view of its memory map) gives
    gguf-py's own fields and tensors, byte for byte, for a file with metadata arrays and tensors."""
    import numpy as np

    from runner.model.gguf_file import plain_array_reader

    path = tmp_path / "arrays.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_array("tokenizer.ggml.tokens", [f"tok{i}" for i in range(300)])
    writer.add_array("tokenizer.ggml.scores", [float(i) / 7 for i in range(300)])
    writer.add_uint32("llama.block_count", 2)
    writer.add_tensor("token_embd.weight", np.arange(96, dtype=np.float32).reshape(8, 12))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    theirs, ours = gguf.GGUFReader(str(path)), plain_array_reader(gguf.GGUFReader)(str(path))
    assert type(ours.data) is np.ndarray and isinstance(theirs.data, np.memmap)
    assert list(ours.fields) == list(theirs.fields)
    for key, field in theirs.fields.items():
        assert [p.tobytes() for p in ours.fields[key].parts] == [p.tobytes() for p in field.parts], key
    assert [(t.name, t.data.tobytes()) for t in ours.tensors] == [(t.name, t.data.tobytes()) for t in theirs.tensors]
