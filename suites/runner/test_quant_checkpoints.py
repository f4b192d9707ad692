"""Quantized checkpoints in the runner (runner.model.quant.checkpoint_config, the schemes' checkpoint mode).

The checkpoints are written here by each format's published description (checkpoints made by the producers
themselves: llm-compressor's, its FP8 preset included, in test_quant_llmcompressor.py, AMD Quark's MXFP4 export in
test_quant_quark_export.py): an HF fine-grained FP8 checkpoint (128 x 128 `weight_scale_inv`), an AMD Quark MXFP4
W4A16 one (`weight` uint8 codes, `weight_scale` E8M0, scale mode "even" as Quark's default), a ModelOpt NVFP4 one
(W4A4: its activations fake-quantized), and FP8 per-tensor ones with static input scales in the layouts of
compressed-tensors' FP8 preset (its own `quantize` makes the codes; its `fake_quantize` is the oracle), ModelOpt
FP8 and Quark FP8.
Oracles: the block-FP8 checkpoint gives the logits of the same weights quantized online (same quantizer, same
tiles); the Quark one the logits of the unquantized model whose weights went through AMD Quark's own MX emulation
(exactly: W4A16 keeps the activations). Bad checkpoints are refused before any weight is used, naming the tensor
or the config key."""

from __future__ import annotations

import dataclasses
import json
import warnings

import pytest
import torch
from safetensors.torch import load_file, save_file

from kernels.tolerances import assert_exact
from reference.quant.fp8 import quantize_fp8_blocks
from reference.quant.mxfp4 import quantize_mxfp4
from runner.model import load_model
from runner.model.config import LlamaConfig
from runner.model.layers import Linear
from runner.model.llama import LlamaForCausalLM
from runner.model.quant import online_config
from runner.model.quant.checkpoint_config import from_checkpoint
from runner.model.weights import dummy_weights
from suites.runner import quark_oracle, tiny_llama
from suites.runner.model_driver import greedy

ALIGNED = tiny_llama.ALIGNED_128
DOWN0, DOWN9 = "model.layers.0.mlp.down_proj", "model.layers.9.mlp.down_proj"
PROMPTS = [[5, 17, 33, 2, 9, 41], [60, 3, 3, 71]]
HF_FP8 = {"quant_method": "fp8", "weight_block_size": [128, 128], "activation_scheme": "dynamic"}
QUARK_MXFP4 = {
    "quant_method": "quark",
    "global_quant_config": {
        "weight": {"dtype": "fp4", "qscheme": "per_group", "group_size": 32, "scale_format": "e8m0", "ch_axis": -1},
        "input_tensors": None,
        "output_tensors": None,
    },
    "layer_quant_config": {},
    "exclude": ["lm_head"],
}


def _hf_config(config: LlamaConfig, quantization: dict) -> dict:
    return {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_hidden_layers,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "head_dim": config.head_dim,
        "rope_theta": config.rope_theta,
        "rms_norm_eps": config.rms_norm_eps,
        "max_position_embeddings": config.max_position_embeddings,
        "tie_word_embeddings": config.tie_word_embeddings,
        "quantization_config": quantization,
    }


def _write(tmp_path, config: LlamaConfig, quantization: dict, edit=None) -> str:
    """A quantized checkpoint of the seeded dummy weights: every decoder linear weight quantized per tensor."""
    tensors = {}
    for name, w in dummy_weights(config, seed=5):
        if w.dim() == 2 and ".layers." in name:
            base = name.removesuffix(".weight")
            if quantization["quant_method"] == "fp8":
                q, s = quantize_fp8_blocks(w)
                tensors[f"{base}.weight"], tensors[f"{base}.weight_scale_inv"] = q, s
            else:
                codes, scales = quantize_mxfp4(w, scale_mode="even")
                tensors[f"{base}.weight"], tensors[f"{base}.weight_scale"] = codes, scales
        else:
            tensors[name] = w
    if edit is not None:
        edit(tensors)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(_hf_config(config, quantization)))
    return str(tmp_path)


def _load(path: str):
    return load_model(path, dtype=torch.float32, device="cpu", tokenizer=False)[0]


def test_hf_fp8_block_checkpoint_equals_the_same_weights_quantized_online(tmp_path):
    model = _load(_write(tmp_path, ALIGNED, HF_FP8))
    online = LlamaForCausalLM(ALIGNED, torch.float32, "cpu", online_config("fp8_block"))
    online.load_weights(dummy_weights(ALIGNED, seed=5))
    qkv = model.model.layers[0].self_attn.qkv_proj
    assert qkv.scheme.name == "fp8_block" and not qkv.scheme.online
    assert_exact(qkv.weight_fp8, online.model.layers[0].self_attn.qkv_proj.weight_fp8, "qkv codes")
    tokens, logits = greedy(model, PROMPTS, 6)
    want_tokens, want_logits = greedy(online, PROMPTS, 6)
    assert tokens == want_tokens
    assert_exact(logits, want_logits, "logits")


def test_quark_mxfp4_checkpoint_equals_quarks_fake_quantized_model(tmp_path):
    fake_quantize_mx = quark_oracle.fake_quantize_mx()
    model = _load(_write(tmp_path, ALIGNED, QUARK_MXFP4))
    assert model.model.layers[1].mlp.down_proj.scheme.name == "mxfp4" and model.lm_head.scheme.name == "unquantized"

    def emulated():
        for name, w in dummy_weights(ALIGNED, seed=5):
            if w.dim() == 2 and ".layers." in name:
                w = fake_quantize_mx(w, axis=-1, block_size=32, scale_calculation_mode="even", mx_element_dtype="fp4")
            yield name, w

    oracle = LlamaForCausalLM(ALIGNED, torch.float32, "cpu")
    oracle.load_weights(emulated())
    tokens, logits = greedy(model, PROMPTS, 6)
    want_tokens, want_logits = greedy(oracle, PROMPTS, 6)
    assert tokens == want_tokens
    assert_exact(logits, want_logits, "logits")


def _set(name, value):
    return lambda t: t.__setitem__(name, value(t[name]) if callable(value) else value)


L0 = "model.layers.0.self_attn."


@pytest.mark.parametrize(
    ("quantization", "edit", "message"),
    [
        (HF_FP8, _set(L0 + "k_proj.weight", lambda t: t.float()), r"k_proj.weight.*must be torch.float8_e4m3fn"),
        (HF_FP8, _set(L0 + "q_proj.weight_scale_inv", torch.ones(2, 3)), r"q_proj.weight_scale_inv.*must be \[2, 2\]"),
        (HF_FP8, lambda t: t.pop(L0 + "v_proj.weight_scale_inv"), r"weight_scale_inv \(shard 'v'\)"),
        (QUARK_MXFP4, _set(L0 + "o_proj.weight_scale", torch.zeros(256, 4, dtype=torch.uint8)), r"o_proj.*\[256, 8\]"),
        (QUARK_MXFP4, _set(L0 + "o_proj.weight", lambda t: t.to(torch.int8)), r"o_proj.weight.*must be torch.uint8"),
    ],
)
def test_a_bad_tensor_is_refused_by_name(tmp_path, quantization, edit, message):
    with pytest.raises(ValueError, match=message):
        _load(_write(tmp_path, ALIGNED, quantization, edit))


@pytest.mark.parametrize(
    ("quantization", "message"),
    [
        ({"quant_method": "awq"}, r"quantization_config.quant_method: unknown 'awq'"),
        ({**HF_FP8, "weight_block_size": [64, 64]}, r"quantization_config.weight_block_size: only \[128, 128\]"),
        (
            {**QUARK_MXFP4, "global_quant_config": {"weight": {"dtype": "int4", "qscheme": "per_group"}}},
            r"quantization_config.global_quant_config.weight: \('int4'",
        ),
        ({**QUARK_MXFP4, "exclude": ["model.layers.9.mlp.down_proj"]}, r"layer 'model.layers.9.mlp.down_proj'"),
        (
            {
                **QUARK_MXFP4,
                "global_quant_config": {
                    "weight": {"dtype": "fp8_e4m3", "qscheme": "per_channel", "ch_axis": 0},
                    "input_tensors": {"dtype": "fp8_e4m3", "qscheme": "per_tensor", "is_dynamic": False},
                },
            },
            r"global_quant_config.input_tensors: .* not supported with per-channel FP8 weights",
        ),
        ({"quantization": {"quant_algo": "INT4_AWQ"}}, r"quant_algo: ModelOpt .INT4_AWQ. is not supported"),
        ({"quantization": {"quant_algo": "MIXED_PRECISION"}}, r"quantized_layers: MIXED_PRECISION needs"),
        (
            {
                "quantization": {
                    "quant_algo": "MIXED_PRECISION",
                    "quantized_layers": {DOWN0: {"quant_algo": "W4A8_AWQ"}},
                }
            },
            rf"quantized_layers.{DOWN0}.quant_algo: ModelOpt 'W4A8_AWQ' is not supported",
        ),
        (
            {
                "quantization": {
                    "quant_algo": "MIXED_PRECISION",
                    "quantized_layers": {DOWN0: {"quant_algo": "NVFP4", "group_size": 32}},
                }
            },
            rf"quantized_layers.{DOWN0}.group_size: NVFP4 blocks are 16 wide",
        ),
        (
            {"quantization": {"quant_algo": "MIXED_PRECISION", "quantized_layers": {DOWN9: {"quant_algo": "FP8"}}}},
            rf"the config names layer '{DOWN9}', which this model does not have",
        ),
    ],
)
def test_a_bad_config_is_refused_by_key(tmp_path, quantization, message):
    (tmp_path / "config.json").write_text(json.dumps(_hf_config(ALIGNED, quantization)))
    if "quantization" in quantization:  # ModelOpt's own file
        config = _hf_config(ALIGNED, {})
        del config["quantization_config"]
        (tmp_path / "config.json").write_text(json.dumps(config))
        (tmp_path / "hf_quant_config.json").write_text(json.dumps(quantization))
    save_file({"x": torch.zeros(1)}, str(tmp_path / "model.safetensors"))  # never read: refused first
    with pytest.raises(ValueError, match=message):
        _load(str(tmp_path))


def test_fp8_block_shards_off_the_tiles_are_refused(tmp_path):
    """SmolLM2's q (576 rows) and k (192) shards would share 128-row scale tiles in the fused qkv."""
    odd = dataclasses.replace(ALIGNED, num_attention_heads=9, num_key_value_heads=3, hidden_size=576)
    with pytest.raises(ValueError, match=r"fp8_block needs the shards of a fused layer on 128-row tiles; shard 'q'"):
        _load(_write(tmp_path, odd, HF_FP8))


def test_compressed_tensors_block_fp8_config_maps_layers():
    pytest.importorskip("compressed_tensors")
    config = from_checkpoint(
        {
            "quant_method": "compressed-tensors",
            "format": "float-quantized",
            "config_groups": {
                "group_0": {
                    "targets": ["Linear"],
                    "weights": {"num_bits": 8, "type": "float", "strategy": "block", "block_structure": [128, 128]},
                    "input_activations": {
                        "num_bits": 8,
                        "type": "float",
                        "strategy": "group",
                        "group_size": 128,
                        "dynamic": True,
                    },
                }
            },
            "ignore": ["lm_head", "re:.*layers\\.1\\.mlp\\..*"],
        }
    )
    assert config.scheme_of("model.layers.0.mlp.down_proj") == "fp8_block"
    assert config.scheme_of("model.layers.1.mlp.gate_proj") is None
    assert config.scheme_of("lm_head") is None


def test_fused_layer_parts_with_different_checkpoint_schemes_are_refused(tmp_path):
    mixed = {**QUARK_MXFP4, "exclude": ["lm_head", "model.layers.0.mlp.up_proj"]}
    with pytest.raises(ValueError, match=r"gate_up_proj.*different schemes.*up_proj': 'unquantized'"):
        _load(_write(tmp_path, ALIGNED, mixed))


def _write_modelopt_nvfp4(tmp_path, config: LlamaConfig, up_factor: float = 1.0) -> str:
    """A ModelOpt-layout NVFP4 checkpoint: every part quantized on its own (its own decode global scale);
    `up_factor` scales the up projections' weights, so gate and up get different global scales."""
    from reference.quant.nvfp4 import quantize_nvfp4
    from reference.quant.nvfp4_global_scale import DecodeScale, tensor_amax

    tensors, i = {}, 0
    for name, w in dummy_weights(config, seed=5):
        if w.dim() == 2 and ".layers." in name:
            base = name.removesuffix(".weight")
            w = w * up_factor if "up_proj" in name else w
            scale = DecodeScale.from_amax(tensor_amax(w))
            codes, scales = quantize_nvfp4(w, scale)
            tensors[f"{base}.weight"] = codes
            tensors[f"{base}.weight_scale"] = scales.view(torch.float8_e4m3fn)
            tensors[f"{base}.weight_scale_2"] = scale.value.reshape(())
            tensors[f"{base}.input_scale"], i = _modelopt_input_scale(i), i + 1
        else:
            tensors[name] = w
    save_file(tensors, str(tmp_path / "model.safetensors"))
    hf = _hf_config(config, {})
    del hf["quantization_config"]
    (tmp_path / "config.json").write_text(json.dumps(hf))
    modelopt = {
        "producer": {"name": "modelopt"},
        "quantization": {"quant_algo": "NVFP4", "group_size": 16, "exclude_modules": ["lm_head"]},
    }
    (tmp_path / "hf_quant_config.json").write_text(json.dumps(modelopt))
    return str(tmp_path)


def _modelopt_input_scale(i: int) -> torch.Tensor:
    """A calibrated-looking decode input scale (amax / 2688 for activations of amax ~3-8), unequal between the
    parts of a fused layer: the layer takes the largest."""
    return torch.tensor(0.0012 * (1 + i % 3))


def _nvfp4_parts(layer_name: str, up_factor: float):
    from reference.quant.nvfp4 import quantize_nvfp4
    from reference.quant.nvfp4_fused_w13 import NVFP4Tensor
    from reference.quant.nvfp4_global_scale import DecodeScale, tensor_amax

    weights = dict(dummy_weights(ALIGNED, seed=5))
    parts = []
    for part in layer_name:
        w = weights[part] * (up_factor if "up_proj" in part else 1.0)
        scale = DecodeScale.from_amax(tensor_amax(w))
        parts.append(NVFP4Tensor(*quantize_nvfp4(w, scale), scale))
    return parts


@pytest.mark.parametrize("policy", ["use_w1", "max_requant"])
def test_modelopt_nvfp4_gate_up_follows_the_w13_policy(tmp_path, policy):
    from reference.quant.nvfp4_fused_w13 import W13ScaleMismatchWarning, fuse_w13

    path = _write_modelopt_nvfp4(tmp_path, ALIGNED, up_factor=3.0)
    silent = warnings.catch_warnings(action="error")  # max_requant re-encodes without a warning
    with pytest.warns(W13ScaleMismatchWarning) if policy == "use_w1" else silent:
        model = load_model(path, dtype=torch.float32, device="cpu", tokenizer=False, nvfp4_w13_policy=policy)[0]
    gate_up = model.model.layers[0].mlp.gate_up_proj
    assert gate_up.scheme.name == "nvfp4_w4a4" and not gate_up.scheme.online
    p = "model.layers.0.mlp."
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", W13ScaleMismatchWarning)  # the oracle's own warning: seen above
        want = fuse_w13(*_nvfp4_parts([p + "gate_proj.weight", p + "up_proj.weight"], 3.0), policy=policy)
    assert_exact(gate_up.weight_codes, want.codes, "gate_up codes")
    assert_exact(gate_up.weight_scales, want.scales, "gate_up scales")
    assert_exact(gate_up.weight_scale_2, want.global_scale.value.reshape(()), "gate_up global scale")


def test_modelopt_nvfp4_raise_policy_refuses_mismatched_gate_up(tmp_path):
    path = _write_modelopt_nvfp4(tmp_path, ALIGNED, up_factor=3.0)
    with pytest.raises(ValueError, match="w1"):
        load_model(path, dtype=torch.float32, device="cpu", tokenizer=False, nvfp4_w13_policy="raise")


@pytest.mark.filterwarnings("ignore::reference.quant.nvfp4_fused_w13.W13ScaleMismatchWarning")
def test_modelopt_nvfp4_checkpoint_is_the_model_of_its_dequantized_weights_and_fake_quantized_inputs(tmp_path):
    """W4A4 fake-quantized: the runner's logits equal those of the unquantized model whose every weight is the
    dequantized fused NVFP4 tensor (q/k/v parts re-encoded onto their largest global scale) and whose every
    such layer's input goes through the reference NVFP4 quantizer and back under its parts' largest input scale."""
    from reference.quant.nvfp4 import dequantize_nvfp4, quantize_nvfp4
    from reference.quant.nvfp4_global_scale import DecodeScale

    def fake_quantize(scale):
        return lambda _, args: (dequantize_nvfp4(*quantize_nvfp4(args[0], scale), scale, dtype=args[0].dtype),)

    model = load_model(_write_modelopt_nvfp4(tmp_path, ALIGNED), dtype=torch.float32, device="cpu", tokenizer=False)[0]
    oracle = _load_plain()
    names = [n for n, w in dummy_weights(ALIGNED, seed=5) if w.dim() == 2 and ".layers." in n]
    input_scales = {n.removesuffix(".weight"): _modelopt_input_scale(i) for i, n in enumerate(names)}
    fused = LlamaForCausalLM.packed_modules_mapping
    for (name, layer), (_, plain) in zip(model.named_modules(), oracle.named_modules(), strict=True):
        if getattr(layer, "scheme", None) is not None and layer.scheme.name == "nvfp4_w4a4":
            w = dequantize_nvfp4(
                layer.weight_codes, layer.weight_scales, DecodeScale(layer.weight_scale_2), dtype=torch.float32
            )
            plain.weight.data.copy_(w)
            head, _, leaf = name.rpartition(".")
            widest = max(input_scales[f"{head}.{part}"] for part in fused.get(leaf, (leaf,)))
            plain.register_forward_pre_hook(fake_quantize(DecodeScale(widest)))
    tokens, logits = greedy(model, PROMPTS, 6)
    want_tokens, want_logits = greedy(oracle, PROMPTS, 6)
    assert tokens == want_tokens
    assert_exact(logits, want_logits, "logits")
    qkv = model.model.layers[0].self_attn.qkv_proj  # parts 0.0012, 0.0024, 0.0036
    assert_exact(qkv.input_global_scale, torch.tensor(0.0036), "widest input scale")


# --- FP8 per-tensor with static input scales: compressed-tensors' FP8 preset, ModelOpt FP8, Quark FP8 ----------
def _fp8_parts(config: LlamaConfig):
    """{checkpoint weight name: (E4M3 codes, weight scale, input scale)} of every decoder linear weight, each
    part on its own scales (so the fused q/k/v and gate/up parts differ), quantized with compressed-tensors'
    own `quantize` under its FP8 preset's weight arguments."""
    from compressed_tensors.quantization import preset_name_to_scheme
    from compressed_tensors.quantization.lifecycle.forward import quantize

    args = preset_name_to_scheme("FP8", ["Linear"]).weights
    out = {}
    for i, (name, w) in enumerate(n for n in dummy_weights(config, seed=5) if n[1].dim() == 2 and ".layers." in n[0]):
        scale = (w.abs().amax() / 448.0).reshape(1).float()
        zero = torch.zeros(1, dtype=torch.float8_e4m3fn)
        codes = quantize(w.float(), scale, zero, args, dtype=torch.float8_e4m3fn)
        out[name] = (codes, scale, torch.tensor([0.004 * (1 + i % 3)]))  # calibrated-looking, unequal per part
    return out


def _write_fp8_static(tmp_path, config: LlamaConfig, flavour: str, edit=None) -> str:
    from compressed_tensors.quantization import preset_name_to_scheme

    tmp_path.mkdir(parents=True, exist_ok=True)
    tensors = dict(dummy_weights(config, seed=5))
    for name, (codes, scale, input_scale) in _fp8_parts(config).items():
        base = name.removesuffix(".weight")
        shape = () if flavour == "modelopt" else (1,)  # ModelOpt stores scalars, compressed-tensors [1]
        tensors[name] = codes
        tensors[f"{base}.weight_scale"], tensors[f"{base}.input_scale"] = (
            scale.reshape(shape),
            input_scale.reshape(shape),
        )
    if edit is not None:
        edit(tensors)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    if flavour == "compressed-tensors":
        group = preset_name_to_scheme("FP8", ["Linear"]).model_dump(mode="json", exclude_none=True)
        quantization = {
            "quant_method": "compressed-tensors",
            "format": "float-quantized",
            "config_groups": {"group_0": group},
            "ignore": ["lm_head"],
        }
    elif flavour == "quark":
        fp8 = {"dtype": "fp8_e4m3", "qscheme": "per_tensor", "is_dynamic": False}
        quantization = {
            "quant_method": "quark",
            "global_quant_config": {"weight": fp8, "input_tensors": fp8, "output_tensors": None},
            "layer_quant_config": {},
            "exclude": ["lm_head"],
        }
    else:
        quantization = {}
    hf = _hf_config(config, quantization)
    if flavour == "modelopt":
        del hf["quantization_config"]
        modelopt = {"quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": None, "exclude_modules": ["lm_head"]}}
        (tmp_path / "hf_quant_config.json").write_text(json.dumps(modelopt))
    (tmp_path / "config.json").write_text(json.dumps(hf))
    return str(tmp_path)


def test_modelopt_mixed_precision_gives_each_layer_its_algorithm(tmp_path):
    """A ModelOpt MIXED_PRECISION checkpoint (`quantized_layers`: the attention projections NVFP4, the MLPs FP8, one
    down projection left out, so unquantized), its tensors taken from the uniform NVFP4 and FP8 checkpoints of the
    same weights: every layer has the scheme its entry names, and on a random input each decoder linear gives
    exactly what the same layer of the uniform model (or the unquantized one) gives."""
    (tmp_path / "nvfp4").mkdir()
    nvfp4 = _write_modelopt_nvfp4(tmp_path / "nvfp4", ALIGNED)
    fp8 = _write_fp8_static(tmp_path / "fp8", ALIGNED, "modelopt")
    plain = dict(dummy_weights(ALIGNED, seed=5))
    uniform = {"nvfp4": load_file(f"{nvfp4}/model.safetensors"), "fp8": load_file(f"{fp8}/model.safetensors")}

    def algo(layer: str) -> str | None:
        return None if layer == DOWN0 else "nvfp4" if ".self_attn." in layer else "fp8"

    layers = sorted({n.removesuffix(".weight") for n, w in plain.items() if w.dim() == 2 and ".layers." in n})
    tensors = {n: t for n, t in plain.items() if n.removesuffix(".weight") not in layers}
    for layer in layers:
        source = uniform[algo(layer)] if algo(layer) else {f"{layer}.weight": plain[f"{layer}.weight"]}
        tensors |= {n: t for n, t in source.items() if n.startswith(f"{layer}.")}
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    save_file(tensors, str(mixed / "model.safetensors"))
    (mixed / "config.json").write_text((tmp_path / "fp8" / "config.json").read_text())
    entries = {
        layer: {"quant_algo": "NVFP4", "group_size": 16} if algo(layer) == "nvfp4" else {"quant_algo": "FP8"}
        for layer in layers
        if algo(layer)
    }
    modelopt = {
        "quantization": {"quant_algo": "MIXED_PRECISION", "kv_cache_quant_algo": None, "quantized_layers": entries}
    }
    (mixed / "hf_quant_config.json").write_text(json.dumps(modelopt))
    model = _load(str(mixed))
    references = {"nvfp4": _load(nvfp4), "fp8": _load(fp8), None: _load_plain()}
    want_scheme = {"nvfp4": "nvfp4_w4a4", "fp8": "fp8", None: "unquantized"}
    x = torch.randn(3, ALIGNED.hidden_size, generator=torch.Generator().manual_seed(4))
    checked = 0
    for name, layer in model.named_modules():
        if ".layers." not in name or not isinstance(layer, Linear):
            continue
        head, _, leaf = name.rpartition(".")
        part = {"qkv_proj": "q_proj", "gate_up_proj": "gate_proj"}.get(leaf, leaf)
        kind = algo(f"{head}.{part}")
        assert layer.scheme.name == want_scheme[kind], name
        twin = references[kind].get_submodule(name)
        inputs = x if layer.in_features == x.shape[1] else torch.randn(3, layer.in_features)
        assert_exact(layer(inputs), twin(inputs), name)
        checked += 1
    assert checked == 4 * ALIGNED.num_hidden_layers


def _load_plain():
    """The unquantized model of the weights every checkpoint here is written from (`dummy_weights`, seed 5)."""
    model = LlamaForCausalLM(ALIGNED, torch.float32, "cpu")
    model.load_weights(dummy_weights(ALIGNED, seed=5))
    return model


def test_fp8_static_checkpoint_is_compressed_tensors_fake_quantized_model(tmp_path):
    """The oracle is compressed-tensors' own fake quantization under its FP8 preset: every decoder linear of the
    unquantized model gets its fused weight as the library dequantizes it (each part on its own scale, as the
    fused layer keeps them) and its input fake-quantized with the layer's largest input scale. Greedy tokens
    equal; logits within the fp32 difference of scaling before or after the sum."""
    pytest.importorskip("compressed_tensors")
    from compressed_tensors.quantization import preset_name_to_scheme
    from compressed_tensors.quantization.lifecycle.forward import fake_quantize

    scheme = preset_name_to_scheme("FP8", ["Linear"])
    model = _load(_write_fp8_static(tmp_path, ALIGNED, "compressed-tensors"))
    qkv = model.model.layers[0].self_attn.qkv_proj
    assert qkv.scheme.name == "fp8" and qkv.scheme.static_input and model.lm_head.scheme.name == "unquantized"
    parts, zero = _fp8_parts(ALIGNED), torch.zeros(1, dtype=torch.float8_e4m3fn)
    oracle = _load_plain()
    mapping = LlamaForCausalLM.packed_modules_mapping
    for name, layer in oracle.named_modules():
        leaf = name.rpartition(".")[2]
        if ".layers." not in name or not hasattr(layer, "weight") or layer.weight.dim() != 2:
            continue
        names = [f"{name.rpartition('.')[0]}.{p}.weight" for p in mapping.get(leaf, (leaf,))]
        inputs = max(parts[n][2] for n in names)
        dequant = [fake_quantize(parts[n][0].float() * parts[n][1], parts[n][1], zero, scheme.weights) for n in names]
        layer.weight.data.copy_(torch.cat(dequant))
        layer.register_forward_pre_hook(
            lambda _, args, s=inputs: (fake_quantize(args[0], s, zero, scheme.input_activations), *args[1:])
        )
    tokens, logits = greedy(model, PROMPTS, 6)
    want_tokens, want_logits = greedy(oracle, PROMPTS, 6)
    assert tokens == want_tokens
    assert torch.allclose(logits, want_logits, rtol=1e-4, atol=1e-4 * float(want_logits.abs().max()))


def test_fp8_static_fused_parts_keep_their_scales(tmp_path):
    """The fused q/k/v holds the checkpoint's codes and each part's weight scale on its rows; the one input
    takes the largest input scale; the block-FP8 GEMM's tile scales (decode rows) are each tile's part's."""
    pytest.importorskip("compressed_tensors")
    model = _load(_write_fp8_static(tmp_path, ALIGNED, "compressed-tensors"))
    parts = _fp8_parts(ALIGNED)
    names = [f"{L0}{p}_proj.weight" for p in "qkv"]
    qkv = model.model.layers[0].self_attn.qkv_proj
    scales = torch.stack([parts[n][1] for n in names]).flatten()
    assert len(set(scales.tolist())) == 3  # the parts really differ
    rows = torch.tensor([parts[n][0].shape[0] for n in names])
    assert_exact(qkv.weight_scale_cols, scales.repeat_interleave(rows).reshape(1, -1), "qkv weight scales")
    assert_exact(qkv.weight_scale_tiles[:, 0], scales.repeat_interleave(rows // 128), "qkv tile scales")
    assert_exact(qkv.input_scale, torch.stack([parts[n][2] for n in names]).max().reshape(1), "qkv input scale")
    want = torch.cat([parts[n][0] for n in names])
    assert_exact(qkv.weight_fp8.view(torch.uint8), want.view(torch.uint8), "qkv codes")


def test_fp8_parts_off_the_tiles_keep_their_scales_without_tile_scales(tmp_path):
    """SmolLM2's q (576 rows) and k (192) would share 128-row tiles: the layer keeps no tile scales, so its decode
    rows take the row-wise GEMM, which takes any scale per row."""
    pytest.importorskip("compressed_tensors")
    odd = dataclasses.replace(ALIGNED, num_attention_heads=9, num_key_value_heads=3, hidden_size=576)
    qkv = _load(_write_fp8_static(tmp_path, odd, "compressed-tensors")).model.layers[0].self_attn.qkv_proj
    assert not hasattr(qkv, "weight_scale_tiles") and qkv.weight_scale_cols.shape == (1, qkv.out_features)
    same = _load(_write_fp8_static(tmp_path / "same", odd, "modelopt", _one_weight_scale))
    assert hasattr(same.model.layers[0].self_attn.qkv_proj, "weight_scale_tiles")  # one scale: any tile has it


def _one_weight_scale(tensors):
    for name in tensors:
        if name.endswith(".weight_scale"):
            tensors[name] = torch.full_like(tensors[name], 0.01)


@pytest.mark.parametrize("flavour", ["modelopt", "quark"])
def test_fp8_static_checkpoints_of_other_producers_load_the_same_model(tmp_path, flavour):
    pytest.importorskip("compressed_tensors")
    want = _load(_write_fp8_static(tmp_path / "ct", ALIGNED, "compressed-tensors"))
    got = _load(_write_fp8_static(tmp_path / flavour, ALIGNED, flavour))
    assert got.model.layers[1].mlp.down_proj.scheme.describe() == "fp8 (static activations)"
    assert_exact(greedy(got, PROMPTS, 6)[1], greedy(want, PROMPTS, 6)[1], f"{flavour} logits")


def test_quark_mixes_fp8_and_mxfp4_layers(tmp_path):
    fp8 = {"dtype": "fp8_e4m3", "qscheme": "per_tensor", "is_dynamic": False}
    mixed = {
        **QUARK_MXFP4,
        "layer_quant_config": {"*self_attn*": {"weight": fp8, "input_tensors": fp8, "output_tensors": None}},
    }
    config = from_checkpoint(mixed)
    assert config.scheme_of(L0 + "q_proj") == "fp8_static" and config.scheme_of("model.layers.0.mlp.up_proj") == "mxfp4"
    assert config.scheme_of("lm_head") is None


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda t: t.pop(L0 + "k_proj.input_scale"), r"input_scale \(shard 'k'\)"),
        (_set(L0 + "o_proj.input_scale", torch.tensor([0.0])), r"input_scale: must be finite and > 0"),
        (_set(L0 + "o_proj.weight_scale", torch.ones(2)), r"must be a scalar"),
        (_set(L0 + "o_proj.weight", lambda t: t.float()), r"o_proj.weight.*must be torch.float8_e4m3fn"),
    ],
)
def test_a_bad_fp8_static_tensor_is_refused_by_name(tmp_path, edit, message):
    pytest.importorskip("compressed_tensors")
    with pytest.raises(ValueError, match=message):
        _load(_write_fp8_static(tmp_path, ALIGNED, "compressed-tensors", edit))


def _quark_w4a4(mode: str, **inputs) -> dict:
    spec = {**QUARK_MXFP4["global_quant_config"]["weight"], "is_dynamic": True, "scale_calculation_mode": mode}
    return {"weight": QUARK_MXFP4["global_quant_config"]["weight"], "input_tensors": {**spec, **inputs}}


def test_fp4_activation_configs_map_to_w4a4_schemes_or_are_refused_by_key():
    """Quark MXFP4 with dynamic MXFP4 inputs is mxfp4_w4a4 in the inputs' scale mode; an input scale mode whose
    bytes differ from the reference's of that name (Quark's "rceil"), static inputs, or modes that differ
    between layers are refused naming the key. compressed-tensors' W4A4 FP4 presets map likewise; FP4 weights
    with 8-bit activations are refused."""
    config = from_checkpoint({**QUARK_MXFP4, "global_quant_config": _quark_w4a4("floor")})
    assert config.scheme_of("model.layers.0.mlp.down_proj") == "mxfp4_w4a4"
    assert config.scheme_options["mxfp4_w4a4"] == {"input_scale_mode": "floor"}
    with pytest.raises(ValueError, match=r"global_quant_config.input_tensors: .*'rceil' is not supported"):
        from_checkpoint({**QUARK_MXFP4, "global_quant_config": _quark_w4a4("rceil")})
    with pytest.raises(ValueError, match=r"global_quant_config.input_tensors: \('fp4', 'per_group', 32, 'e8m0', False"):
        from_checkpoint({**QUARK_MXFP4, "global_quant_config": _quark_w4a4("even", is_dynamic=False)})
    mixed = {**QUARK_MXFP4, "global_quant_config": _quark_w4a4("even")}
    mixed["layer_quant_config"] = {"*down_proj": _quark_w4a4("ceil")}
    with pytest.raises(ValueError, match=r"scale_calculation_mode: MXFP4 activation scale modes differ"):
        from_checkpoint(mixed)
    pytest.importorskip("compressed_tensors")
    from compressed_tensors.quantization import preset_name_to_scheme

    for preset, scheme in (("MXFP4", "mxfp4_w4a4"), ("NVFP4", "nvfp4_w4a4")):
        group = preset_name_to_scheme(preset, ["Linear"]).model_dump(mode="json", exclude_none=True)
        config = from_checkpoint({"quant_method": "compressed-tensors", "config_groups": {"group_0": group}})
        assert config.scheme_of("model.layers.0.mlp.down_proj") == scheme
    group = preset_name_to_scheme("MXFP4", ["Linear"]).model_dump(mode="json", exclude_none=True)
    group["input_activations"] = preset_name_to_scheme("FP8_DYNAMIC", ["Linear"]).model_dump()["input_activations"]
    with pytest.raises(ValueError, match=r"group_0.input_activations: \('float', 8, 'token', True\) is not supported"):
        from_checkpoint({"quant_method": "compressed-tensors", "config_groups": {"group_0": group}})


def test_fp8_weight_only_and_fp8_kv_cache_configs_are_refused_by_key(tmp_path):
    pytest.importorskip("compressed_tensors")
    from compressed_tensors.quantization import preset_name_to_scheme

    group = preset_name_to_scheme("FP8", ["Linear"]).model_dump(mode="json", exclude_none=True)
    del group["input_activations"]
    with pytest.raises(ValueError, match=r"config_groups.group_0.input_activations: None is not supported"):
        from_checkpoint({"quant_method": "compressed-tensors", "config_groups": {"group_0": group}})
    with pytest.raises(ValueError, match=r"kv_cache_quant_algo: a quantized KV cache \('FP8'\)"):
        from_checkpoint({"quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}})
