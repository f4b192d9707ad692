"""A linear layer's quantization scheme: how its weight is stored, prepared and multiplied (vLLM's
`LinearMethodBase` split, written from its description).

- `create_weights(layer)`: the parameters the checkpoint fills, each with a `weight_loader(param, tensor,
  shard_id=None)` that copies a shard into its row slice.
- `process_weights_after_loading(layer)`: once every shard is in, turn the loaded tensors into what `apply`
  reads (quantize, pad, repack, transpose). Runs once: a second call is an error, never a second conversion.
- `apply(layer, x)`: y = x W^T in the activation dtype.

An online scheme quantizes an unquantized checkpoint while it loads. Its weight is allocated only when the
first shard of the layer arrives, and is freed by `process_weights_after_loading`, which the layer runs as soon
as its last shard arrived: the peak is the quantized model plus one layer's unquantized weight.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn


class LinearScheme:
    name = "unquantized"
    online = False  # quantizes an unquantized checkpoint as it loads
    takes_fp8_groups = False  # `apply` also takes runner.model.quant.activation.Fp8Groups
    # A producer's names for the scheme's checkpoint tensors where they differ from the scheme's own (e.g.
    # compressed-tensors' "weight_packed" for MXFP4 codes): set by the QuantConfig (`make_scheme`)
    checkpoint_names: Mapping[str, str] = {}

    def tensor_name(self, name: str) -> str:
        """The checkpoint's name of the scheme's tensor `name` (the layer's parameter of that name)."""
        return self.checkpoint_names.get(name, name)

    def create_weights(self, layer: nn.Module) -> None:
        raise NotImplementedError

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        """Default: nothing to convert."""

    def apply(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def describe(self) -> str:
        return self.name


def uses_kernels(x: torch.Tensor) -> bool:
    """The Triton GEMMs run on CUDA in bf16; elsewhere (the CPU tier, fp32) the references do."""
    return kernels_run_on(x.device, x.dtype)


def kernels_run_on(device: torch.device, dtype: torch.dtype) -> bool:
    """`uses_kernels` for activations of `dtype` on `device`, before any exist (a layer's weights at load)."""
    return device.type == "cuda" and dtype == torch.bfloat16


def check_scales(name: str, scales: torch.Tensor) -> None:
    """ValueError naming `name` and the first entry where a checkpoint's scales are not finite and > 0 (a zero
    or NaN scale would silently zero or poison its rows)."""
    bad = ~(torch.isfinite(scales) & (scales > 0))
    if bool(bad.any()):
        at = tuple(int(i) for i in bad.nonzero()[0])
        raise ValueError(f"{name}: must be finite and > 0, got {float(scales[at])} at {list(at)}")
