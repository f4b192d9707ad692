"""Which scheme each linear layer of a model gets. Model-independent: a `QuantConfig` maps checkpoint layer
names (HF's, e.g. "model.layers.0.self_attn.q_proj") to a scheme; the model class declares how its fused
layers are made of checkpoint layers (`packed_modules_mapping`), and `scheme_for` answers for a fused layer
only when all its parts agree."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

from runner.model.quant.scheme import LinearScheme


@dataclasses.dataclass(frozen=True)
class QuantConfig:
    name: str
    make: Callable[[], LinearScheme]  # a new scheme object for a quantized layer
    excluded: Callable[[str], bool] = lambda layer: False  # layers left unquantized

    def scheme_for(self, prefix: str, packed_modules_mapping: Mapping[str, tuple[str, ...]]) -> LinearScheme:
        """The scheme of the layer named `prefix` in the model (a fused one by its parts' names); ValueError
        naming the parts when they disagree."""
        from runner.model.quant.unquantized import Unquantized

        head, _, leaf = prefix.rpartition(".")
        parts = [f"{head}.{p}" if head else p for p in packed_modules_mapping.get(leaf, (leaf,))]
        excluded = {p: self.excluded(p) for p in parts}
        if len(set(excluded.values())) > 1:
            schemes = {p: "unquantized" if e else self.name for p, e in excluded.items()}
            raise ValueError(f"quantization: the parts of fused layer {prefix!r} have different schemes: {schemes}")
        return Unquantized() if all(excluded.values()) else self.make()


def online_config(name: str) -> QuantConfig:
    """The config of `LLM(..., quantization=name)`: every decoder linear layer, the head excluded."""
    from runner.model.quant.fp8_block import Fp8Block
    from runner.model.quant.fp8_tensor import Fp8PerTensor
    from runner.model.quant.mxfp4 import Mxfp4W4A16

    schemes = {"fp8": Fp8PerTensor, "fp8_block": Fp8Block, "mxfp4": Mxfp4W4A16}
    if name not in schemes:
        raise ValueError(f"quantization: must be one of {sorted(schemes)}, got {name!r}")
    return QuantConfig(name, schemes[name], excluded=lambda layer: layer == "lm_head")
