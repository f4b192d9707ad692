"""Block-FP8 W8A8 GEMM for Hopper in Gluon (Triton's explicit-layout language): the arithmetic of
`kernels.block_fp8_gemm`'s tiled kernel, bit for bit, with each K block's scaling overlapped with the next block's
MMA. `kernels.block_fp8_gemm` launches it for M > 64 on sm_90 (`LaunchConfig.wgmma`).

Why: in the tiled Triton kernel every K step waits for its wgmma before the per-block scaling
(`acc += dot * (a_s * b_s)`): the dot's result is used in the loop by something other than the next dot's
accumulator, so Triton's WGMMA pipeliner makes the dot synchronous, and the tensor cores idle while the warps
scale. Here the MMA of block k + 1 is queued (`warpgroup_mma(is_async=True)`) before the wait for block k
(`warpgroup_mma_wait(num_outstanding=1)`), and block k's scaling FMAs run while the tensor cores work on k + 1: the
overlap DeepGEMM and CUTLASS get from their consumer warp groups. H200 figures:
`kernels.block_fp8_gemm.WGMMA_WS_CONFIG`.

Arithmetic, as the tiled kernel and `reference.gemm.block_fp8.block_fp8_gemm_mirror`: each K block's products
summed from zero by wgmma (FP8 inputs, fp32 accumulation), scaled by a_s * b_s and added to an fp32 accumulator in
K order (one FMA an element); one rounding to the output dtype.

Structure. A program takes BLOCK_M x BLOCK_N tiles of C (BLOCK_N <= 128: inside one weight-scale block) in grouped
order (GROUP_M tile rows share each B column tile while it is in L2), one after another when the grid has fewer
programs than tiles (persistent). STAGES shared-memory stages of A and B tiles (128 wide in K) are filled by TMA,
each with an mbarrier; the program's K blocks are numbered across its tiles, so a tile's last steps already load the
next tile's first blocks. Products go to two register sets, x and y, in turn: a step issues block k's MMA into the
set whose products were just scaled, waits for block k - 1's (one MMA left queued), releases k - 1's stage and
scales k - 1's products into the accumulator. Three fp32 tiles are live a thread (128 x 128 with 8 warps: 192
registers; ptxas allocates 226, no spills). Two things ptxas needs, or it serializes every wgmma of the kernel (its
warning C7514): no MMA in flight may have its registers copied (hence the two sets, the loop unrolled by two and
each MMA issued into its own set), and the scaling must be done before the next MMA into those registers is issued
(`_retire` pins it with an empty asm statement). A tile leaves through TMA from shared memory while the next tile
runs, where C's rows are 16-byte aligned; from registers with masked stores otherwise.

Two ways to release a stage (WS, `launch(warp_specialize=...)`):
- all warps in one partition: the warps sync (both warp groups read every stage's B tile) and refill the stage
  themselves. In sm_90 SASS that costs four CTA-wide barriers a K block: the one asked for, and three that
  Triton's shared-memory analysis puts around the refill's mbarrier expect and its two TMA copies.
- warp-specialized (as DeepGEMM and CUTLASS): one producer warp fills the stages, each of the two consumer warp
  groups takes 64 rows of the tile, arrives on the stage's "empty" mbarrier when its MMA is done, and stores its
  own half of C. The warp groups never wait for each other; their barriers are their own (128 threads), two a K
  block. Registers are handed out per warp group (setmaxnreg): 24 to the producer, CONSUMER_REGS and the rest to
  the consumers, within 168 a thread over the 12 warps launched.

Runs on NVIDIA sm_90 only (wgmma is Hopper's; Gluon does not run in the interpreter): `runs_on`.
"""

from __future__ import annotations

import functools

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
# Warp-specialized launch: 12 warps (two consumer warp groups; the producer warp's group is rounded up to four) at
# WS_MAXNREG registers a thread take the SM's 64 Ki registers; setmaxnreg then moves them between the groups: the
# fewest it allows (24) to the producer, which only issues TMA, CONSUMER_REGS to the second consumer group and the
# rest (248) to the first. Each consumer group's loop needs ~200 (three 64 x 128 fp32 tiles: 192; no spills in
# ptxas at 232).
WS_MAXNREG = 168
_BARRIER_BYTES = 1024  # room kept for the mbarriers and alignment (at 6 stages: 264 bytes used, Triton's count)
PRODUCER_REGS = gl.constexpr(24)
CONSUMER_REGS = 232


@gluon.jit
def _scales(sc, offs_m, n_block, kb, k_blocks, FAULT: gl.constexpr):
    """a_s * b_s of K block kb: one per row of `offs_m` (rows past M get 0); `sc`: (a_s and b_s pointers, M, N
    blocks of the weight scales, their strides). FAULT 1 / 2 read the weight scale of the next K / N block (the tiled
    kernel's planted bugs)."""
    as_ptr, bs_ptr, M, n_blocks, stride_asm, stride_ask, stride_bsn, stride_bsk = sc
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
def _issue(pipe, g, regs, FIRST_ROW: gl.constexpr, ROWS: gl.constexpr, STAGES: gl.constexpr, WS: gl.constexpr):
    """Wait for the program's g-th K block's stage and issue its MMA from zero into `regs` (a register set whose
    products have been used: the MMA's result takes its registers, so nothing is copied); rows FIRST_ROW ..
    FIRST_ROW + ROWS of the A tile when warp-specialized (a warp group's half), all of it otherwise."""
    _, _, a_bufs, b_bufs, ready, _ = pipe
    stage = g % STAGES
    mbarrier.wait(ready.index(stage), (g // STAGES) & 1)
    a = a_bufs.index(stage)
    if WS:
        a = a.slice(FIRST_ROW, ROWS)
    return warpgroup_mma(a, b_bufs.index(stage).permute((1, 0)), regs, use_acc=False, is_async=True)


@gluon.jit
def _retire(pipe, in_flight, scales, acc, base, kb, k_blocks, here, after, OUTSTANDING: gl.constexpr,
            STAGES: gl.constexpr, WS: gl.constexpr):  # fmt: skip
    """Wait for the MMA of K block kb of the tile (`in_flight`; OUTSTANDING later ones may stay in flight; `base`:
    the program's blocks before this tile), release its stage and scale its products into acc. Released: to the
    producer warp (WS), or refilled here with the block STAGES ahead (the next tile's first blocks near a tile's
    end). Returns (its products, acc)."""
    a_desc, b_desc, a_bufs, b_bufs, ready, empty = pipe
    g = base + kb
    stage = g % STAGES
    done = warpgroup_mma_wait(num_outstanding=OUTSTANDING, deps=(in_flight, a_bufs.index(stage), b_bufs.index(stage)))
    if WS:
        # One arrival for the warp group: Triton has one thread of the partition arrive. A warp group's wgmma is one
        # operation, so its wait in that thread's warp covers the group's reads of the stage (CUTLASS's consumer
        # release arrives the same way); in 3.6.0's SASS a 128-thread barrier precedes the arrive besides.
        mbarrier.arrive(empty.index(stage), count=1)
    else:
        gl.thread_barrier()  # every warp group's MMA of this block is done before its stage is refilled
        _fill(a_desc, b_desc, a_bufs, b_bufs, ready, g + STAGES, kb + STAGES, k_blocks, here, after, STAGES)
    # The scaling must finish before the next MMA into these registers is issued: pinned by an empty asm statement
    # with side effects, which the compiler keeps in order with the wgmma's; left free, it sank past that MMA's issue
    # and the products were copied aside, which makes ptxas serialize the wgmmas.
    acc = acc + done[0] * scales[:, None]
    acc = gl.inline_asm_elementwise("", "=f,0", [acc], dtype=gl.float32, is_pure=False, pack=1)
    return done[0], acc


@gluon.jit
def _tile_products(pipe, sc, offs_m, n_block, base, k_blocks, here, after, acc, x, FIRST_ROW: gl.constexpr,
                   ROWS: gl.constexpr, STAGES: gl.constexpr, FAULT: gl.constexpr, WS: gl.constexpr):  # fmt: skip
    """The tile's fp32 accumulator over its k_blocks K blocks (acc and x: zeros in the MMA layout). Two register
    sets for products, x and y, in turn; one MMA always queued behind the one being waited for. Each MMA is issued
    into the set whose products were just scaled, so the set in flight over the back edge is the loop-carried one
    itself (an in-flight set copied to other registers makes ptxas serialize every wgmma)."""
    s_y = _scales(sc, offs_m, n_block, 0, k_blocks, FAULT)
    y = _issue(pipe, base, x, FIRST_ROW, ROWS, STAGES, WS)
    for kb in range(1, k_blocks - 1, 2):  # y holds block kb - 1 in flight; x is free
        s_x = _scales(sc, offs_m, n_block, kb, k_blocks, FAULT)
        x = _issue(pipe, base + kb, x, FIRST_ROW, ROWS, STAGES, WS)
        y, acc = _retire(pipe, y, s_y, acc, base, kb - 1, k_blocks, here, after, 1, STAGES, WS)
        s_y = _scales(sc, offs_m, n_block, kb + 1, k_blocks, FAULT)
        y = _issue(pipe, base + kb + 1, y, FIRST_ROW, ROWS, STAGES, WS)
        x, acc = _retire(pipe, x, s_x, acc, base, kb, k_blocks, here, after, 1, STAGES, WS)
    if k_blocks % 2 == 0:  # the last block is left: into x
        last = k_blocks - 1
        s_x = _scales(sc, offs_m, n_block, last, k_blocks, FAULT)
        x_last = _issue(pipe, base + last, x, FIRST_ROW, ROWS, STAGES, WS)
        _, acc = _retire(pipe, y, s_y, acc, base, last - 1, k_blocks, here, after, 1, STAGES, WS)
        _, acc = _retire(pipe, x_last, s_x, acc, base, last, k_blocks, here, after, 0, STAGES, WS)
    else:
        _, acc = _retire(pipe, y, s_y, acc, base, k_blocks - 1, k_blocks, here, after, 0, STAGES, WS)
    return acc


@gluon.jit
def _store(acc, c_desc, c_smem, c_ptr, off_m, off_n, M, N, stride_cm, ROWS: gl.constexpr, BLOCK_N: gl.constexpr,
           WARPS: gl.constexpr):  # fmt: skip
    """Rows off_m .. off_m + ROWS of the tile into C: through TMA from c_smem (rows and columns past C clipped by
    the hardware; the store before must have read c_smem first), or from registers with masked stores."""
    if c_desc is not None:
        tma.store_wait(pendings=0)
        gl.thread_barrier()
        c_smem.store(acc.to(c_desc.dtype))
        fence_async_shared()
        tma.async_copy_shared_to_global(c_desc, [off_m, off_n], c_smem)
    else:
        out: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [WARPS, 1], [1, 0])
        c = gl.convert_layout(acc.to(c_ptr.dtype.element_ty), out)
        cm = off_m + gl.arange(0, ROWS, layout=gl.SliceLayout(1, out))
        cn = off_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, out))
        at = c_ptr + cm.to(gl.int64)[:, None] * stride_cm + cn[None, :]
        gl.store(at, c, mask=(cm < M)[:, None] & (cn < N)[None, :])


@gluon.jit
def _walk(pipe, sc, c_desc, c_smem, c_ptr, M, N, k_blocks, stride_cm, FIRST_ROW: gl.constexpr, ROWS: gl.constexpr,
          WARPS: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, GROUP_M: gl.constexpr,
          STAGES: gl.constexpr, FAULT: gl.constexpr, WS: gl.constexpr):  # fmt: skip
    """The program's tiles, one after another (a grid of fewer programs than tiles walks them): rows FIRST_ROW ..
    FIRST_ROW + ROWS of each, by WARPS warps."""
    num_m = gl.cdiv(M, BLOCK_M)
    num_n = gl.cdiv(N, BLOCK_N)
    tiles = num_m * num_n
    first = gl.program_id(0)
    stride = gl.num_programs(0)
    # wgmma's instruction shape: 16 rows a warp, the tile's width, 32 FP8 values of K
    mma: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[WARPS, 1], instr_shape=[16, BLOCK_N, 32]
    )
    rows: gl.constexpr = gl.SliceLayout(1, mma)
    for i in range(0, gl.cdiv(tiles - first, stride)):
        tile = first + i * stride
        off_m, off_n = _tile_offsets(tile, num_m, num_n, BLOCK_M, BLOCK_N, GROUP_M)
        here = (off_m, off_n)
        after = (off_m, off_n, False)
        if not WS:
            # The next tile, whose first blocks this one's last steps load (integer divisions: once a tile). Past
            # the last tile there is none (its loads are predicated off): clamped, so that the grouped order's
            # divisions stay inside the tile range.
            next_m, next_n = _tile_offsets(gl.minimum(tile + stride, tiles - 1), num_m, num_n, BLOCK_M, BLOCK_N,
                                           GROUP_M)  # fmt: skip
            after = (next_m, next_n, tile + stride < tiles)
        offs_m = off_m + FIRST_ROW + gl.arange(0, ROWS, layout=rows)
        acc = gl.zeros([ROWS, BLOCK_N], gl.float32, mma)
        x = gl.zeros([ROWS, BLOCK_N], gl.float32, mma)
        acc = _tile_products(pipe, sc, offs_m, off_n // _BLOCK_K, i * k_blocks, k_blocks, here, after, acc, x,
                             FIRST_ROW, ROWS, STAGES, FAULT, WS)  # fmt: skip
        _store(acc, c_desc, c_smem, c_ptr, off_m + FIRST_ROW, off_n, M, N, stride_cm, ROWS, BLOCK_N, WARPS)
    if c_desc is not None:
        tma.store_wait(pendings=0)


@gluon.jit
def _produce(a_desc, b_desc, a_bufs, b_bufs, ready, empty, M, N, k_blocks, GROUP_M: gl.constexpr,
             STAGES: gl.constexpr):  # fmt: skip
    """The producer warp: the program's K blocks, tile after tile, each into its stage once both consumer warp
    groups have released it (an mbarrier starts in the phase before 0: the first pass does not wait)."""
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
    num_m = gl.cdiv(M, BLOCK_M)
    num_n = gl.cdiv(N, BLOCK_N)
    nbytes: gl.constexpr = a_desc.block_type.nbytes + b_desc.block_type.nbytes
    g = 0
    for tile in range(gl.program_id(0), num_m * num_n, gl.num_programs(0)):
        off_m, off_n = _tile_offsets(tile, num_m, num_n, BLOCK_M, BLOCK_N, GROUP_M)
        for kb in range(k_blocks):
            stage = g % STAGES
            mbarrier.wait(empty.index(stage), ((g // STAGES) & 1) ^ 1)
            mbarrier.expect(ready.index(stage), nbytes)
            tma.async_copy_global_to_shared(a_desc, [off_m, kb * _BLOCK_K], ready.index(stage), a_bufs.index(stage))
            tma.async_copy_global_to_shared(b_desc, [off_n, kb * _BLOCK_K], ready.index(stage), b_bufs.index(stage))
            g += 1


@gluon.jit
def _block_fp8_gemm_wgmma_kernel(
    a_desc, b_desc, c_desc, c_ptr, as_ptr, bs_ptr, M, N, k_blocks, stride_cm, stride_asm, stride_ask, stride_bsn,
    stride_bsk, GROUP_M: gl.constexpr, STAGES: gl.constexpr, FAULT: gl.constexpr, WS: gl.constexpr,
    CONSUMER_REGS: gl.constexpr, num_warps: gl.constexpr,
):  # fmt: skip
    # c_desc: C's TMA descriptor where C's rows are 16-byte aligned (its block: the rows one partition stores), else
    # None (tiles are stored from registers)
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES, BLOCK_M, _BLOCK_K], a_desc.layout)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES, BLOCK_N, _BLOCK_K], b_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    sc = (as_ptr, bs_ptr, M, gl.cdiv(N, _BLOCK_K), stride_asm, stride_ask, stride_bsn, stride_bsk)
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
    if WS:
        ROWS: gl.constexpr = BLOCK_M // 2
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for s in gl.static_range(STAGES):
            mbarrier.init(empty.index(s), count=2)  # one arrival a consumer warp group
        c0 = a_bufs  # never used without c_desc
        c1 = a_bufs
        if c_desc is not None:
            c0 = gl.allocate_shared_memory(c_desc.dtype, c_desc.block_type.shape, c_desc.layout)
            c1 = gl.allocate_shared_memory(c_desc.dtype, c_desc.block_type.shape, c_desc.layout)
        pipe = (a_desc, b_desc, a_bufs, b_bufs, ready, empty)
        gl.warp_specialize(
            [
                (_walk, (pipe, sc, c_desc, c0, c_ptr, M, N, k_blocks, stride_cm, 0, ROWS, num_warps, BLOCK_M, BLOCK_N,
                         GROUP_M, STAGES, FAULT, WS)),
                (_walk, (pipe, sc, c_desc, c1, c_ptr, M, N, k_blocks, stride_cm, ROWS, ROWS, 4, BLOCK_M, BLOCK_N,
                         GROUP_M, STAGES, FAULT, WS)),
                (_produce, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, M, N, k_blocks, GROUP_M, STAGES)),
            ],
            [4, 1],
            [CONSUMER_REGS, PRODUCER_REGS],
        )  # fmt: skip
    else:
        c_smem = a_bufs  # never used without c_desc
        if c_desc is not None:
            c_smem = gl.allocate_shared_memory(c_desc.dtype, c_desc.block_type.shape, c_desc.layout)
        pipe = (a_desc, b_desc, a_bufs, b_bufs, ready, ready)  # no "empty" barriers: the warps refill the stages
        first_tile = _tile_offsets(
            gl.program_id(0), gl.cdiv(M, BLOCK_M), gl.cdiv(N, BLOCK_N), BLOCK_M, BLOCK_N, GROUP_M
        )
        for s in gl.static_range(STAGES):
            _fill(a_desc, b_desc, a_bufs, b_bufs, ready, s, s, k_blocks, first_tile, (0, 0, False), STAGES)
        _walk(pipe, sc, c_desc, c_smem, c_ptr, M, N, k_blocks, stride_cm, 0, BLOCK_M, num_warps, BLOCK_M, BLOCK_N,
              GROUP_M, STAGES, FAULT, WS)  # fmt: skip
    # No mbarrier.invalidate at the end: PTX asks for it only before a barrier's memory is reused. Triton put a
    # 128-thread `bar.sync 0` before each (sm_90 SASS), between the warp-specialize join and the write of the
    # workers' exit state, the write racecheck reported hazards on (reports/cuda-h200/sanitizer.md).


def runs_on(device: torch.device) -> bool:
    """Whether this kernel runs on `device`: NVIDIA sm_90 (wgmma is Hopper's; not interpreted)."""
    return packed_ptx(device) and platform.current_platform.capability == (9, 0)


def check_tiling(block_m: int, block_n: int, num_warps: int, warp_specialize: bool = False) -> None:
    """Refuse, with the config named, a tiling the kernel cannot run: block_n must divide the 128-wide weight block
    (one weight scale a tile), and the warps must form whole warp groups, each taking 16-row wgmma slices of the
    tile (warps_per_cta = [num_warps, 1]); warp-specialized, two consumer warp groups of 64 rows each."""
    if block_n > BLOCK_K or BLOCK_K % block_n:
        raise ValueError(f"config: the wgmma kernel takes block_n dividing {BLOCK_K}, got {block_n}")
    if warp_specialize and (num_warps, block_m) != (8, 128):
        raise ValueError(
            f"config: the wgmma kernel takes num_warps 8 and block_m 128 warp-specialized (two consumer warp groups "
            f"of 64 rows), got num_warps {num_warps}, block_m {block_m}"
        )
    if num_warps % 4 or block_m % (16 * num_warps):
        raise ValueError(
            f"config: the wgmma kernel takes num_warps a multiple of 4 and block_m a multiple of 16 * num_warps, "
            f"got num_warps {num_warps}, block_m {block_m}"
        )


def stage_count(asked: int, k_blocks: int, fit: int, warp_specialize: bool) -> int:
    """The stages the kernel runs with: as many as asked, of those that `fit` in shared memory beside C's tile (or
    its two halves; 6 stages with fp32 C would not), and at least two, since block k + 1's MMA is issued before
    block k's stage is released (one stage would wait on itself). Without a producer warp also at most k_blocks: a
    tile's last steps load only the next tile's first blocks, so one K block walking several tiles runs one stage
    (two would wait for a stage that nothing fills)."""
    stages = max(min(asked, fit), 2)
    return stages if warp_specialize else min(stages, k_blocks)


@functools.cache
def _max_shared_memory(device_index: int) -> int:
    """Shared memory a CTA may take on the device: the figure Triton's launcher holds kernels to."""
    return triton.runtime.driver.active.utils.get_device_properties(device_index)["max_shared_mem"]


GL_DTYPES = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16, torch.float32: gl.float32}


def launch(a, a_scales, b, b_scales, out, block_m: int, block_n: int, group_m: int, stages: int, num_warps: int,
           programs: int = 0, fault: int = 0, warp_specialize: bool = False,
           tma_store: bool = True) -> None:  # fmt: skip
    """Launch on arguments `kernels.block_fp8_gemm.launch_block_fp8_gemm` has validated, into `out` [M, N] (rows
    contiguous); `programs` > 0 walks the tiles with that many programs (persistent); `warp_specialize`: a producer
    warp and two consumer warp groups (num_warps 8: the consumers' warps); `tma_store`: C through TMA where its rows
    are 16-byte aligned, else (and with False) from registers."""
    m, k = a.shape
    n = b.shape[0]
    check_tiling(block_m, block_n, num_warps, warp_specialize)
    if out.stride(1) != 1:
        raise ValueError(f"out: rows must be contiguous, got strides {out.stride()}")
    k_blocks = k // BLOCK_K
    c_bytes = block_m * block_n * out.element_size()
    room = _max_shared_memory(out.device.index if out.device.index is not None else torch.cuda.current_device())
    fit = (room - c_bytes - _BARRIER_BYTES) // ((block_m + block_n) * BLOCK_K)  # FP8 stages: a byte an element
    stages = stage_count(stages, k_blocks, fit, warp_specialize)
    fp8 = gl.float8e4nv
    a_desc = TensorDescriptor.from_tensor(
        a, [block_m, BLOCK_K], gl.NVMMASharedLayout.get_default_for([block_m, BLOCK_K], fp8)
    )
    b_desc = TensorDescriptor.from_tensor(
        b, [block_n, BLOCK_K], gl.NVMMASharedLayout.get_default_for([block_n, BLOCK_K], fp8)
    )
    c_desc = None
    if tma_store and (out.stride(0) * out.element_size()) % 16 == 0 and out.data_ptr() % 16 == 0:
        c_rows = block_m // 2 if warp_specialize else block_m  # each consumer warp group stores its half
        c_layout = gl.NVMMASharedLayout.get_default_for([c_rows, block_n], GL_DTYPES[out.dtype])
        c_desc = TensorDescriptor.from_tensor(out, [c_rows, block_n], c_layout)
    tiles = triton.cdiv(m, block_m) * triton.cdiv(n, block_n)
    ws = dict(num_warps=4, maxnreg=WS_MAXNREG) if warp_specialize else dict(num_warps=num_warps)
    _block_fp8_gemm_wgmma_kernel[(min(tiles, programs) if programs > 0 else tiles,)](
        a_desc, b_desc, c_desc, out, a_scales, b_scales, m, n, k_blocks, out.stride(0), *a_scales.stride(),
        *b_scales.stride(), GROUP_M=group_m, STAGES=stages, FAULT=fault, WS=warp_specialize,
        CONSUMER_REGS=CONSUMER_REGS, **ws,
    )  # fmt: skip
