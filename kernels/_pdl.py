"""Programmatic dependent launch (PDL) for the kernels of a decode step, on NVIDIA sm_90 and later.

A kernel launched with PDL (`launch_pdl=True`, CUDA's programmatic stream serialization) may start while the
kernel before it in the stream is still running: its programs get resident, and in a CUDA graph its launch
overlaps the earlier kernel's tail instead of following it. The CUDA programming guide's "Programmatic Dependent
Launch and Synchronization" and PTX's `griddepcontrol` give the rules this module keeps:

- Every program of a PDL kernel runs `griddepcontrol.wait` (`wait_then_release`) before it reads anything an
  earlier kernel may have written, and before it writes anything: the wait returns once the kernel before it has
  completed and its memory is visible. Since every PDL kernel waits, the order holds transitively down the stream.
- Only reads of what no recent kernel writes may come before the wait: a GEMV's weights (`kernels.
  w4a16_mxfp4_fragment_gemv` issues its first loads of them there). A caller that writes weights (loading, a
  weight update) must not launch the reading GEMV as the very next kernel without a stream or device sync between.
- Reads of what a kernel two or more launches back wrote may also come before the wait when every kernel between
  runs the wait before `launch_dependents` (as `wait_then_release` does): the kernel just before released this one
  only after its own wait returned, so that writer had completed. The MoE fragment layer's second GEMV
  (`kernels.mxfp4_moe_fragment_gemv`, `early`) reads the alignment and its first weights so.
- Right after the wait each program runs `griddepcontrol.launch_dependents`, so the next kernel's programs start
  only once this one's predecessor is done: at most two kernels are resident at a time, the running one and the
  next, which issues its weight loads and waits. (Releasing before the wait in the small kernels between GEMVs,
  so that the next GEMV is resident during the previous one's last wave, ran the Llama-3.1-8B-shape MXFP4 decode
  at batch 1 at 382 tok/s on the H200 against 414 this way, in one run.)

Elsewhere (the interpreter, ROCm, NVIDIA before sm_90) `launch_args` gives `PDL=False` and both instructions
compile away. `TOUCHSTONE_PDL=0` turns PDL off on every device (an A/B switch for benchmarks).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from kernels._packed_ptx import packed_ptx


def pdl(device: torch.device) -> bool:
    """Whether kernels on `device` launch with PDL: NVIDIA sm_90+ (`packed_ptx`), unless TOUCHSTONE_PDL=0."""
    return os.environ.get("TOUCHSTONE_PDL", "1") != "0" and packed_ptx(device)


def launch_args(device: torch.device) -> dict:
    """Keyword arguments for a launch on `device` of a kernel with a `PDL: tl.constexpr` parameter."""
    return {"PDL": True, "launch_pdl": True} if pdl(device) else {"PDL": False}


@triton.jit
def wait_then_release(PDL: tl.constexpr):
    """Wait for the kernel before this one (its writes visible), then let the next one start (with PDL only)."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
