"""Block-FP8 W8A8 GEMM in Triton (DeepSeek-V3: 1x128 activation groups, 128x128 weight blocks), mirrored by
`reference.gemm.block_fp8.block_fp8_gemm_mirror` (its docstring is the contract and the precision story).

Op: `touchstone::block_fp8_gemm(a, a_scales, b, b_scales, out_dtype) -> C`; call it through `block_fp8_gemm`.

Design (for the H200; see bench/gemm/block_fp8_launch_sweep.py):
- BLOCK_K = 128, so each K step needs one activation scale per row and one weight scale per 128 columns:
  `acc += tl.dot(a, b.T) * (a_s * b_s)` in fp32. The dot starts from zero every step, so the wgmma FP8
  accumulator only ever sums 128 products and the cross-block sum is fp32 (DeepSeek's promotion).
- With BLOCK_N <= 128 a tile sits inside one weight block, so its weight scale is one scalar per step and
  the per-step scaling is one multiply per row plus one FMA per accumulator element.
- A and B are read through TMA descriptors (host `TensorDescriptor`): out-of-range rows of the last M and N
  tiles are zero-filled by the hardware, so the main loop has no masks. Scales are ordinary loads (any
  strides: cuBLAS's column-major activation scales work as they are).
- Tiles are visited in GROUP_M-row groups for L2 reuse; PERSISTENT launches one program per SM that walks
  the tiles; SPLIT_K > 1 (small M, where few tiles cannot fill 132 SMs and the weights must stream at full
  bandwidth) writes fp32 partial sums per K range that `kernels.split_k.sum_splits` adds in split order
  (deterministic) and rounds once, in one kernel.
- On sm_90, M > 64 takes the Gluon kernel of `kernels.block_fp8_gemm_wgmma` in its warp-specialized form
  (`WGMMA_WS_CONFIG`): the same arithmetic, with each K block's scaling run while the next block's MMA is on the
  tensor cores, which this kernel's Triton loop cannot express (below).
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from kernels import block_fp8_gemm_wgmma
from kernels._boundary import check_device, runs_interpreted
from kernels._packed_ptx import packed_ptx
from kernels._pdl import launch_args, wait_then_release
from kernels.block_fp8_gemv import launch_fp8_gemv
from kernels.split_k import fill_splits, launch_split, sm_count, sum_splits
from reference.gemm.block_fp8 import BLOCK, check_block_fp8_gemm_args

# Planted bugs for the suite's negative controls; FAULT is a constexpr, so fault 0 compiles them away.
FAULTS = {
    "none": 0,
    "weight_scale_next_k_block": 1,  # the weight scale of K block kb read from block kb + 1 (wrapping)
    "weight_scale_next_n_block": 2,  # the weight scale of N block nb read from block nb + 1 (wrapping)
}


@dataclasses.dataclass(frozen=True)
class LaunchConfig:
    block_m: int
    block_n: int  # 64, 128 or 256 (a multiple or divisor of the 128-wide weight block)
    group_m: int = 8
    split_k: int = 1  # 0: choose from the SM count (small M)
    persistent: bool = False
    # Triton's producer/consumer split of the K loop (TMA warp + MMA warps); with wgmma, the Gluon kernel's producer
    # warp and two consumer warp groups
    warp_specialize: bool = False
    num_warps: int = 8
    num_stages: int = 3
    # The Gluon kernel of kernels.block_fp8_gemm_wgmma (NVIDIA sm_90: each K block's scaling overlapped with the
    # next block's MMA); elsewhere this config's tiled Triton launch. block_n <= 128, split_k 1.
    wgmma: bool = False
    # The Gluon kernel's C: through TMA from shared memory where C's rows are 16-byte aligned (else, and with
    # False, from registers with masked stores). From registers the warp-specialized row ran 7-13 % slower at
    # M = 4096 on the short-K DeepSeek-V3 shapes, the same elsewhere (H100, 23825c6, one-off A/B, three
    # interleaved rounds of CUDA-graph replays, cold L2; ratio to cuBLAS blockwise, TMA against registers):
    # (N, K) = (7168, 2048) 0.933 / 0.867, (24576, 1536) 0.987 / 0.860, (2112, 7168) 0.862 / 0.859, (7168, 16384)
    # 0.851 / 0.853, 8192^3 0.837 / 0.833. Outputs bit-equal.
    tma_store: bool = True


# GPU launch table by M. M > 64 swept at 8192^3 on the H200 (`python -m bench.gemm.block_fp8_launch_sweep`;
# cuBLAS blockwise `_scaled_mm` 1128 TFLOP/s in the same run): 128x128 tiles, 8 warps, 3 stages, GROUP_M 16:
# 876 TFLOP/s = 0.776x (GROUP_M 8: 853-863 at 3-4 stages; persistent 805-854; 64x128 / 4 warps 808-832;
# warp-specialized 64x128 502-541). Every K step waits for its wgmma before the per-block scaling FMAs (see
# the module doc), which is what caps it below cuBLAS. On sm_90, M > 64 takes WGMMA_WS_CONFIG instead; this row serves
# other GPUs.
# M <= 64 (weight-bandwidth-bound: a 64-row tile, wgmma's minimum M, and split-K to put every SM on the weight
# stream) was not swept; the bench runs it at 0.78-1.14x cuBLAS blockwise for M = 1 and 16 on the four
# DeepSeek-V3 shapes (reports/cuda-h200/block_fp8_gemm_n*.md).
# M <= 16 (decode): a 16-row tile takes the mma.sync path. Swept on Llama-3.1-8B's projections (N x K 6144 x
# 4096, 4096 x 4096, 28672 x 4096, 4096 x 14336; CUDA-graph replays, cold L2, the split sum of kernels.split_k;
# reports/cuda-h200/launch_sweeps/block_fp8_launch_sweep.csv): at M = 1, 18.1 / 14.1 / 43.1 / 29.3 us against
# 18.0 / 14.5 / 47.0 / 29.0 for the 64-row row below, at M = 8 18.3 / 14.3 / 43.3 / 30.2 against 18.3 / 14.6 /
# 44.7 / 30.1; cuBLAS blockwise 18.4 / 17.9 / 50.1 / 33.4 at M = 1.
GPU_CONFIGS: tuple[tuple[int, LaunchConfig], ...] = (
    (16, LaunchConfig(block_m=16, block_n=128, group_m=1, split_k=0, num_warps=4, num_stages=4)),
    (64, LaunchConfig(block_m=64, block_n=128, group_m=1, split_k=0, num_warps=4, num_stages=4)),
    (1 << 62, LaunchConfig(block_m=128, block_n=128, group_m=16, split_k=1, num_warps=8, num_stages=3)),
)
# The Gluon kernel, all warps in one partition: 128x128 tiles, 8 warps, 4 stages, GROUP_M 16, one program an SM
# walking the tiles. H200, one-off A/B at the bar's shapes (triton.testing.do_bench, cold L2; cuBLAS blockwise
# `_scaled_mm` and the tiled row above in the same run), as a ratio to cuBLAS: 8192^3 0.849 (tiled 0.761);
# DeepSeek-V3 at M = 4096, (N, K) = (7168, 2048) 0.923 (0.702), (2112, 7168) 0.810 (0.685), (7168, 16384) 0.825
# (0.763), (24576, 1536) 0.957 (0.754). Every output bit-equal to the tiled kernel's.
WGMMA_CONFIG = LaunchConfig(block_m=128, block_n=128, group_m=16, persistent=True, num_stages=4, wgmma=True)
# M > 64 on sm_90: its warp-specialized form (a producer warp, two consumer warp groups that never wait for each
# other), GROUP_M 8, 6 stages. H200 launch sweep, two runs (`python -m bench.gemm.block_fp8_launch_sweep --quick`
# at the five shapes above, CUDA-graph replays, cold L2; reports/cuda-h200/launch_sweeps/block_fp8_launch_sweep.csv),
# ratio to cuBLAS blockwise of the same run, in the order above: this row (second run) 0.997 / 0.997 / 0.908 /
# 0.956 / 1.045; GROUP_M 16 at 4 stages 0.976-0.996 / 0.993-0.995 / 0.896-0.908 / 0.923-0.932 / 1.028-1.033, at 6
# stages 0.943-1.002 / 0.998-1.006 / 0.885-0.905 / 0.947-1.001 / 1.032-1.039; GROUP_M 8 at 4 stages 1.005-1.023 /
# 0.995-0.998 / 0.881-0.909 / 0.953-0.962 / 1.002-1.019; one program a tile 0.924 / 0.826-0.835 / 0.848-0.868 /
# 0.924-0.934 / 0.828-0.852; 128x64 tiles 0.62-0.79 (a 64-column wgmma per warp group). (2112, 7168) is held by
# its waves: 17 x 32 = 544 tiles are 4.12 waves of 132 SMs, so 16 SMs take a fifth tile. Launching the 64 columns
# past its last whole 128-wide block apart (the tiled kernel, 64 x 64 tiles; 512 whole tiles left, 3.88 waves) ran
# slower: 145.1 us against this row's 126.4 (0.80x against 0.92x cuBLAS blockwise, same sweep run at 89a9b28): the
# second launch runs after the first, not beside it.
WGMMA_WS_CONFIG = dataclasses.replace(WGMMA_CONFIG, group_m=8, num_stages=6, warp_specialize=True)
# Up to this many rows of A, where the PTX runs, the op is `kernels.block_fp8_gemv`'s tensor-core GEMV (one pass
# over the weights per 8 rows). H200, CUDA-graph replays, cold L2 (a one-off timing of both paths, 990174f): at
# M = 1 on Llama-3.1-8B's projections (N x K 6144 x 4096, 4096 x 4096, 28672 x 4096, 4096 x 14336) 14.8 / 12.7 /
# 42.8 / 28.8 us against the tiled GEMM's 18.1 / 14.1 / 42.7 / 29.3 (DeepSeek-V3's 7168 x 2048: 11.6 against
# 13.1); at M = 8 within 1 % of those; at M = 16 (two passes) 71.7 against 43.1 us on 28672 x 4096.
GEMV_MAX_M = 8
# The interpreter pays per program and per op, not per FLOP: few, small programs.
INTERPRETER_CONFIG = LaunchConfig(block_m=32, block_n=64, group_m=1, split_k=1, num_warps=4, num_stages=1)
MIN_K_BLOCKS_PER_SPLIT = 4  # below this the fp32 partials cost more traffic than the split saves


def auto_split_k(m: int, n: int, k: int, block_m: int, block_n: int, sms: int) -> int:
    """Enough K splits to give every SM a tile, each split at least MIN_K_BLOCKS_PER_SPLIT blocks deep."""
    return fill_splits(triton.cdiv(m, block_m) * triton.cdiv(n, block_n), sms, (k // BLOCK) // MIN_K_BLOCKS_PER_SPLIT)


def choose_config(m: int, n: int, k: int, device: torch.device) -> LaunchConfig:
    """The launch table's config for this shape (split_k 0 is resolved by the launcher)."""
    if runs_interpreted(device):
        return INTERPRETER_CONFIG
    if m > GPU_CONFIGS[1][0] and block_fp8_gemm_wgmma.runs_on(device):
        return WGMMA_WS_CONFIG
    return next(cfg for max_m, cfg in GPU_CONFIGS if m <= max_m)


@triton.jit
def _tile_coords(tile, num_m, num_n, GROUP_M: tl.constexpr):
    """Grouped order: GROUP_M tile rows share each B column tile while it is in L2."""
    tiles_per_split = num_m * num_n
    split = tile // tiles_per_split
    tile = tile - split * tiles_per_split
    in_group = GROUP_M * num_n
    first_m = (tile // in_group) * GROUP_M
    group_rows = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (tile % in_group) % group_rows
    pid_n = (tile % in_group) // group_rows
    return pid_m, pid_n, split


@triton.jit
def _gemm_tile(
    a_desc,
    b_desc,
    c_ptr,
    as_ptr,
    bs_ptr,
    pid_m,
    pid_n,
    split,
    M,
    N,
    k_blocks,
    k_per_split,
    stride_cs,
    stride_cm,
    stride_cn,
    stride_asm,
    stride_ask,
    stride_bsn,
    stride_bsk,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    WARP_SPECIALIZE: tl.constexpr,
    FAULT: tl.constexpr,
):
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    k_lo = split * k_per_split
    k_hi = tl.minimum(k_lo + k_per_split, k_blocks)
    n_blocks = tl.cdiv(N, 128)
    if BLOCK_N <= 128:
        n_block = (pid_n * BLOCK_N) // 128
    else:
        n_block = offs_n // 128
    if FAULT == 2:
        n_block = (n_block + 1) % n_blocks
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for kb in tl.range(k_lo, k_hi, warp_specialize=WARP_SPECIALIZE):
        a = a_desc.load([pid_m * BLOCK_M, kb * 128])
        b = b_desc.load([pid_n * BLOCK_N, kb * 128])
        a_s = tl.load(as_ptr + offs_m * stride_asm + kb * stride_ask, mask=offs_m < M, other=0.0)
        kb_w = kb
        if FAULT == 1:
            kb_w = (kb + 1) % k_blocks
        if BLOCK_N <= 128:
            b_s = tl.load(bs_ptr + n_block * stride_bsn + kb_w * stride_bsk)
            acc += tl.dot(a, b.T) * (a_s * b_s)[:, None]
        else:
            b_s = tl.load(bs_ptr + n_block * stride_bsn + kb_w * stride_bsk, mask=offs_n < N, other=0.0)
            acc += tl.dot(a, b.T) * (a_s[:, None] * b_s[None, :])
    rows = offs_m.to(tl.int64)
    c_ptrs = c_ptr + split.to(tl.int64) * stride_cs + rows[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(offs_m < M)[:, None] & (offs_n < N)[None, :])


@triton.jit
def _block_fp8_gemm_kernel(
    a_desc,
    b_desc,
    c_ptr,
    as_ptr,
    bs_ptr,
    M,
    N,
    k_blocks,
    k_per_split,
    num_programs,
    stride_cs,
    stride_cm,
    stride_cn,
    stride_asm,
    stride_ask,
    stride_bsn,
    stride_bsk,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    GROUP_M: tl.constexpr,
    SPLIT_K: tl.constexpr,
    PERSISTENT: tl.constexpr,
    WARP_SPECIALIZE: tl.constexpr,
    FAULT: tl.constexpr,
    PDL: tl.constexpr,
):
    wait_then_release(PDL)  # kernels._pdl: before any read of an earlier kernel's output
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    if PERSISTENT:
        for tile in tl.range(tl.program_id(0), num_m * num_n * SPLIT_K, num_programs, flatten=True):
            pid_m, pid_n, split = _tile_coords(tile, num_m, num_n, GROUP_M)
            _gemm_tile(
                a_desc,
                b_desc,
                c_ptr,
                as_ptr,
                bs_ptr,
                pid_m,
                pid_n,
                split,
                M,
                N,
                k_blocks,
                k_per_split,
                stride_cs,
                stride_cm,
                stride_cn,
                stride_asm,
                stride_ask,
                stride_bsn,
                stride_bsk,
                BLOCK_M,
                BLOCK_N,
                WARP_SPECIALIZE,
                FAULT,
            )
    else:
        pid_m, pid_n, split = _tile_coords(tl.program_id(0), num_m, num_n, GROUP_M)
        _gemm_tile(
            a_desc,
            b_desc,
            c_ptr,
            as_ptr,
            bs_ptr,
            pid_m,
            pid_n,
            split,
            M,
            N,
            k_blocks,
            k_per_split,
            stride_cs,
            stride_cm,
            stride_cn,
            stride_asm,
            stride_ask,
            stride_bsn,
            stride_bsk,
            BLOCK_M,
            BLOCK_N,
            WARP_SPECIALIZE,
            FAULT,
        )


def _check_tma_operand(name: str, t: torch.Tensor) -> None:
    """TMA reads rows of a 2-D tensor: unit stride along K, 16-byte aligned base and row stride."""
    if t.stride(1) != 1:
        raise ValueError(
            f"{name}: K must be the contiguous dim (stride 1), got strides {t.stride()}; call .contiguous()"
        )
    if t.stride(0) % 16 or t.data_ptr() % 16:
        raise ValueError(
            f"{name}: TMA needs a 16-byte aligned base and row stride, got data_ptr % 16 = "
            f"{t.data_ptr() % 16}, row stride {t.stride(0)}; call .clone()"
        )


def launch_block_fp8_gemm(
    a: torch.Tensor,
    a_scales: torch.Tensor,
    b: torch.Tensor,
    b_scales: torch.Tensor,
    out_dtype: torch.dtype = torch.bfloat16,
    config: LaunchConfig | None = None,
    fault: str = "none",
    gemv: bool | None = None,
) -> torch.Tensor:
    """Validate, allocate and launch; `config` overrides the launch table (sweeps, tests), `fault` plants a
    named bug (negative controls only). `gemv`: the tensor-core GEMV of `kernels.block_fp8_gemv` (True, on a
    device that runs its PTX), the tiled GEMM (False), or the table's choice (None: the GEMV up to
    GEMV_MAX_M rows where the PTX runs, unless `config` is given)."""
    check_block_fp8_gemm_args(a, a_scales, b, b_scales, out_dtype)
    device = check_device(a=a, a_scales=a_scales, b=b, b_scales=b_scales)
    m, k = a.shape
    n = b.shape[0]
    out = torch.empty(m, n, dtype=out_dtype, device=device)
    if m == 0 or n == 0:
        return out
    _check_tma_operand("a", a)
    _check_tma_operand("b", b)
    if gemv is None:
        gemv = config is None and m <= GEMV_MAX_M and packed_ptx(device)
    if gemv and config is not None:
        raise ValueError("config: the tiled GEMM's launch; the GEMV (gemv=True) takes none")
    if gemv:
        if not packed_ptx(device):
            raise ValueError(f"gemv: the tensor-core GEMV's PTX does not run on {device}")
        # the GEMV reads a weight scale row with unit stride along K (the scales are small: a copy otherwise)
        b_scales = b_scales if b_scales.stride(1) == 1 else b_scales.contiguous()
        return launch_fp8_gemv(a, a_scales, b, b_scales, out, FAULTS[fault])
    cfg = config or choose_config(m, n, k, device)
    if cfg.wgmma:
        if cfg.split_k != 1:
            raise ValueError(f"config: the wgmma kernel takes split_k 1, got {cfg.split_k}")
        # on every device alike
        block_fp8_gemm_wgmma.check_tiling(cfg.block_m, cfg.block_n, cfg.num_warps, cfg.warp_specialize)
        if block_fp8_gemm_wgmma.runs_on(device):
            programs = sm_count(device) if cfg.persistent else 0
            block_fp8_gemm_wgmma.launch(
                a, a_scales, b, b_scales, out, cfg.block_m, cfg.block_n, cfg.group_m, cfg.num_stages, cfg.num_warps,
                programs, FAULTS[fault], cfg.warp_specialize, cfg.tma_store,
            )  # fmt: skip
            return out
        # Its tiled Triton twin where wgmma does not run, at the stage count of the table's M > 64 row: four stages
        # of 128x128 FP8 A and B tiles take 128 KiB of shared memory, more than GPUs of ~100 KiB have.
        # The tiled twin is not warp-specialized: Triton's split of its K loop is another kernel.
        stages = min(cfg.num_stages, GPU_CONFIGS[-1][1].num_stages)
        cfg = dataclasses.replace(cfg, wgmma=False, warp_specialize=False, num_stages=stages)
    _launch_tiled(a, a_scales, b, b_scales, out, cfg, fault)
    return out


def _launch_tiled(a, a_scales, b, b_scales, out, cfg: LaunchConfig, fault: str) -> None:
    """The tiled kernel into `out` [M, N] (contiguous) on validated arguments."""
    m, k = a.shape
    n = b.shape[0]
    device = a.device
    if cfg.split_k == 0:
        cfg = dataclasses.replace(cfg, split_k=auto_split_k(m, n, k, cfg.block_m, cfg.block_n, sm_count(device)))
    if (cfg.block_n > 128 and cfg.block_n % 128) or (cfg.block_n < 128 and 128 % cfg.block_n):
        raise ValueError(f"config: block_n {cfg.block_n} must divide or be a multiple of {BLOCK}")
    k_blocks = k // BLOCK
    split, k_per_split = launch_split(k_blocks, cfg.split_k)
    target = out if split == 1 else torch.empty(split, m, n, dtype=torch.float32, device=device)
    c_strides = (0, *out.stride()) if split == 1 else target.stride()
    a_desc = TensorDescriptor(a, list(a.shape), list(a.stride()), [cfg.block_m, BLOCK])
    b_desc = TensorDescriptor(b, list(b.shape), list(b.stride()), [cfg.block_n, BLOCK])
    tiles = triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n) * split
    programs = tiles
    if cfg.persistent:
        programs = min(tiles, sm_count(device))
    _block_fp8_gemm_kernel[(programs,)](
        a_desc,
        b_desc,
        target,
        a_scales,
        b_scales,
        m,
        n,
        k_blocks,
        k_per_split,
        programs,
        *c_strides,
        *a_scales.stride(),
        *b_scales.stride(),
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        GROUP_M=cfg.group_m,
        SPLIT_K=split,
        PERSISTENT=cfg.persistent,
        WARP_SPECIALIZE=cfg.warp_specialize,
        FAULT=FAULTS[fault],
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
        **launch_args(device),
    )
    if split > 1:
        sum_splits(target, out)  # the K ranges added in split order (deterministic, no atomics), one rounding


@torch.library.custom_op("touchstone::block_fp8_gemm", mutates_args=())
def _block_fp8_gemm_op(
    a: torch.Tensor, a_scales: torch.Tensor, b: torch.Tensor, b_scales: torch.Tensor, out_dtype: torch.dtype
) -> torch.Tensor:
    return launch_block_fp8_gemm(a, a_scales, b, b_scales, out_dtype)


@_block_fp8_gemm_op.register_fake
def _(a, a_scales, b, b_scales, out_dtype):
    check_block_fp8_gemm_args(a, a_scales, b, b_scales, out_dtype)
    return a.new_empty(a.shape[0], b.shape[0], dtype=out_dtype)


def block_fp8_gemm(
    a: torch.Tensor,
    a_scales: torch.Tensor,
    b: torch.Tensor,
    b_scales: torch.Tensor,
    out_dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """Kernel twin of `reference.gemm.block_fp8.block_fp8_gemm_mirror` (same arguments)."""
    return torch.ops.touchstone.block_fp8_gemm(a, a_scales, b, b_scales, out_dtype)
