"""Programmatic dependent launch (`kernels._pdl`): who gets it, and on a GPU that has it, that a kernel launched
with it really starts before its predecessor ends (so the wait is load-bearing) and that the wait orders it.

Every tier: `launch_args` gives PDL exactly where `packed_ptx` holds (NVIDIA sm_90+, not the interpreter), and
TOUCHSTONE_PDL=0 turns it off. On such a GPU, a writer kernel releases its dependents at once and then spins for
a fixed stretch of GPU time (globaltimer, not a loop count) before it sets a flag; a reader launched with PDL
reads the flag. Through `wait_then_release` it reads 1; the negative control, the same reader without the wait,
reads 0: it ran while the writer was still spinning, which is what makes the wait necessary in every PDL kernel.
"""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, globaltimer

from kernels import _pdl
from kernels._packed_ptx import packed_ptx
from kernels._pdl import wait_then_release

SPIN_NS = 2_000_000  # the writer's spin: 2 ms, about 1000 times a kernel launch


@triton.jit
def _slow_writer(flag_ptr, spin_ns):
    gdc_launch_dependents()  # the reader may start now
    start = globaltimer()
    while globaltimer() - start < spin_ns:
        pass
    tl.store(flag_ptr, 1)


@triton.jit
def _reader(flag_ptr, out_ptr, WAIT: tl.constexpr):
    wait_then_release(WAIT)
    tl.store(out_ptr, tl.load(flag_ptr))


def test_launch_args_follow_the_ptx_devices(monkeypatch, device):
    dev = torch.device(device)
    want = {"PDL": True, "launch_pdl": True} if packed_ptx(dev) else {"PDL": False}
    assert _pdl.launch_args(dev) == want
    monkeypatch.setenv("TOUCHSTONE_PDL", "0")
    assert _pdl.launch_args(dev) == {"PDL": False}
    assert _pdl.launch_args(torch.device("cpu")) == {"PDL": False}


@pytest.mark.gpu_only(reason="programmatic dependent launch is a CUDA launch attribute (sm_90+)")
@pytest.mark.parametrize("wait", [True, False], ids=["waits", "no_wait_control"])
def test_the_wait_orders_a_dependent_that_starts_early(device, wait):
    if not packed_ptx(torch.device(device)):
        pytest.skip("PDL needs NVIDIA sm_90+")
    flag = torch.zeros(1, dtype=torch.int32, device=device)
    out = torch.full((1,), -1, dtype=torch.int32, device=device)
    # compile both first: a reader compiled between the launches would start after the whole spin
    _slow_writer[(1,)](out, 0)
    _reader[(1,)](flag, out, WAIT=wait, launch_pdl=True)
    flag.zero_()
    out.fill_(-1)  # the warm-up stored into it: a reader that never stored must not pass
    torch.cuda.synchronize()
    _slow_writer[(1,)](flag, SPIN_NS)
    _reader[(1,)](flag, out, WAIT=wait, launch_pdl=True)
    torch.cuda.synchronize()
    assert flag.item() == 1
    # With the wait the reader sees the write; without it, it ran during the spin (PDL really overlaps them).
    assert out.item() == (1 if wait else 0)
