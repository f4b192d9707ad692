"""Programmatic dependent launch (PDL) for the kernels of a decode step, on NVIDIA sm_90 and later.

A kernel launched with PDL (`launch_pdl=True`, CUDA's programmatic stream serialization) may start while the
kernel before it in the stream is still running: its programs get resident, and in a CUDA graph its launch
overlaps the earlier kernel's tail instead of following it. The CUDA programming guide's "Programmatic Dependent
Launch and Synchronization" and PTX's `griddepcontrol` give the rules this module keeps:

- Every program of a PDL kernel runs `griddepcontrol.wait` (in `pdl_entry`) before it reads anything an earlier
  kernel may have written, and before it writes anything: the wait returns once the kernel before it has
  completed and its memory is visible. Since every PDL kernel waits, the order holds transitively down the stream.
- Only reads of what no recent kernel writes may come before the wait: a GEMV's weights (`kernels.
  w4a16_mxfp4_fragment_gemv` issues its first loads of them there). A caller that writes weights (loading, a
  weight update) must not launch the reading GEMV within two kernels of the write without a stream or device
  sync between.
- `griddepcontrol.launch_dependents` lets the next kernel launch once every program of this one has run it (or
  ended). Where it goes is a launch policy, not a correctness matter: the next kernel waits all the same.
  - GEMMs and GEMVs release after their wait (`launch_args(device)`): the next kernel starts only once this one's
    predecessor is done, in this kernel's last wave.
  - The small kernels between them release first (`launch_args(device, release_first=True)`), so the GEMV after
    a norm or an activation is launched, requests its first weights and waits while the GEMV before the norm
    runs its last wave: at most that GEMV, the small kernels and the next GEMV are resident, and no kernel
    launches before every program of the one before it has started (so none can starve it).

Elsewhere (the interpreter, ROCm, NVIDIA before sm_90) `launch_args` gives `PDL=0` and both instructions compile
away. `TOUCHSTONE_PDL` is the A/B switch for benchmarks: `0` turns PDL off, `wait_first` makes every kernel
release after its wait.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from kernels._packed_ptx import packed_ptx

OFF, WAIT_FIRST, RELEASE_FIRST = 0, 1, 2  # the constexpr PDL a kernel is compiled with


def pdl(device: torch.device) -> bool:
    """Whether kernels on `device` launch with PDL: NVIDIA sm_90+ (`packed_ptx`), unless TOUCHSTONE_PDL=0."""
    return os.environ.get("TOUCHSTONE_PDL", "1") != "0" and packed_ptx(device)


def launch_args(device: torch.device, release_first: bool = False) -> dict:
    """Keyword arguments for a launch on `device` of a kernel with a `PDL: tl.constexpr` parameter that starts with
    `pdl_entry(PDL)`; `release_first` for the small kernels between GEMMs (the module doc)."""
    if not pdl(device):
        return {"PDL": OFF}
    early = release_first and os.environ.get("TOUCHSTONE_PDL", "1") != "wait_first"
    return {"PDL": RELEASE_FIRST if early else WAIT_FIRST, "launch_pdl": True}


@triton.jit
def pdl_entry(PDL: tl.constexpr):
    """Wait for the kernel before this one (its writes visible) and let the next one launch, in PDL's order."""
    if PDL == 1:
        gdc_wait()
        gdc_launch_dependents()
    elif PDL == 2:
        gdc_launch_dependents()
        gdc_wait()
