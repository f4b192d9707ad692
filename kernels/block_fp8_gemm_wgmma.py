"""Block-FP8 W8A8 GEMM for Hopper in Gluon (Triton's explicit-layout language): the arithmetic of
`kernels.block_fp8_gemm`'s tiled kernel, bit for bit, with each K block's scaling overlapped with the next block's
MMA. `kernels.block_fp8_gemm` launches it for M > 64 on sm_90 (`LaunchConfig.wgmma`).

Why: in the tiled Triton kernel every K step waits for its wgmma before the per-block scaling
(`acc += dot * (a_s * b_s)`): the dot's result is used in the loop by something other than the next dot's
accumulator, so Triton's WGMMA pipeliner makes the dot synchronous, and the tensor cores idle while the warps
scale. Here the MMA of block k + 1 is queued (`warpgroup_mma(is_async=True)`) before the wait for block k
(`warpgroup_mma_wait(num_outstanding=1)`), and block k's scaling FMAs run while the tensor cores work on k + 1: the
overlap DeepGEMM and CUTLASS get from their consumer warp groups. H200 figures: `kernels.block_fp8_gemm.WGMMA_CONFIG`.

Arithmetic, as the tiled kernel and `reference.gemm.block_fp8.block_fp8_gemm_mirror`: each K block's products
summed from zero by wgmma (FP8 inputs, fp32 accumulation), scaled by a_s * b_s and added to an fp32 accumulator in
K order (one FMA an element); one rounding to the output dtype.

Structure. A program takes BLOCK_M x BLOCK_N tiles of C (BLOCK_N <= 128: inside one weight-scale block) in grouped
order (GROUP_M tile rows share each B column tile while it is in L2), one after another when the grid has fewer
programs than tiles (persistent). STAGES shared-memory stages of A and B tiles (128 wide in K) are filled by TMA,
each with an mbarrier; the program's K blocks are numbered across its tiles, so a tile's last steps already load the
next tile's first blocks. Products go to two register sets, x and y, in turn: a step issues block k's MMA into the
set whose products were just scaled, waits for block k - 1's (one MMA left queued), syncs the warps (both warp
groups read every stage's B tile), refills k - 1's stage and scales k - 1's products into the accumulator. Three
fp32 tiles are live a thread (128 x 128 with 8 warps: 192 registers; ptxas allocates 226, no spills). Two things
ptxas needs, or it serializes every wgmma of the kernel (its warning C7514): no MMA in flight may have its
registers copied (hence the two sets, the loop unrolled by two and each MMA issued into its own set), and the
scaling must be done before the next MMA into those registers is issued (`_retire` pins it with an empty asm
statement). A tile leaves through TMA from shared memory while the next tile runs, where C's rows are 16-byte
aligned; from registers with masked stores otherwise.

Runs on NVIDIA sm_90 only (wgmma is Hopper's; Gluon does not run in the interpreter): `runs_on`.
"""

from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from kernels import platform
from kernels._packed_ptx import packed_ptx

BLOCK_K = 128  # one activation scale a row and one weight scale a tile per K block
_BLOCK_K = gl.constexpr(BLOCK_K)  # the kernels' copy (a Gluon function reads only constexpr globals)


@gluon.jit
def _scales(as_ptr, bs_ptr, offs_m, M, n_block, kb, k_blocks, n_blocks, stride_asm, stride_ask, stride_bsn, stride_bsk,
            FAULT: gl.constexpr):  # fmt: skip
    """a_s * b_s of K block kb: one per row of the tile (rows past M get 0). FAULT 1 / 2 read the weight scale of
    the next K / N block (the tiled kernel's planted bugs)."""
    a_s = gl.load(as_ptr + offs_m * stride_asm + kb * stride_ask, mask=offs_m < M, other=0.0)
    kb_w = kb
    if FAULT == 1:
        kb_w = (kb + 1) % k_blocks
    nb = n_block
    if FAULT == 2:
        nb = (n_block + 1) % n_blocks
    return a_s * gl.load(bs_ptr + nb * stride_bsn + kb_w * stride_bsk)


@gluon.jit
def _tile_offsets(tile, num_m, num_n, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, GROUP_M: gl.constexpr):
    """(row, column) of C where tile `tile` starts, in grouped order: GROUP_M tile rows share each B column tile
    while it is in L2."""
    in_group = GROUP_M * num_n
    first_m = (tile // in_group) * GROUP_M
    group_rows = gl.minimum(num_m - first_m, GROUP_M)
    return (first_m + (tile % in_group) % group_rows) * BLOCK_M, ((tile % in_group) // group_rows) * BLOCK_N


@gluon.jit
def _fill(a_desc, b_desc, a_bufs, b_bufs, ready, g, j, k_blocks, here, after, STAGES: gl.constexpr):
    """TMA of the program's g-th K block into stage g % STAGES: block j of the tile at `here` (row, column of C),
    or block j - k_blocks of the next tile, at `after` (row, column, whether there is one), from the end of this
    one (k_blocks >= STAGES, so never further)."""
    this_tile = j < k_blocks
    off_m = gl.where(this_tile, here[0], after[0])
    off_n = gl.where(this_tile, here[1], after[1])
    kb = gl.where(this_tile, j, j - k_blocks)
    live = this_tile | after[2]
    stage = g % STAGES
    nbytes: gl.constexpr = a_desc.block_type.nbytes + b_desc.block_type.nbytes
    mbarrier.expect(ready.index(stage), nbytes, pred=live)
    tma.async_copy_global_to_shared(a_desc, [off_m, kb * _BLOCK_K], ready.index(stage), a_bufs.index(stage), pred=live)
    tma.async_copy_global_to_shared(b_desc, [off_n, kb * _BLOCK_K], ready.index(stage), b_bufs.index(stage), pred=live)


@gluon.jit
def _issue(a_bufs, b_bufs, ready, g, regs, STAGES: gl.constexpr):
    """Wait for the program's g-th K block's stage and issue its MMA from zero into `regs` (a register set whose
    products have been used: the MMA's result takes its registers, so nothing is copied)."""
    stage = g % STAGES
    mbarrier.wait(ready.index(stage), (g // STAGES) & 1)
    return warpgroup_mma(a_bufs.index(stage), b_bufs.index(stage).permute((1, 0)), regs, use_acc=False, is_async=True)


@gluon.jit
def _retire(a_desc, b_desc, a_bufs, b_bufs, ready, in_flight, scales, acc, base, kb, k_blocks, here, after,
            OUTSTANDING: gl.constexpr, STAGES: gl.constexpr):  # fmt: skip
    """Wait for the MMA of K block kb of the tile (`in_flight`; OUTSTANDING later ones may stay in flight; `base`:
    the program's blocks before this tile), refill its stage with the block STAGES ahead (the next tile's first
    blocks near a tile's end) and scale its products into acc. Returns (its products, acc)."""
    g = base + kb
    stage = g % STAGES
    done = warpgroup_mma_wait(num_outstanding=OUTSTANDING, deps=(in_flight, a_bufs.index(stage), b_bufs.index(stage)))
    gl.thread_barrier()  # every warp group's MMA of this block is done before its stage is refilled
    _fill(a_desc, b_desc, a_bufs, b_bufs, ready, g + STAGES, kb + STAGES, k_blocks, here, after, STAGES)
    # The scaling must finish before the next MMA into these registers is issued: pinned by an empty asm statement
    # with side effects, which the compiler keeps in order with the wgmma's; left free, it sank past that MMA's issue
    # and the products were copied aside, which makes ptxas serialize the wgmmas.
    acc = acc + done[0] * scales[:, None]
    acc = gl.inline_asm_elementwise("", "=f,0", [acc], dtype=gl.float32, is_pure=False, pack=1)
    return done[0], acc


@gluon.jit
def _block_fp8_gemm_wgmma_kernel(
    a_desc, b_desc, c_desc, c_ptr, as_ptr, bs_ptr, M, N, k_blocks, stride_cm, stride_asm, stride_ask, stride_bsn,
    stride_bsk, GROUP_M: gl.constexpr, STAGES: gl.constexpr, FAULT: gl.constexpr, num_warps: gl.constexpr,
):  # fmt: skip
    # c_desc: C's TMA descriptor where C's rows are 16-byte aligned, else None (the tile is stored from registers)
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
    num_m = gl.cdiv(M, BLOCK_M)
    num_n = gl.cdiv(N, BLOCK_N)
    n_blocks = gl.cdiv(N, _BLOCK_K)
    tiles = num_m * num_n
    first = gl.program_id(0)
    stride = gl.num_programs(0)  # a grid of fewer programs than tiles walks them (persistent)

    mma: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, BLOCK_N, 256 // a_desc.dtype.primitive_bitwidth]
    )
    rows: gl.constexpr = gl.SliceLayout(1, mma)
    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES, BLOCK_M, _BLOCK_K], a_desc.layout)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES, BLOCK_N, _BLOCK_K], b_desc.layout)
    if c_desc is not None:
        c_smem = gl.allocate_shared_memory(c_desc.dtype, c_desc.block_type.shape, c_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
    here = _tile_offsets(first, num_m, num_n, BLOCK_M, BLOCK_N, GROUP_M)
    for s in gl.static_range(STAGES):
        _fill(a_desc, b_desc, a_bufs, b_bufs, ready, s, s, k_blocks, here, (0, 0, False), STAGES)

    for i in range(0, gl.cdiv(tiles - first, stride)):
        # Tile coordinates once a tile (integer divisions): this tile's and the next one's, whose first blocks the
        # last steps of this one load.
        tile = first + i * stride
        off_m, off_n = _tile_offsets(tile, num_m, num_n, BLOCK_M, BLOCK_N, GROUP_M)
        here = (off_m, off_n)
        # past the last tile there is no next one (its loads are predicated off): clamped, so that the grouped
        # order's divisions stay inside the tile range
        next_m, next_n = _tile_offsets(gl.minimum(tile + stride, tiles - 1), num_m, num_n, BLOCK_M, BLOCK_N, GROUP_M)
        after = (next_m, next_n, tile + stride < tiles)
        n_block = off_n // _BLOCK_K
        offs_m = off_m + gl.arange(0, BLOCK_M, layout=rows)
        base = i * k_blocks  # the program's blocks before this tile's
        acc = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, mma)
        x = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, mma)
        # Two register sets for products, x and y, in turn; one MMA always queued behind the one being waited for.
        # Each MMA is issued into the set whose products were just scaled, so the set in flight over the back edge is
        # the loop-carried one itself (an in-flight set copied to other registers makes ptxas serialize every wgmma).
        s_y = _scales(as_ptr, bs_ptr, offs_m, M, n_block, 0, k_blocks, n_blocks, stride_asm, stride_ask, stride_bsn,
                      stride_bsk, FAULT)  # fmt: skip
        y = _issue(a_bufs, b_bufs, ready, base, x, STAGES)
        for kb in range(1, k_blocks - 1, 2):  # y holds block kb - 1 in flight; x is free
            s_x = _scales(as_ptr, bs_ptr, offs_m, M, n_block, kb, k_blocks, n_blocks, stride_asm, stride_ask,
                          stride_bsn, stride_bsk, FAULT)  # fmt: skip
            x = _issue(a_bufs, b_bufs, ready, base + kb, x, STAGES)
            y, acc = _retire(a_desc, b_desc, a_bufs, b_bufs, ready, y, s_y, acc, base, kb - 1, k_blocks, here, after,
                             1, STAGES)  # fmt: skip
            s_y = _scales(as_ptr, bs_ptr, offs_m, M, n_block, kb + 1, k_blocks, n_blocks, stride_asm, stride_ask,
                          stride_bsn, stride_bsk, FAULT)  # fmt: skip
            y = _issue(a_bufs, b_bufs, ready, base + kb + 1, y, STAGES)
            x, acc = _retire(a_desc, b_desc, a_bufs, b_bufs, ready, x, s_x, acc, base, kb, k_blocks, here, after, 1,
                             STAGES)  # fmt: skip
        if k_blocks % 2 == 0:  # the last block is left: into x
            last = k_blocks - 1
            s_x = _scales(as_ptr, bs_ptr, offs_m, M, n_block, last, k_blocks, n_blocks, stride_asm, stride_ask,
                          stride_bsn, stride_bsk, FAULT)  # fmt: skip
            x_last = _issue(a_bufs, b_bufs, ready, base + last, x, STAGES)
            _, acc = _retire(a_desc, b_desc, a_bufs, b_bufs, ready, y, s_y, acc, base, last - 1, k_blocks, here, after,
                             1, STAGES)  # fmt: skip
            _, acc = _retire(a_desc, b_desc, a_bufs, b_bufs, ready, x_last, s_x, acc, base, last, k_blocks, here,
                             after, 0, STAGES)  # fmt: skip
        else:
            _, acc = _retire(a_desc, b_desc, a_bufs, b_bufs, ready, y, s_y, acc, base, k_blocks - 1, k_blocks, here,
                             after, 0, STAGES)  # fmt: skip
        if c_desc is not None:
            # The tile leaves through TMA (rows and columns past C clipped by the hardware) while the next tile's
            # MMAs run; the store before must have read c_smem first.
            tma.store_wait(pendings=0)
            gl.thread_barrier()
            c_smem.store(acc.to(c_desc.dtype))
            fence_async_shared()
            tma.async_copy_shared_to_global(c_desc, [off_m, off_n], c_smem)
        else:
            out: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])
            c = gl.convert_layout(acc.to(c_ptr.dtype.element_ty), out)
            cm = off_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, out))
            cn = off_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, out))
            at = c_ptr + cm.to(gl.int64)[:, None] * stride_cm + cn[None, :]
            gl.store(at, c, mask=(cm < M)[:, None] & (cn < N)[None, :])
    if c_desc is not None:
        tma.store_wait(pendings=0)
    for s in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(s))


def runs_on(device: torch.device) -> bool:
    """Whether this kernel runs on `device`: NVIDIA sm_90 (wgmma is Hopper's; not interpreted)."""
    return packed_ptx(device) and platform.current_platform.capability == (9, 0)


def check_tiling(block_m: int, block_n: int, num_warps: int) -> None:
    """Refuse, with the config named, a tiling the kernel cannot run: block_n must divide the 128-wide weight block
    (one weight scale a tile), and the warps must form whole warp groups, each taking 16-row wgmma slices of the
    tile (warps_per_cta = [num_warps, 1])."""
    if block_n > BLOCK_K or BLOCK_K % block_n:
        raise ValueError(f"config: the wgmma kernel takes block_n dividing {BLOCK_K}, got {block_n}")
    if num_warps % 4 or block_m % (16 * num_warps):
        raise ValueError(
            f"config: the wgmma kernel takes num_warps a multiple of 4 and block_m a multiple of 16 * num_warps, "
            f"got num_warps {num_warps}, block_m {block_m}"
        )


GL_DTYPES = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16, torch.float32: gl.float32}


def launch(a, a_scales, b, b_scales, out, block_m: int, block_n: int, group_m: int, stages: int, num_warps: int,
           programs: int = 0, fault: int = 0) -> None:  # fmt: skip
    """Launch on arguments `kernels.block_fp8_gemm.launch_block_fp8_gemm` has validated, into `out` [M, N] (rows
    contiguous); `programs` > 0 walks the tiles with that many programs (persistent)."""
    m, k = a.shape
    n = b.shape[0]
    check_tiling(block_m, block_n, num_warps)
    if out.stride(1) != 1:
        raise ValueError(f"out: rows must be contiguous, got strides {out.stride()}")
    k_blocks = k // BLOCK_K
    # At least two stages: block k + 1's MMA is issued before block k's stage is refilled (one stage would wait on
    # itself); at most k_blocks: a tile's last steps load only the next tile's first blocks.
    stages = min(max(stages, 2), k_blocks)
    fp8 = gl.float8e4nv
    a_desc = TensorDescriptor.from_tensor(
        a, [block_m, BLOCK_K], gl.NVMMASharedLayout.get_default_for([block_m, BLOCK_K], fp8)
    )
    b_desc = TensorDescriptor.from_tensor(
        b, [block_n, BLOCK_K], gl.NVMMASharedLayout.get_default_for([block_n, BLOCK_K], fp8)
    )
    c_desc = None
    if (out.stride(0) * out.element_size()) % 16 == 0 and out.data_ptr() % 16 == 0:
        c_layout = gl.NVMMASharedLayout.get_default_for([block_m, block_n], GL_DTYPES[out.dtype])
        c_desc = TensorDescriptor.from_tensor(out, [block_m, block_n], c_layout)
    tiles = triton.cdiv(m, block_m) * triton.cdiv(n, block_n)
    _block_fp8_gemm_wgmma_kernel[(min(tiles, programs) if programs > 0 else tiles,)](
        a_desc, b_desc, c_desc, out, a_scales, b_scales, m, n, k_blocks, out.stride(0), *a_scales.stride(),
        *b_scales.stride(), GROUP_M=group_m, STAGES=stages, FAULT=fault, num_warps=num_warps,
    )  # fmt: skip
