"""Weight loading: fused QKV / gate-up shard loaders write each shard into its slice in place; load_weights
maps HF names, refuses unknown, duplicate, fused-on-disk, mis-shaped and missing tensors by name; the
safetensors directory and dummy sources; LlamaConfig from HF config dicts."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kernels.tolerances import assert_exact
from runner.model import load_model
from runner.model.config import MODELS, LlamaConfig
from runner.model.layers import GateUpLinear, QKVLinear
from runner.model.llama import LlamaForCausalLM
from runner.model.weights import dummy_weights, hf_tensor_shapes
from suites.runner.conftest import one_thread

TINY = LlamaConfig(
    vocab_size=50,
    hidden_size=24,
    intermediate_size=40,
    num_hidden_layers=2,
    num_attention_heads=6,
    num_key_value_heads=2,
    head_dim=4,
    tie_word_embeddings=False,
    eos_token_id=2,
)


@given(
    heads=st.integers(1, 6),
    group=st.integers(1, 4),
    head_dim=st.sampled_from([2, 4, 8]),
    hidden=st.integers(1, 12),
    order=st.permutations(["q", "k", "v"]),
)
def test_qkv_shards_land_in_their_rows(heads, group, head_dim, hidden, order):
    layer = QKVLinear(hidden, head_dim, heads * group, heads, torch.float32, "cpu")
    param = layer.weight
    ptr = param.data_ptr()
    ints = lambda *shape: torch.randint(-4, 5, shape).float()  # small integers: every GEMM order sums exactly
    src = {
        "q": ints(heads * group * head_dim, hidden),
        "k": ints(heads * head_dim, hidden),
        "v": ints(heads * head_dim, hidden),
    }
    for shard in order:  # any load order
        param.weight_loader(param, src[shard], shard)
    assert param.data_ptr() == ptr, "the fused parameter was replaced, not filled in place"
    assert_exact(param.data, torch.cat([src["q"], src["k"], src["v"]]))
    x = ints(3, hidden)
    q, k, v = layer.split(layer(x))
    for name, got in (("q", q), ("k", k), ("v", v)):
        assert_exact(got, x @ src[name].T, name)


def test_gate_up_shards_and_dtype_conversion():
    layer = GateUpLinear(4, 3, torch.bfloat16, "cpu")
    gate, up = torch.randn(3, 4), torch.randn(3, 4)
    layer.weight.weight_loader(layer.weight, up, 1)
    layer.weight.weight_loader(layer.weight, gate, 0)
    assert_exact(layer.weight.data, torch.cat([gate, up]).bfloat16())


def test_shard_loader_refuses_bad_shard_and_shape():
    layer = QKVLinear(8, 4, 4, 2, torch.float32, "cpu")
    with pytest.raises(ValueError, match="shard_id: must be one of"):
        layer.weight.weight_loader(layer.weight, torch.zeros(8, 8), "o")
    with pytest.raises(ValueError, match=r"shard 'k' must be \[8, 8\], got \[16, 8\]"):
        layer.weight.weight_loader(layer.weight, torch.zeros(16, 8), "k")


def _checkpoint(config: LlamaConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    return dict(dummy_weights(config, seed=seed))


def test_load_weights_fills_every_parameter_from_hf_names():
    model = LlamaForCausalLM(TINY, torch.float32, "cpu")
    ckpt = _checkpoint(TINY)
    model.load_weights(ckpt.items())
    layer = model.model.layers[1]
    p = "model.layers.1."
    assert_exact(
        layer.self_attn.qkv_proj.weight.data, torch.cat([ckpt[p + f"self_attn.{x}_proj.weight"] for x in "qkv"])
    )
    assert_exact(
        layer.mlp.gate_up_proj.weight.data,
        torch.cat([ckpt[p + "mlp.gate_proj.weight"], ckpt[p + "mlp.up_proj.weight"]]),
    )
    assert_exact(model.lm_head.weight.data, ckpt["lm_head.weight"])
    assert_exact(layer.post_attention_layernorm.weight.data, ckpt[p + "post_attention_layernorm.weight"])


def test_tied_model_has_no_head_and_ignores_a_stored_one():
    tied = LlamaConfig(**{**TINY.__dict__, "tie_word_embeddings": True})
    model = LlamaForCausalLM(tied, torch.float32, "cpu")
    ckpt = _checkpoint(tied)
    ckpt["lm_head.weight"] = torch.full((50, 24), 7.0)
    model.load_weights(ckpt.items())
    assert model.lm_head is None
    hidden = torch.randn(2, 24)
    assert_exact(model.compute_logits(hidden), hidden @ ckpt["model.embed_tokens.weight"].T)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda c: c.update({"model.layers.0.self_attn.q_norm.weight": torch.ones(4)}),
            "q_norm.weight' has no parameter",
        ),
        (lambda c: c.pop("model.layers.1.self_attn.v_proj.weight"), r"qkv_proj.weight \(shard 'v'\)"),
        (lambda c: c.pop("model.norm.weight"), "not in the checkpoint, first: \\['model.norm.weight'\\]"),
        (
            lambda c: c.update({"model.layers.0.mlp.up_proj.weight": torch.zeros(40, 23)}),
            r"'model.layers.0.mlp.up_proj.weight': shard 1 must be \[40, 24\], got \[40, 23\]",
        ),
        (lambda c: c.update({"model.norm.weight": torch.zeros(25)}), r"'model.norm.weight'.*\(25,\).*\(24,\)"),
        (lambda c: c.update({"model.layers.0.self_attn.qkv_proj.weight": torch.zeros(40, 24)}), "is stored fused"),
    ],
)
def test_load_weights_refuses_clearly(edit, message):
    ckpt = _checkpoint(TINY)
    edit(ckpt)
    with pytest.raises(ValueError, match=message):
        LlamaForCausalLM(TINY, torch.float32, "cpu").load_weights(ckpt.items())


def test_load_weights_refuses_a_duplicate():
    ckpt = list(_checkpoint(TINY).items())
    with pytest.raises(ValueError, match="given twice"):
        LlamaForCausalLM(TINY, torch.float32, "cpu").load_weights([*ckpt, ckpt[3]])


def _hf_dict(config: LlamaConfig, **extra) -> dict:
    return {
        "model_type": "llama",
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_hidden_layers,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "head_dim": config.head_dim,
        "rms_norm_eps": config.rms_norm_eps,
        "max_position_embeddings": config.max_position_embeddings,
        "tie_word_embeddings": config.tie_word_embeddings,
        "eos_token_id": config.eos_token_id,
        "rope_parameters": {"rope_type": "default", "rope_theta": config.rope_theta},
        **extra,
    }


def test_safetensors_directory_loads_like_its_tensors(tmp_path):
    from safetensors.torch import save_file

    ckpt = _checkpoint(TINY, seed=3)
    names = sorted(ckpt)
    save_file({n: ckpt[n] for n in names[:10]}, str(tmp_path / "model-00001-of-00002.safetensors"))
    save_file({n: ckpt[n] for n in names[10:]}, str(tmp_path / "model-00002-of-00002.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(_hf_dict(TINY)))
    model, tok, config = load_model(str(tmp_path), device="cpu")
    assert config == TINY and tok is None
    want = LlamaForCausalLM(TINY, torch.float32, "cpu")
    want.load_weights(ckpt.items())
    for (name, got), (_, ref) in zip(model.named_parameters(), want.named_parameters(), strict=True):
        assert_exact(got.data, ref.data, name)


def test_dummy_weights_are_seeded_and_cover_the_config():
    a, b, c = (dict(dummy_weights(TINY, seed=s)) for s in (0, 0, 1))
    assert {n: tuple(t.shape) for n, t in a.items()} == hf_tensor_shapes(TINY)
    assert all(torch.equal(a[n], b[n]) for n in a)
    assert not torch.equal(a["model.layers.0.mlp.down_proj.weight"], c["model.layers.0.mlp.down_proj.weight"])


@pytest.mark.parametrize("name", ["smollm2-135m", "llama-3.2-1b-shape", "qwen3-30b-a3b-shape"])
def test_registered_shapes_build_as_dummy(name):
    config = MODELS[name].config
    shapes = hf_tensor_shapes(config)
    params = sum(torch.Size(s).numel() for s in shapes.values())
    assert params > 100e6  # real-sized shapes (135M, 1.2B, 30.5B)
    cheap = {"num_hidden_layers": 1, "vocab_size": 64, "bos_token_id": None, "eos_token_id": None}
    if config.num_local_experts:  # 8 of the experts: the layer's structure, not its size
        cheap["num_local_experts"] = 8
    small = LlamaConfig(**{**config.__dict__, **cheap})  # build cheaply
    net = LlamaForCausalLM(small, torch.bfloat16, "cpu")
    net.load_weights(dummy_weights(small, dtype=torch.bfloat16))
    assert net.model.layers[0].self_attn.qkv_proj.weight.shape == (
        config.q_size + 2 * config.kv_size,
        config.hidden_size,
    )


def test_dummy_load_model_of_a_registered_name():
    with one_thread():
        model, _, config = load_model(
            "smollm2-135m", load_format="dummy", device="cpu", dtype=torch.bfloat16, seed=1, tokenizer=False
        )
    assert config == MODELS["smollm2-135m"].config
    assert model.model.embed_tokens.weight.dtype == torch.bfloat16
    assert torch.isfinite(model.model.layers[29].mlp.down_proj.weight).all()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"rope_scaling": {"rope_type": "llama3", "factor": 32.0}}, "rope_scaling: only the default"),
        ({"hidden_act": "gelu"}, "hidden_act: only 'silu'"),
        ({"attention_bias": True}, "attention_bias: biases are not implemented"),
        ({"model_type": "qwen3"}, "model_type: only 'llama'"),
        ({"num_key_value_heads": 4}, "num_key_value_heads: 4 must divide"),
    ],
)
def test_hf_config_refused_clearly(extra, message):
    with pytest.raises(ValueError, match=message):
        LlamaConfig.from_hf(_hf_dict(TINY, **extra))


def test_hf_config_reads_4x_and_5x_rope_keys():
    old = _hf_dict(TINY)
    del old["rope_parameters"]
    old["rope_theta"] = 123.0
    assert LlamaConfig.from_hf(old).rope_theta == 123.0
    assert LlamaConfig.from_hf(_hf_dict(TINY)) == TINY


def test_load_model_refuses_unknown_names_and_formats(tmp_path):
    with pytest.raises(ValueError, match="model: unknown name 'nope'"):
        load_model("nope", device="cpu")
    with pytest.raises(ValueError, match="load_format: must be one of"):
        load_model("smollm2-135m", load_format="pt", device="cpu")
    with pytest.raises(ValueError, match="has no weights file, only a shape"):
        load_model("smollm2-135m", device="cpu")
    with pytest.raises(ValueError, match=r"no config\.json"):
        load_model(str(tmp_path), device="cpu")
