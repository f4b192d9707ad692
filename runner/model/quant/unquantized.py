"""The unquantized scheme: one weight [out, in] in the model dtype, y = F.linear(x, W)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from runner.model.quant.scheme import LinearScheme


class Unquantized(LinearScheme):
    name = "unquantized"

    def create_weights(self, layer) -> None:
        layer.register_parameter("weight", layer.new_param((layer.out_features, layer.in_features), layer.dtype))

    def apply(self, layer, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, layer.weight)
