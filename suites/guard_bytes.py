"""Guard bytes and poisoned memory for kernel tests: the bug class where a kernel reads or writes just past a
tensor and gets away with it because the bytes there happen to be zeros (the Hopper MXFP4 scale read past the
end of its buffer, which produced NaNs only when memory was not zero).

- `Guards.guarded(name, t)`: a copy of t at the front of a larger buffer whose next GUARD_BYTES bytes are
  POISON (0xFF: NaN in bf16, fp16, fp32 and E8M0, -NaN in E4M3, the largest code in the integer formats). A
  read past the end picks up poison, so the result is NaN or far off; a write past the end changes a guard
  byte, which `assert_intact` reports with its offset.
- `fill_free_memory(device, POISON)`: fills memory torch's caching allocator holds but has not handed out, so
  the outputs and workspaces a kernel allocates next start as NaN / 0xFF instead of stale zeros.
- `poisoned_allocations(device)`: the same on any device while the context is open: on the CPU every tensor an
  allocating op returns is filled (the CPU allocator hands back fresh pages of zeros or a freed tensor's stale
  values, which passed an unwritten row by luck).
- `assert_guarded_call_agrees(call, inputs, device)`: the call with zeroed surroundings and with poisoned
  ones must give the same bytes and leave every guard byte as it was.

Under compute-sanitizer (`python -m suites.sanitize`) the caching allocator is off
(PYTORCH_NO_CUDA_MEMORY_CACHING=1): every tensor is its own cudaMalloc, so memcheck sees an access past a
tensor's end as one past its allocation."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch.utils._python_dispatch import TorchDispatchMode

GUARD_BYTES = 256
POISON = 0xFF
CLEAN = 0x00
SMALL_REQUEST = 1 << 20  # torch's caching allocator serves requests up to 1 MiB from a pool of its own


class Guards:
    """The guard regions after the tensors `guarded` made, all filled with `fill`, checked after the call."""

    def __init__(self, fill: int = POISON) -> None:
        self.fill = fill
        self.regions: list[tuple[str, torch.Tensor]] = []

    def guarded(self, name: str, t: torch.Tensor) -> torch.Tensor:
        """A contiguous copy of `t` followed by GUARD_BYTES of `fill` in the same allocation."""
        nbytes = t.numel() * t.element_size()
        buffer = torch.full((nbytes + GUARD_BYTES,), self.fill, dtype=torch.uint8, device=t.device)
        view = buffer[:nbytes].view(t.dtype).view(t.shape)
        view.copy_(t)
        self.regions.append((name, buffer[nbytes:]))
        return view

    def assert_intact(self) -> None:
        for name, region in self.regions:
            changed = (region != self.fill).nonzero().flatten()
            assert changed.numel() == 0, (
                f"{name}: {changed.numel()} of the {GUARD_BYTES} guard bytes after it changed, the first at byte "
                f"{int(changed[0])} past its end"
            )


def fill_free_memory(device: torch.device | str, value: int, nbytes: int = 64 << 20) -> None:
    """Fill the caching allocator's free memory on a CUDA device with `value` (no-op elsewhere): the outputs and
    workspaces allocated next start with those bytes. The cache is emptied first, so the only free blocks left are
    the filled ones, in both of the allocator's pools: one `nbytes` block for requests over SMALL_REQUEST, and as
    many bytes again in SMALL_REQUEST / 2 blocks for the pool that serves the requests up to it from its own
    segments (a kernel test's few-KB workspace; filling only a large block left those at their stale zeros)."""
    if torch.device(device).type != "cuda":
        return
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    half = SMALL_REQUEST // 2
    blocks = [torch.full((nbytes,), value, dtype=torch.uint8, device=device)]
    blocks += [torch.full((half,), value, dtype=torch.uint8, device=device) for _ in range(nbytes // half)]
    torch.cuda.synchronize(device)
    del blocks  # back to the allocator's free lists: the next allocations reuse them


# aten's allocating ops, whose results `poisoned_allocations` fills on the CPU
_ALLOCATIONS = frozenset(
    {
        torch.ops.aten.empty.memory_format,
        torch.ops.aten.empty_strided.default,
        torch.ops.aten.empty_like.default,
        torch.ops.aten.new_empty.default,
        torch.ops.aten.new_empty_strided.default,
    }
)


def poison_value(dtype: torch.dtype) -> int:
    """The byte a new tensor of `dtype` is filled with: POISON (NaN) for floating types; 0x7F for integers (a
    large positive value, out of range as an index, where 0xFF would read as the -1 the kernels use for "none");
    0x01 for bool (the only byte other than 0 that is a valid bool)."""
    if dtype.is_floating_point or dtype.is_complex:
        return POISON
    return 0x01 if dtype == torch.bool else 0x7F


class _PoisonNewTensors(TorchDispatchMode):
    """Fills the whole storage of every tensor an allocating op returns with `poison_value` of its dtype."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in _ALLOCATIONS and out.untyped_storage().nbytes():
            torch.empty(0, dtype=torch.uint8, device=out.device).set_(out.untyped_storage()).fill_(
                poison_value(out.dtype)
            )
        return out


@contextmanager
def poisoned_allocations(device: torch.device | str) -> Iterator[None]:
    """While open, the tensors allocated on `device` start poisoned: on CUDA through `fill_free_memory` (once, on
    entry); elsewhere every allocating aten op's result (`torch.empty`, `new_empty`, `empty_like`, strided and
    non-contiguous ones included) is filled with `poison_value` of its dtype."""
    if torch.device(device).type == "cuda":
        fill_free_memory(device, POISON)
        yield
        return
    with _PoisonNewTensors():
        yield


def _bytes(out) -> list[torch.Tensor]:
    outs = out if isinstance(out, tuple | list) else (out,)
    return [o.detach().contiguous().view(-1).view(torch.uint8).cpu() for o in outs]


def assert_guarded_call_agrees(call, inputs: dict[str, torch.Tensor], device: str) -> None:
    """`call(**inputs)` twice on `device`: with zeroed guard bytes after every input and zeroed free memory,
    then with POISON in both. The outputs must be byte-identical and every guard byte unchanged: a read past
    an input's end, or an output element left unwritten, shows as a difference (NaN or 0xFF against zero)."""
    runs = []
    for fill in (CLEAN, POISON):
        guards = Guards(fill)
        args = {name: guards.guarded(name, t.to(device)) for name, t in inputs.items()}
        fill_free_memory(device, fill)
        runs.append(_bytes(call(**args)))
        guards.assert_intact()
    for i, (clean, poisoned) in enumerate(zip(*runs, strict=True)):
        differ = (clean != poisoned).nonzero().flatten()
        assert differ.numel() == 0, (
            f"output {i}: {differ.numel()} bytes differ between zeroed and poisoned surroundings, the first at "
            f"byte {int(differ[0])}: the kernel reads past an input or leaves part of its output unwritten"
        )
