"""Minimal Gluon kernels, none of the project's, that show what compute-sanitizer reports for two mechanisms the
block-FP8 Gluon GEMM (`kernels.block_fp8_gemm_wgmma`) is built on. `python -m suites.sanitize` runs each under its
tool and reports the records next to the kernels', so a reader can tell a record of the kernel from one of the
mechanism:

- "ws_handshake" (racecheck): `gl.warp_specialize` with two worker partitions, one waiting on an mbarrier the
  other arrives on; no data passes through shared memory. On the H200 (Triton 3.6) racecheck reports RAW hazards
  on the bytes Triton's warp-specialize dispatch keeps the partition state in: written by the default warps as the
  kernel ends, read by the worker warps at their entry (write at +0x7a0, read at +0x180, the kernel's `def` line;
  racecheck is dynamic: 6 errors in one run, 1 in another). The same partitions without the mbarrier: 0.
- "tma_store" (initcheck): C written only by a TMA store (`tma.async_copy_shared_to_global`) and copied to the
  host. initcheck reports the copy as reading uninitialized bytes (924 records for this 64 x 64 fp32 tile): it
  does not follow the TMA unit's writes. Read on the device instead, each element of a Gluon GEMM output stored
  by TMA was reported, in both of the GEMM's forms, at M = 3, 64, 65 and 200. The project's
  tests check those writes another way: the Gluon GEMM's outputs are allocated from poisoned memory and must be
  bit-equal to the tiled kernel's (suites/gemm/test_block_fp8_gemm.py).

Runs on NVIDIA sm_90 only (Gluon's Hopper ops)."""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

TMA_ROWS, TMA_COLS = 64, 64


@gluon.jit
def _fill(out_ptr, base: gl.constexpr, WARPS: gl.constexpr):
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [WARPS], [0])
    i = gl.arange(0, 32 * WARPS, layout=layout)
    gl.store(out_ptr + gl.program_id(0) * 512 + base + i, i.to(gl.float32) + base)


@gluon.jit
def _wait_then_fill(out_ptr, bar, WARPS: gl.constexpr):
    mbarrier.wait(bar, 0)
    _fill(out_ptr, 128, WARPS)


@gluon.jit
def _fill_then_arrive(out_ptr, bar, WARPS: gl.constexpr):
    _fill(out_ptr, 256, WARPS)
    mbarrier.arrive(bar, count=1)


@gluon.jit
def _ws_handshake_kernel(out_ptr, num_warps: gl.constexpr):
    bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(bar, count=1)
    gl.warp_specialize(
        [(_fill, (out_ptr, 0, 4)), (_wait_then_fill, (out_ptr, bar, 4)), (_fill_then_arrive, (out_ptr, bar, 1))],
        [4, 1],
        [232, 24],
    )
    mbarrier.invalidate(bar)


@gluon.jit
def _tma_store_kernel(c_desc, num_warps: gl.constexpr):
    layout: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [num_warps, 1], [1, 0])
    rows = gl.arange(0, c_desc.block_type.shape[0], layout=gl.SliceLayout(1, layout))
    cols = gl.arange(0, c_desc.block_type.shape[1], layout=gl.SliceLayout(0, layout))
    values = (rows[:, None] * 1000 + cols[None, :]).to(gl.float32)
    c_smem = gl.allocate_shared_memory(c_desc.dtype, c_desc.block_type.shape, c_desc.layout)
    c_smem.store(values)
    fence_async_shared()
    tma.async_copy_shared_to_global(c_desc, [0, 0], c_smem)
    tma.store_wait(pendings=0)


def ws_handshake() -> torch.Tensor:
    out = torch.zeros(4 * 512, device="cuda")
    _ws_handshake_kernel[(4,)](out, num_warps=4)
    return out.cpu()


def tma_store() -> torch.Tensor:
    out = torch.empty(TMA_ROWS, TMA_COLS, device="cuda")
    layout = gl.NVMMASharedLayout.get_default_for([TMA_ROWS, TMA_COLS], gl.float32)
    _tma_store_kernel[(1,)](TensorDescriptor.from_tensor(out, [TMA_ROWS, TMA_COLS], layout), num_warps=4)
    return out.cpu()


BODIES = {"ws_handshake": ws_handshake, "tma_store": tma_store}  # their tools: suites.sanitize.PROBES


def check(name: str) -> None:
    """Run probe `name` and check its output's bytes (a probe whose kernel did not run proves nothing)."""
    got = BODIES[name]()
    if name == "ws_handshake":  # out[p, i] = i for the 128 + 128 + 32 elements the three partitions write
        assert torch.equal(got.view(4, 512)[:, :288], torch.arange(288.0).expand(4, -1)), "ws_handshake: the writes"
    else:
        rows = torch.arange(TMA_ROWS)[:, None] * 1000 + torch.arange(TMA_COLS)[None, :]
        assert torch.equal(got, rows.float()), "tma_store: the TMA store's bytes"
