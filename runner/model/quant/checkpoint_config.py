"""Producers' quantization configs -> a QuantConfig (which scheme each checkpoint layer holds).

Read, by each format's published description:
- HF fine-grained FP8 (config.json `quantization_config`): {"quant_method": "fp8", "weight_block_size": [128,
  128], "activation_scheme": "dynamic", "modules_to_not_convert": [...]}: `weight` E4M3 + `weight_scale_inv`.
- compressed-tensors (`quant_method` "compressed-tensors"): `config_groups` (targets: "Linear" or "re:<regex>"
  on layer names), `ignore`; parsed with the compressed-tensors library's own pydantic model. A group of 8-bit
  float weights with strategy "block" [128, 128] and dynamic group-128 activations is fp8_block (its FP8_BLOCK
  preset; the scales are `weight_scale`); per-channel 8-bit float weights with dynamic per-token activations
  (its FP8_DYNAMIC preset) are fp8_channel (`weight`, `weight_scale` [N, 1]); 4-bit float weights in groups of 32
  without activation quantization (MXFP4A16) are mxfp4 (`weight_packed`, E8M0 `weight_scale`), in tensor groups of
  16 (NVFP4A16) nvfp4 (`weight_packed`, E4M3 `weight_scale`, `weight_global_scale` the encode scale); with 4-bit
  float activations (its MXFP4 and NVFP4 presets: dynamic group 32; tensor_group 16 under a calibrated
  `input_global_scale`, encode) mxfp4_w4a4 and nvfp4_w4a4 (`runner.model.quant.fp4_w4a4`); per-tensor 8-bit
  float weights with static per-tensor activations (its FP8 preset) are fp8_static (`weight`, `weight_scale`,
  `input_scale`), with dynamic per-token activations fp8.
- AMD Quark (`quant_method` "quark"): `global_quant_config`, `layer_quant_config` (fnmatch patterns on layer
  names, the first match wins), `exclude`. Weight dtype "fp4", per_group 32, scale_format "e8m0", no input
  quantization: mxfp4 (W4A16); `weight` uint8 [N, K/2] + `weight_scale` uint8 [N, K/32]; with dynamic input
  tensors of the same format: mxfp4_w4a4, in the inputs' `scale_calculation_mode`. Weight "fp8_e4m3" per_channel
  (axis 0) with dynamic "fp8_e4m3" per_channel inputs along axis 1 (per token; its PTPC scheme): fp8_channel
  (`weight_scale` [N]). Weight "fp8_e4m3"
  per_tensor with static per_tensor "fp8_e4m3" input tensors: fp8_static; layers of both kinds may mix.
- ModelOpt (hf_quant_config.json, {"quantization": {"quant_algo": ..., "exclude_modules": [...]}}): NVFP4
  (nvfp4_w4a4: `weight` uint8, `weight_scale` E4M3 [N, K/16], `weight_scale_2` and `input_scale` the decode
  global scales per part); FP8: fp8_static (`weight` E4M3, `weight_scale`, `input_scale` per
  part); MIXED_PRECISION: `quantized_layers` ({layer: {"quant_algo": "FP8" | "NVFP4", "group_size": 16}}) gives
  each listed layer its scheme, the others stay unquantized. A quantized KV cache (`kv_cache_quant_algo`) is
  refused by name.
Anything else is refused with the key that could not be read."""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping

from runner.model.quant.config import QuantConfig


def _fail(key: str, why: str) -> ValueError:
    return ValueError(f"quantization_config.{key}: {why}")


def _explicit(names) -> tuple[str, ...]:
    """The plain layer names among patterns (no wildcard, no regex): those must exist in the model."""
    return tuple(n for n in names if not n.startswith("re:") and not any(c in n for c in "*?[]"))


def from_checkpoint(config: Mapping) -> QuantConfig:
    """The QuantConfig of a checkpoint's quantization config (HF `quantization_config`, or ModelOpt's
    hf_quant_config.json content)."""
    if "quantization" in config and "quant_method" not in config:
        return _modelopt(config["quantization"])
    method = config.get("quant_method")
    if method == "fp8":
        return _hf_fp8(config)
    if method == "compressed-tensors":
        return _compressed_tensors(config)
    if method == "quark":
        return _quark(config)
    if method == "modelopt":
        return _modelopt(config)
    raise _fail("quant_method", f"unknown {method!r}; known: fp8, compressed-tensors, quark, modelopt")


def _hf_fp8(config: Mapping) -> QuantConfig:
    block = config.get("weight_block_size")
    if block != [128, 128]:
        raise _fail("weight_block_size", f"only [128, 128] (block FP8) is supported, got {block!r}")
    if config.get("activation_scheme", "dynamic") != "dynamic":
        raise _fail("activation_scheme", f"only dynamic is supported, got {config.get('activation_scheme')!r}")
    skip = tuple(config.get("modules_to_not_convert") or ())

    def scheme_of(layer: str) -> str | None:
        skipped = any(layer == s or layer.endswith("." + s) or s in layer.split(".") for s in skip)
        return None if skipped else "fp8_block"

    return QuantConfig("fp8", scheme_of, named_layers=tuple(s for s in skip if "." in s))


def _matches(target: str, layer: str) -> bool:
    if target.startswith("re:"):
        return re.match(target[3:], layer) is not None
    return target == "Linear" or layer == target or layer.endswith("." + target)


def _plain(value):
    """An enum member's value (compressed-tensors' DynamicType.LOCAL -> "local"); anything else as it is."""
    return getattr(value, "value", value)


def _compressed_tensors_scheme(key: str, w, a) -> str:
    weights = (w.type, w.num_bits, str(getattr(w.strategy, "value", w.strategy)), list(w.block_structure or []))
    acts = None if a is None else (a.type, a.num_bits, str(getattr(a.strategy, "value", a.strategy)), _plain(a.dynamic))
    if weights == ("float", 8, "block", [128, 128]):
        if a is None or not a.dynamic or a.strategy != "group" or a.group_size != 128:
            raise _fail(f"config_groups.{key}.input_activations", "block FP8 needs dynamic group-128 activations")
        return "fp8_block"
    if weights[:3] == ("float", 4, "group") and w.group_size == 32:  # its MXFP4A16 and MXFP4 presets
        if a is None:
            return "mxfp4"
        if acts == ("float", 4, "group", True) and a.group_size == 32:
            return "mxfp4_w4a4"
        raise _fail(
            f"config_groups.{key}.input_activations",
            f"{acts} is not supported with MXFP4 weights (supported: none, float 4-bit dynamic group 32)",
        )
    if weights[:3] == ("float", 4, "tensor_group") and w.group_size == 16:  # its NVFP4A16 and NVFP4 presets
        if a is None:
            return "nvfp4"
        if acts == ("float", 4, "tensor_group", "local") and a.group_size == 16:
            return "nvfp4_w4a4"
        raise _fail(
            f"config_groups.{key}.input_activations",
            f"{acts} is not supported with NVFP4 weights (supported: none, float 4-bit tensor_group 16 dynamic local)",
        )
    if weights[:3] == ("float", 8, "channel"):
        if acts != ("float", 8, "token", True):
            raise _fail(
                f"config_groups.{key}.input_activations",
                f"{acts} is not supported with per-channel FP8 weights (supported: float 8-bit dynamic per token)",
            )
        return "fp8_channel"
    if weights[:3] == ("float", 8, "tensor"):
        if acts == ("float", 8, "tensor", False):
            return "fp8_static"
        if acts == ("float", 8, "token", True):
            return "fp8"
        raise _fail(
            f"config_groups.{key}.input_activations",
            f"{acts} is not supported with per-tensor FP8 weights (supported: float 8-bit static per tensor, "
            "dynamic per token)",
        )
    raise _fail(
        f"config_groups.{key}.weights",
        f"{w.type} {w.num_bits}-bit strategy {weights[2]} {w.block_structure} is not supported "
        "(supported: float 8-bit block [128, 128], float 8-bit channel, float 8-bit tensor, float 4-bit group 32, "
        "float 4-bit tensor_group 16)",
    )


# How compressed-tensors stores the schemes' tensors where it differs from the schemes' defaults: block-FP8 scales
# named weight_scale (the same values as HF's weight_scale_inv: dequantized = codes x scale), FP4 codes
# weight_packed, NVFP4's global scales weight_global_scale and input_global_scale in the encode convention
# (vLLM's, 448 * 6 / amax). Its MXFP4 activation scales round "even" (the same bytes as
# reference.quant.mx_scale's "even" on every activation the suites draw).
_NVFP4_NAMES = {"weight": "weight_packed", "weight_scale_2": "weight_global_scale"}
COMPRESSED_TENSORS_OPTIONS = {
    "fp8_block": {"tensor_names": {"weight_scale_inv": "weight_scale"}},
    "mxfp4": {"tensor_names": {"weight": "weight_packed"}},
    "mxfp4_w4a4": {"tensor_names": {"weight": "weight_packed"}, "input_scale_mode": "even"},
    "nvfp4": {"tensor_names": _NVFP4_NAMES, "global_scale": "encode"},
    "nvfp4_w4a4": {"tensor_names": {**_NVFP4_NAMES, "input_scale": "input_global_scale"}, "global_scale": "encode"},
}


def _compressed_tensors(config: Mapping) -> QuantConfig:
    from compressed_tensors.quantization import QuantizationConfig

    parsed = QuantizationConfig.model_validate(dict(config))
    groups = []
    for key, group in parsed.config_groups.items():
        w, a = group.weights, group.input_activations
        if w is None:
            raise _fail(f"config_groups.{key}.weights", "a group without weight quantization is not supported")
        groups.append((tuple(group.targets), _compressed_tensors_scheme(key, w, a)))
    ignore = tuple(parsed.ignore or ())

    def scheme_of(layer: str) -> str | None:
        if any(_matches(t, layer) and t != "Linear" for t in ignore):
            return None
        return next((scheme for targets, scheme in groups if any(_matches(t, layer) for t in targets)), None)

    named = _explicit(i for i in ignore if "." in i)
    return QuantConfig("compressed-tensors", scheme_of, named_layers=named, scheme_options=COMPRESSED_TENSORS_OPTIONS)


# Quark's MXFP4 scale modes that give reference.quant.mx_scale's bytes under the same name (its fake_quantize_mx
# against quantize_mxfp4 on the suites' activations; Quark's "rceil" gives "even"'s bytes, so it is refused)
QUARK_SCALE_MODES = ("even", "floor", "ceil")


def _quark_mx_inputs(inputs: Mapping) -> tuple:
    keys = ("dtype", "qscheme", "group_size", "scale_format", "is_dynamic")
    return tuple(inputs.get(k) for k in keys)


def _quark_scheme(spec: Mapping | None, key: str, modes: dict[str, str]) -> str | None:
    """The scheme of one Quark layer spec; an MXFP4 W4A4 spec's activation scale mode goes into `modes`."""
    if spec is None:
        return None
    weight, inputs = spec.get("weight"), spec.get("input_tensors")
    if weight is None:
        return None
    if weight.get("dtype") == "fp8_e4m3" and weight.get("qscheme") == "per_tensor":
        got = None if inputs is None else (inputs.get("dtype"), inputs.get("qscheme"), inputs.get("is_dynamic"))
        if got == ("fp8_e4m3", "per_tensor", False):
            return "fp8_static"
        raise _fail(f"{key}.input_tensors", f"{got} is not supported with FP8 weights (supported: static per_tensor)")
    if weight.get("dtype") == "fp8_e4m3" and weight.get("qscheme") == "per_channel" and weight.get("ch_axis") == 0:
        # its PTPC scheme: per-channel weights, activations per token at run time (per_channel along axis 1)
        got = None if inputs is None else tuple(inputs.get(k) for k in ("dtype", "qscheme", "ch_axis", "is_dynamic"))
        if got == ("fp8_e4m3", "per_channel", 1, True):
            return "fp8_channel"
        raise _fail(
            f"{key}.input_tensors",
            f"{got} is not supported with per-channel FP8 weights (supported: fp8_e4m3 per_channel axis 1 dynamic, "
            "per token)",
        )
    got = (weight.get("dtype"), weight.get("qscheme"), weight.get("group_size"), weight.get("scale_format"))
    if got == ("fp4", "per_group", 32, "e8m0"):
        if inputs is None:
            return "mxfp4"
        mode = inputs.get("scale_calculation_mode", "even")
        if _quark_mx_inputs(inputs) != ("fp4", "per_group", 32, "e8m0", True) or mode not in QUARK_SCALE_MODES:
            raise _fail(
                f"{key}.input_tensors",
                f"{_quark_mx_inputs(inputs)} scale_calculation_mode {mode!r} is not supported with MXFP4 weights "
                f"(supported: none, or fp4 per_group 32 e8m0 dynamic, scale_calculation_mode one of "
                f"{', '.join(QUARK_SCALE_MODES)})",
            )
        modes[key] = mode
        return "mxfp4_w4a4"
    if inputs is not None:
        raise _fail(f"{key}.input_tensors", "activation quantization is only supported with FP8 and MXFP4 weights")
    raise _fail(
        f"{key}.weight",
        f"{got} is not supported (supported: fp4 per_group 32 e8m0, i.e. MXFP4; fp8_e4m3 per_tensor)",
    )


def _quark(config: Mapping) -> QuantConfig:
    modes: dict[str, str] = {}
    default = _quark_scheme(config.get("global_quant_config"), "global_quant_config", modes)
    per_layer = [
        (pattern, _quark_scheme(spec, f"layer_quant_config.{pattern}", modes))
        for pattern, spec in (config.get("layer_quant_config") or {}).items()
    ]
    if len(set(modes.values())) > 1:
        raise _fail(
            f"{list(modes)[-1]}.input_tensors.scale_calculation_mode",
            f"MXFP4 activation scale modes differ between layers ({modes}); one mode per checkpoint is supported",
        )
    # its per-channel scales are vectors [N]
    options = {"fp8_channel": {"scale_shape": "vector"}}
    if modes:
        options["mxfp4_w4a4"] = {"input_scale_mode": next(iter(modes.values()))}
    exclude = tuple(config.get("exclude") or ())

    def scheme_of(layer: str) -> str | None:
        if any(fnmatch.fnmatchcase(layer, p) for p in exclude):
            return None
        return next((s for p, s in per_layer if fnmatch.fnmatchcase(layer, p)), default)

    named = _explicit([*exclude, *(p for p, _ in per_layer)])
    named = tuple(n for n in named if "." in n)
    return QuantConfig("quark", scheme_of, named_layers=named, scheme_options=options)


_MODELOPT_SCHEMES = {"NVFP4": "nvfp4_w4a4", "FP8": "fp8_static"}


def _modelopt_scheme(key: str, spec: Mapping) -> str:
    """The scheme of a ModelOpt quant_algo (at `key`: the config, or one layer of a mixed-precision config)."""
    algo = spec.get("quant_algo")
    if algo not in _MODELOPT_SCHEMES:
        raise _fail(f"{key}quant_algo", f"ModelOpt {algo!r} is not supported (supported: {sorted(_MODELOPT_SCHEMES)})")
    if algo == "NVFP4" and spec.get("group_size", 16) != 16:
        raise _fail(f"{key}group_size", f"NVFP4 blocks are 16 wide, got {spec.get('group_size')!r}")
    return _MODELOPT_SCHEMES[algo]


def _modelopt(config: Mapping) -> QuantConfig:
    if config.get("kv_cache_quant_algo") is not None:
        raise _fail("kv_cache_quant_algo", f"a quantized KV cache ({config['kv_cache_quant_algo']!r}) is not supported")
    if config.get("quant_algo") == "MIXED_PRECISION":
        layers = config.get("quantized_layers")
        if not isinstance(layers, Mapping) or not layers:
            raise _fail("quantized_layers", f"MIXED_PRECISION needs its layers' algorithms, got {layers!r}")
        per_layer = {
            name: _modelopt_scheme(f"quantized_layers.{name}.", spec if isinstance(spec, Mapping) else {})
            for name, spec in layers.items()
        }
        return QuantConfig("modelopt", per_layer.get, named_layers=tuple(per_layer))
    exclude, scheme = tuple(config.get("exclude_modules") or ()), _modelopt_scheme("", config)

    def scheme_of(layer: str) -> str | None:
        return None if any(fnmatch.fnmatchcase(layer, p) for p in exclude) else scheme

    return QuantConfig("modelopt", scheme_of, named_layers=tuple(n for n in _explicit(exclude) if "." in n))
