"""Prefetch offload: the weights of some decoder layers live in host memory (pinned on CUDA); each runs from one
of `prefetch_step + 1` device slots, filled by a copy issued `prefetch_step` offloaded layers ahead on a side
stream, so the copy of layer j + k overlaps the compute of layers j ... j + k - 1 (vLLM's prefetch offloader
schedule, written from its description).

Which layers: every other decoder layer from the last one backwards, until `cpu_offload_gb` of weights is
covered (at least one layer): an offloaded layer is never next to another, so each copy has a resident layer's
compute to hide behind. The layers' parameters and buffers keep their names and shapes; their storage becomes
the slot's, so the model runs unchanged, eagerly or through CUDA graphs (which capture the copies and the event
waits: the side stream joins the capture through the events).

Ordering on CUDA: before layer j runs, the compute stream waits for j's copy; then an event recorded on the
compute stream (everything up to the previous layer enqueued) is waited on by the side stream, which copies
layer j + k into the slot that layer j - 1 used. On the CPU every copy is synchronous."""

from __future__ import annotations

import torch
from torch import nn

from runner.model.offload.base import Offloader, choose_layers, host_copy, layer_tensors


class PrefetchOffloader(Offloader):
    def attach(self, model: nn.Module) -> None:
        layers = list(model.model.layers)
        self.offloaded = choose_layers(layers, self.config.cpu_offload_gb, stride=2)
        shapes = {n: (t.shape, t.dtype) for n, t in layer_tensors(layers[self.offloaded[0]]).items()}
        for i in self.offloaded:
            if {n: (t.shape, t.dtype) for n, t in layer_tensors(layers[i]).items()} != shapes:
                raise ValueError(f"cpu_offload_gb: decoder layer {i} differs in its tensors; cannot share slots")
        device = self.device
        self.cuda = device.type == "cuda"
        nslots = min(len(self.offloaded), self.config.prefetch_step + 1)
        self.slots = [
            {n: torch.empty(s, dtype=d, device=device) for n, (s, d) in shapes.items()} for _ in range(nslots)
        ]
        for j, i in enumerate(self.offloaded):
            host = {}
            for name, t in layer_tensors(layers[i]).items():
                host[name] = host_copy(t, self.cuda)
                t.data = self.slots[j % nslots][name]  # the layer now reads its slot
            self.host.append(host)
        self.position = {i: j for j, i in enumerate(self.offloaded)}
        self.stream = torch.cuda.Stream(device) if self.cuda else None
        self.ready = [torch.cuda.Event() if self.cuda else None for _ in self.offloaded]
        self.log: list[tuple[str, int]] | None = None  # ("copy" | "run", layer) when a test records the order
        self.handles.append(model.register_forward_pre_hook(lambda module, args: self._start()))  # each forward
        for i, layer in enumerate(layers):
            self.handles.append(layer.register_forward_pre_hook(lambda module, args, i=i: self._before(i)))

    def release(self) -> None:
        self.slots, self.ready, self.stream = [], [], None

    def _copy(self, j: int) -> None:
        """Fill offloaded layer j's slot from host memory (on the side stream, after what is enqueued now)."""
        slot = self.slots[j % len(self.slots)]
        if self.log is not None:
            self.log.append(("copy", self.offloaded[j]))
        if not self.cuda:
            for name, src in self.host[j].items():
                slot[name].copy_(src)
            return
        compute = torch.cuda.current_stream()
        self.stream.wait_stream(compute)
        with torch.cuda.stream(self.stream):
            for name, src in self.host[j].items():
                slot[name].copy_(src, non_blocking=True)
            self.ready[j].record(self.stream)

    def _start(self) -> None:
        for j in range(min(self.config.prefetch_step, len(self.offloaded))):
            self._copy(j)

    def _before(self, i: int) -> None:
        if self.log is not None:
            self.log.append(("run", i))
        j = self.position.get(i)
        if j is None:
            return
        if self.cuda:
            torch.cuda.current_stream().wait_event(self.ready[j])
        if j + self.config.prefetch_step < len(self.offloaded):
            self._copy(j + self.config.prefetch_step)
