"""Which scheme each linear layer of a model gets. Model-independent: a `QuantConfig` maps checkpoint layer
names (HF's, e.g. "model.layers.0.self_attn.q_proj") to a scheme name; the model class declares how its fused
layers are made of checkpoint layers (`packed_modules_mapping`), which the model gives the config it is built
with (`for_model`: a new read-only copy, the config's own entries on top, so that neither the class's mapping
nor another model's config is changed), and `scheme_for` answers for a fused layer only when all its parts
agree. The parsers of producers' configs (runner.model.quant.checkpoint_config) and
`online_config` build one."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from types import MappingProxyType

from runner.model.quant.scheme import LinearScheme

SCHEMES = ("fp8", "fp8_block", "mxfp4", "nvfp4")  # online (quantization=...) and in checkpoints


def make_scheme(
    name: str, online: bool, w13_policy: str = "use_w1", options: Mapping[str, object] | None = None
) -> LinearScheme:
    """A new scheme object: `online` quantizes an unquantized checkpoint while it loads, else the checkpoint
    holds the scheme's tensors. `options`: how a producer stores them, where it differs from the scheme's
    defaults: "tensor_names" ({the scheme's tensor name: the producer's}) for any scheme, and the scheme's own
    keyword arguments (nvfp4 and nvfp4_w4a4: "global_scale"; mxfp4_w4a4: "input_scale_mode"; fp8_channel:
    "scale_shape")."""
    from runner.model.quant.fp4_w4a4 import Mxfp4W4A4, Nvfp4W4A4
    from runner.model.quant.fp8_block import Fp8Block
    from runner.model.quant.fp8_channel import Fp8PerChannel
    from runner.model.quant.fp8_tensor import Fp8PerTensor
    from runner.model.quant.mxfp4 import Mxfp4W4A16
    from runner.model.quant.nvfp4 import Nvfp4W4A16

    kwargs = dict(options or {})
    tensor_names = kwargs.pop("tensor_names", None)
    if kwargs and name not in ("nvfp4", "nvfp4_w4a4", "mxfp4_w4a4", "fp8_channel"):
        raise ValueError(f"options: the {name} scheme takes none of {sorted(kwargs)}")
    if name == "fp8_block":
        scheme = Fp8Block(online=online)
    elif name == "mxfp4":
        scheme = Mxfp4W4A16(online=online)
    elif name == "nvfp4":
        scheme = Nvfp4W4A16(online=online, w13_policy=w13_policy, **kwargs)
    elif name == "mxfp4_w4a4" and not online:  # checkpoints only: activations fake-quantized too
        scheme = Mxfp4W4A4(**kwargs)
    elif name == "nvfp4_w4a4" and not online:
        scheme = Nvfp4W4A4(w13_policy=w13_policy, **kwargs)
    elif name == "fp8":
        scheme = Fp8PerTensor(online=online)
    elif name == "fp8_static" and not online:  # checkpoints only: a calibrated input scale per layer
        scheme = Fp8PerTensor(online=False, static_input=True)
    elif name == "fp8_channel" and not online:  # checkpoints only: a scale per output row
        scheme = Fp8PerChannel(**kwargs)
    else:
        raise ValueError(f"quantization: scheme {name!r} is not supported {'online' if online else 'in a checkpoint'}")
    if tensor_names:
        scheme.checkpoint_names = dict(tensor_names)
    return scheme


@dataclasses.dataclass(frozen=True)
class QuantConfig:
    name: str  # what produced it: "fp8" (online), "quark", "compressed-tensors", ...
    scheme_of: Callable[[str], str | None]  # checkpoint layer name -> scheme name (None: unquantized)
    online: bool = False
    named_layers: tuple[str, ...] = ()  # layers the config names explicitly: each must exist in the model
    w13_policy: str = "use_w1"  # NVFP4 gate/up parts with different global scales (reference.quant.nvfp4_fused_w13)
    # scheme name -> `make_scheme` options, where a producer stores a scheme's tensors otherwise (compressed-
    # tensors: block-FP8 scales "weight_scale", FP4 codes "weight_packed", NVFP4 encode global scales)
    scheme_options: Mapping[str, Mapping[str, object]] = dataclasses.field(default_factory=dict)
    # fused layer -> the checkpoint layers it is made of: the config's own entries until `for_model`, then the
    # model's with those on top
    packed_modules_mapping: Mapping[str, tuple[str, ...]] = dataclasses.field(
        default_factory=lambda: MappingProxyType({})
    )

    def for_model(self, packed_modules_mapping: Mapping[str, tuple[str, ...]]) -> QuantConfig:
        """This config for a model whose class declares `packed_modules_mapping`: a new config holding a read-only
        copy of it with this config's entries on top; this config and the mapping given are left as they were."""
        merged = {**packed_modules_mapping, **self.packed_modules_mapping}
        return dataclasses.replace(self, packed_modules_mapping=MappingProxyType(merged))

    def scheme_for(self, prefix: str) -> LinearScheme:
        """The scheme of the layer named `prefix` in the model (a fused one by its parts' names, from
        `packed_modules_mapping`); ValueError naming the parts when they disagree."""
        from runner.model.quant.unquantized import Unquantized

        head, _, leaf = prefix.rpartition(".")
        parts = [f"{head}.{p}" if head else p for p in self.packed_modules_mapping.get(leaf, (leaf,))]
        schemes = {p: self.scheme_of(p) for p in parts}
        if len(set(schemes.values())) > 1:
            named = {p: s or "unquantized" for p, s in schemes.items()}
            raise ValueError(f"quantization: the parts of fused layer {prefix!r} have different schemes: {named}")
        scheme = schemes[parts[0]]
        return (
            Unquantized()
            if scheme is None
            else make_scheme(scheme, self.online, self.w13_policy, self.scheme_options.get(scheme))
        )

    def check_layers(self, layer_names: set[str]) -> None:
        """ValueError naming a layer the config names that the model does not have."""
        for name in self.named_layers:
            if name not in layer_names:
                raise ValueError(f"quantization: the config names layer {name!r}, which this model does not have")


def online_config(name: str) -> QuantConfig:
    """The config of `LLM(..., quantization=name)`: every decoder linear layer, the head excluded."""
    if name not in SCHEMES:
        raise ValueError(f"quantization: must be one of {sorted(SCHEMES)}, got {name!r}")
    return QuantConfig(name, lambda layer: None if layer == "lm_head" else name, online=True)
