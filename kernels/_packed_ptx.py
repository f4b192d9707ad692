"""Whether a device runs the kernels' packed-conversion PTX (bf16x2 multiplies, e4m3x2 conversions): NVIDIA
sm_90 and later. Elsewhere (the interpreter, which runs no PTX, ROCm, older NVIDIA GPUs) the kernels take
their portable path, which gives the same bytes."""

from __future__ import annotations

import torch

from kernels import platform
from kernels._boundary import runs_interpreted
from kernels.platform import Platform

PACKED_MIN_CAPABILITY = (9, 0)  # mul.rn.bf16x2 (PTX ISA 7.8) needs sm_90; ptxas refuses it for sm_80 and sm_89


def packed_ptx_runs_on(platform: Platform) -> bool:
    """Whether this platform's GPU runs the packed PTX: NVIDIA (not ROCm) of compute capability 9.0 or later."""
    return platform.is_cuda() and platform.has_device_capability(PACKED_MIN_CAPABILITY)


def packed_ptx(device: torch.device) -> bool:
    """Whether kernels on `device` run the packed PTX."""
    if runs_interpreted(device) or device.type != "cuda":
        return False
    return packed_ptx_runs_on(platform.current_platform)
