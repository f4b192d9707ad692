"""UVA offload: the weights of some decoder layers live in pinned host memory, and the device reads them there
on every use, over the host link: no device copy, no slot, no side stream. It frees the most device memory per
offloaded byte and costs a host-link read of each offloaded weight every forward (vLLM's "uva" strategy).

Which layers: the last ones, backwards, until `cpu_offload_gb` of weights is covered (at least one layer); with
no copy to hide, they need not alternate with resident ones as the prefetch offloader's do.

The device view: under unified addressing (every 64-bit CUDA platform), memory from `cudaHostAlloc`, which
torch's pinned allocator uses, is reachable from every device at its host address ("Unified Addressing" in the
CUDA Runtime API reference: no `cudaHostGetDevicePointer` needed). That address is handed to torch as bytes
through the CUDA Array Interface (numba's specification, which `torch.as_tensor` reads), then viewed as the
weight's dtype and shape; the view keeps its host tensor alive. vLLM builds the same view in a C++ op; torch
offers none, and the interface needs no extension. The layers' parameters keep their names and shapes; their
storage becomes the view, so the model runs unchanged, eagerly or through CUDA graphs (a graph replays the
same reads of the same host addresses). On the CPU a layer simply reads its host copy."""

from __future__ import annotations

import torch
from torch import nn

from runner.model.offload.base import Offloader, choose_layers, host_copy, layer_tensors


class _PinnedBytes:
    """The CUDA Array Interface (version 3) of a pinned host tensor's bytes; holds the tensor."""

    def __init__(self, host: torch.Tensor) -> None:
        self.host = host
        nbytes = host.nbytes
        self.__cuda_array_interface__ = {
            "shape": (nbytes,),
            "typestr": "|u1",
            "data": (host.data_ptr(), False),
            "strides": None,
            "version": 3,
        }


def device_view(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A tensor on CUDA `device` over the bytes of `host` (pinned, contiguous): no copy, the device reads host
    memory. Refuses what would silently become a copy: torch places the view on the device that was current when
    the pinned memory was allocated, so on a host of several GPUs a model on another one is refused."""
    if host.numel() == 0:  # no bytes to read (and no pinned allocation behind them)
        return torch.empty(host.shape, dtype=host.dtype, device=device)
    if not host.is_pinned() or not host.is_contiguous():
        raise ValueError(f"host: must be pinned and contiguous to be read in place, got pinned={host.is_pinned()}")
    with torch.cuda.device(device):
        view = torch.as_tensor(_PinnedBytes(host), device=device).view(host.dtype).view(host.shape)
    if view.data_ptr() != host.data_ptr():
        raise RuntimeError(f"device_view: torch copied the host bytes to {view.device} instead of viewing them")
    return view


class UvaOffloader(Offloader):
    def attach(self, model: nn.Module) -> None:
        layers = list(model.model.layers)
        self.offloaded = choose_layers(layers, self.config.cpu_offload_gb, stride=1)
        cuda = self.device.type == "cuda"
        for i in self.offloaded:
            host = {}
            for name, t in layer_tensors(layers[i]).items():
                host[name] = host_copy(t, cuda)
                t.data = device_view(host[name], self.device) if cuda else host[name]  # the device memory is freed
            self.host.append(host)
