"""The loading side every online scheme shares: the layer's unquantized weight is allocated when its first
shard arrives (on the meta device until then), filled shard by shard, quantized by the scheme once its last
row is in, then dropped. So a load holds the quantized layers plus one layer's unquantized weight at a time."""

from __future__ import annotations

import torch

from runner.model.quant.scheme import LinearScheme


class OnlineScheme(LinearScheme):
    online = True

    def create_weights(self, layer) -> None:
        # A placeholder the checkpoint's tensors are routed to (its loader fills layer.staging instead).
        shape = (layer.out_features, layer.in_features)
        layer.register_parameter("weight", layer.new_param(shape, layer.dtype, "meta"))

    def process_weights_after_loading(self, layer) -> None:
        w = layer.take_staging()
        del layer.weight
        self.quantize(layer, w)

    def quantize(self, layer, w: torch.Tensor) -> None:
        """Turn the whole unquantized weight w [out, in] into the scheme's buffers on the layer."""
        raise NotImplementedError


def zero_pad_columns(w: torch.Tensor, multiple: int) -> torch.Tensor:
    """w [N, K] with K rounded up to `multiple` by zero columns (zeros never change a block's amax). FP8 codes
    are padded through their bytes (torch pads no float8 tensor; byte 0 is +0 in E4M3)."""
    pad = -w.shape[1] % multiple
    if pad == 0:
        return w
    if w.element_size() == 1 and w.is_floating_point():
        return torch.nn.functional.pad(w.view(torch.uint8), (0, pad)).view(w.dtype)
    return torch.nn.functional.pad(w, (0, pad))
