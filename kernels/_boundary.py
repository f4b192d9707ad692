"""Checks every kernel launcher runs at its boundary, with messages that name the argument.

The references already check dtypes and shapes (`reference.*.check_*_args`); these add what only a kernel
cares about: where the tensors live and how their memory is laid out.
"""

from __future__ import annotations

import os
import struct

import torch


def interpreter_active() -> bool:
    """True when Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def runs_interpreted(device: torch.device) -> bool:
    """True when a kernel launched for `device` runs in the interpreter: pick the interpreter's launch shape."""
    return device.type == "cpu" or interpreter_active()


def check_device(**tensors: torch.Tensor) -> torch.device:
    """All tensors on one device, and a device Triton can run on here. Returns that device."""
    devices = {name: t.device for name, t in tensors.items()}
    first_name, first = next(iter(devices.items()))
    for name, dev in devices.items():
        if dev != first:
            raise ValueError(f"{name}: on {dev}, but {first_name} is on {first}; all tensors must share a device")
    if first.type == "cpu" and not interpreter_active():
        raise ValueError(
            f"{first_name}: on cpu, but Triton kernels need a GPU tensor (or TRITON_INTERPRET=1 for the CPU "
            f"interpreter); use the reference implementation on CPU"
        )
    return first


def as_rows(t: torch.Tensor, name: str) -> torch.Tensor:
    """View `t` as [rows, last_dim] without copying; the last dim must be contiguous (stride 1) and the
    leading dims collapsible into one row stride (true for contiguous tensors and for column slices)."""
    if t.dim() and t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{name}: last dim must have stride 1, got strides {t.stride()}; call .contiguous()")
    try:
        return t.view(-1, t.shape[-1]) if t.dim() != 2 else t
    except RuntimeError as err:
        raise ValueError(
            f"{name}: leading dims of shape {tuple(t.shape)} with strides {t.stride()} cannot be viewed as rows; "
            f"call .contiguous()"
        ) from err


def f32_bits(x: float) -> int:
    """The int32 bit pattern of float32(x) (rounded to nearest), for kernels that take an fp32 constant as
    bits; plain `struct`, so a launch allocates no tensor for it."""
    return struct.unpack("<i", struct.pack("<f", x))[0]
