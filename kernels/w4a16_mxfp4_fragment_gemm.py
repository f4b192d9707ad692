"""Tiled W4A16 MXFP4 GEMM in Triton on the weights in `kernels.mxfp4_fragment_layout`'s prepared layout:
y = x @ W^T for more rows of x than the tensor-core GEMV takes (`kernels.w4a16_mxfp4_fragment_gemv`, whose op
calls this above the rows its `takes_gemv` gives the GEMV and wherever its PTX cannot run). One layout serves every
batch size, so the runner stores nothing else.

It computes what `reference.gemm.w4a16_mxfp4.w4a16_mxfp4_gemm_mirror` computes for the interchange codes and
scales `mxfp4_fragment_layout.interchange` gives back: exact products of bf16 x and exact weights on the tensor
cores (tl.dot, wgmma on sm_90), fp32 sums, one bf16 rounding; the same arithmetic class as
`kernels.w4a16_mxfp4_gemm`'s dot path and its lossy bounds.

Structure. A program takes BLOCK_N rows of W (BLOCK_N / 16 row tiles) and, a K tile, reads each row tile's words of
the tile's steps (512 contiguous bytes a step) and their scale pairs, decodes them to one bf16 [BLOCK_N, BK] tile
(`kernels._mxfp4_fragment_tiles.fragment_tile`) and runs one dot into its accumulator. The tile's columns run in the
order that puts each lane's decoded registers where wgmma's register A operand wants them (rows g and g + 8, columns
2c, 2c + 1, 2c + 8, 2c + 9 of each 16-column slab for lane 4 g + c), so Triton keeps the words' shared-memory load,
the decode and the MMA in one register layout: no layout conversion, and no shared-memory round trip of the decoded
weights, in the K loop (`test_tiled_loop_decodes_into_the_mma_registers` compiles it for sm_90 and counts). Building
the tile as two [BLOCK_N / 2, BK] halves in the GEMV's K order cost that round trip, 32 KB stored and loaded a K tile
at BLOCK_N 256. At M = 64 on 8192 x 8192 (lone launches, CUDA-graph replays, cold L2) the two halves ran at 1.07x
the bf16 matmul on an H100 (47.5 against 50.7 us), the one tile at 1.13x on an H200 (34.0 against 38.6 us, 2 groups;
different cards, so only the ratios compare). x is read in the same K order (pairs of consecutive elements), which
the dot does not mind. Weights are decoded exactly to bf16 by the layout's PTX where it runs (NVIDIA sm_90+) and by
the same integer ops in Triton elsewhere (the interpreter, which is how the CPU tier checks this kernel's indexing).
Split-K as in `kernels.w4a16_mxfp4_gemm` (an fp32 workspace summed in split order, `kernels.split_k`).

Launch rows: GPU_CONFIGS (`bench.gemm.w4a16_mxfp4_launch_sweep --fragment`); BLOCK_N a multiple of 16, GROUPS
even (whole steps a tile). Scale bytes 253 and 254 are outside the contract as in that GEMM.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels import w4a16_mxfp4_gemm
from kernels._boundary import runs_interpreted
from kernels._mxfp4_fragment_tiles import fragment_k_order, fragment_tile
from kernels._packed_ptx import packed_ptx
from kernels._pdl import launch_args, wait_then_release
from kernels._tiles import store_partial
from kernels.split_k import fill_splits, launch_split, sm_count, sum_splits

FAULTS = w4a16_mxfp4_gemm.FAULTS  # the same planted bugs, named alike (`fragment_tile` plants them)

# (largest M, "dot", BLOCK_N, BLOCK_M, GROUPS, SPLIT_K, warps, stages); the first row whose M bound holds, from WIDE_N
# outputs on the wide table. H200 sweep at M = 32 (`bench.gemm.w4a16_mxfp4_launch_sweep --fragment --m 32 --shapes
# 28672x4096,4096x14336,6144x4096`, CUDA-graph replays, cold L2; bf16 matmul 69.6 / 42.8 / 23.2 us): gate_up (28672 x
# 4096) best at 256 x 32, 2 groups, split 2: 59.2 us; down (4096 x 14336) 128 x 32, 4 groups, split 4 at 4 or 8 warps:
# 49.1 / 47.5 us; qkv (6144 x 4096) 256 x 32, 2 groups, split 4: 23.8 us (the rows below 25.6 us). The first guess (128
# x 32, 4 groups, split 4, 8 warps) was 93.0 / 47.5 / 31.2 us. SPLIT_K 0: as many splits as give every SM one program
# (`kernels.split_k.fill_splits`). M = 33..64, H100 sweep at M = 64 (`--fragment --m 64 --shapes 8192x8192,4096x14336`,
# 72b5840, reports/cuda-h100-80gb-hbm3/launch_sweeps/w4a16_mxfp4_launch_sweep_fragment.csv; bf16 matmul 50.7 / 48.5 us):
# 256 x 64, 2 groups, 8 warps best on both, at split 4 on 8192 x 8192 (47.5 us; split 8 53.3) and split 8 on 4096 x
# 14336 (44.4 us; split 4 72.9), so at one program an SM (128 of them both times); the row before (128 x 64, 4 groups,
# split 4) took 62.9 / 62.1 us. Since each lane decodes into its own wgmma registers (dac1247), 4 groups a K tile beat 2
# where K is long, H200 PDL chains at M = 64 (`bench.gemm.w4a16_mxfp4_gemv_sweep.chain_ms`; us, 4 groups / 2): 8192 x
# 8192 29.9 / 32.5, 4096 x 14336 28.3 / 30.3, 6144 x 4096 18.0 / 17.7; the wide 28672 x 4096 51.6 / 49.1 keeps 2. At M =
# 128 the same 256 x 64 row (two M tiles) beat the 128 x 128 row, split 2: 8192 x 8192 49.5 / 59.4, 4096 x 14336 44.8 /
# 90.6, 28672 x 4096 101.4 / 124.9, 6144 x 4096 28.6 / 31.9. Wider tiles read x fewer times: at 64 rows a program's x
# tile is 4 times its weight bytes at BLOCK_N 128.
GPU_CONFIGS = (
    (32, "dot", 128, 32, 4, 4, 4, 3),
    (256, "dot", 256, 64, 4, 0, 8, 3),
    (None, "dot", 128, 128, 4, 1, 8, 3),
)
WIDE_N = w4a16_mxfp4_gemm.WIDE_N
GPU_CONFIGS_WIDE = ((32, "dot", 256, 32, 2, 2, 8, 3), (64, "dot", 256, 64, 2, 0, 8, 3), *GPU_CONFIGS[1:])
INTERPRETER_CONFIG = ("dot", 16, 16, 2, 1, 1, 1)  # the interpreter runs programs one by one: few


def launch_config(m: int, n: int) -> tuple:
    """The launch row for M rows and N outputs on a GPU."""
    table = GPU_CONFIGS_WIDE if n >= WIDE_N else GPU_CONFIGS
    return next(row[1:] for row in table if row[0] is None or m <= row[0])


@triton.jit
def _store_rows(out, rows, m, m_mask, acc, N, out_row_stride, OUT_FP32: tl.constexpr):
    at = out + m[None, :] * out_row_stride + rows[:, None]
    mask = (rows < N)[:, None] & m_mask[None, :]
    store_partial(at, acc, mask, OUT_FP32)


@triton.jit
def _fragment_gemm_kernel(
    x_ptr, words_ptr, pairs_ptr, out_ptr, M, N, n_steps, tiles_per_split, x_row_stride, out_row_stride,
    out_split_stride, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, GROUPS: tl.constexpr, EVEN_K: tl.constexpr,
    OUT_FP32: tl.constexpr, FAULT: tl.constexpr, PTX: tl.constexpr,
    PDL: tl.constexpr,
):  # fmt: skip
    wait_then_release(PDL)  # kernels._pdl: before any read of an earlier kernel's output
    # x_ptr: bf16 [M, K]; program (n tile, m tile, split); the accumulator is y^T's [BLOCK_N, BLOCK_M] block.
    pid_n, pid_m, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    T: tl.constexpr = BLOCK_N // 16
    row_tile = pid_n * T + tl.arange(0, T).to(tl.int64)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_tile = tl.where(row_tile * 16 < N, row_tile, 0)  # row tiles past N read row tile 0; never stored
    m = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    m_mask = m < M  # rows past M: their x loads and stores masked off
    BK: tl.constexpr = GROUPS * 32
    k_order = fragment_k_order(BK)
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    first = split * tiles_per_split
    last = tl.minimum(first + tiles_per_split, tl.cdiv(2 * n_steps, GROUPS))
    for tile in range(first, last):
        w = fragment_tile(words_ptr, pairs_ptr, row_tile, tile, n_steps, GROUPS, FAULT, PTX)
        k = tl.max_contiguous(tl.multiple_of(tile * BK + k_order, 2), 2)  # bf16 pairs: (bit) runs of 2
        x_offsets = m[None, :] * x_row_stride + k[:, None]
        # Rows past M are masked off, not read again from row 0: 16 such rows of 64 made the M = 64 row's tiles 1.5x
        # slower (8192 x 8192 at M = 48: 70.3 against 47.7 us at M = 64; H100, CUDA-graph replays, 8b93edb).
        if EVEN_K:
            xt = tl.load(x_ptr + x_offsets, mask=m_mask[None, :], other=0.0)
        else:
            xt = tl.load(x_ptr + x_offsets, mask=m_mask[None, :] & (k < n_steps * 64)[:, None], other=0.0)
        acc = tl.dot(w, xt, acc)
    out = out_ptr + split.to(tl.int64) * out_split_stride
    _store_rows(out, rows, m, m_mask, acc, N, out_row_stride, OUT_FP32)


def launch(x: torch.Tensor, words: torch.Tensor, pairs: torch.Tensor, config=None, fault: str = "none"):
    """Allocate and launch on arguments `kernels.w4a16_mxfp4_fragment_gemv.check_fragment_args` has validated;
    `config` a GPU_CONFIGS row without its M bound (sweeps; SPLIT_K 0: `fill_splits` on the GPU's SMs), `fault`
    a planted bug (negative controls)."""
    m, n, n_steps = x.shape[0], words.shape[0] * 16, words.shape[1]
    y = torch.empty(m, n, dtype=torch.bfloat16, device=x.device)
    if m == 0 or n == 0:
        return y
    if x.stride(1) != 1:
        raise ValueError(f"x: last dim must have stride 1, got strides {x.stride()}")
    if config is None:
        config = INTERPRETER_CONFIG if runs_interpreted(x.device) else launch_config(m, n)
    kind, block_n, block_m, groups, split_k, warps, stages = config
    if kind != "dot" or groups % 2 or block_n % 16:
        raise ValueError(f"config: needs a dot row with even GROUPS and BLOCK_N a multiple of 16, got {config}")
    k_tiles = triton.cdiv(2 * n_steps, groups)
    if split_k == 0:
        split_k = fill_splits(triton.cdiv(n, block_n) * triton.cdiv(m, block_m), sm_count(x.device), k_tiles)
    split_k, tiles_per_split = launch_split(k_tiles, split_k)
    out = y if split_k == 1 else torch.empty(split_k, m, n, dtype=torch.float32, device=x.device)
    _fragment_gemm_kernel[(triton.cdiv(n, block_n), triton.cdiv(m, block_m), split_k)](
        x, words, pairs, out, m, n, n_steps, tiles_per_split, x.stride(0), n, m * n,
        BLOCK_N=block_n, BLOCK_M=block_m, GROUPS=groups, EVEN_K=(2 * n_steps) % groups == 0, OUT_FP32=split_k > 1,
        FAULT=FAULTS[fault], PTX=packed_ptx(x.device), num_warps=warps, num_stages=stages, **launch_args(x.device),
    )  # fmt: skip
    if split_k > 1:
        sum_splits(out, y)
    return y
