"""W4A16 NVFP4 GEMM in Triton: y = x @ W^T, x bf16 [M, K], W as NVFP4 codes [N, K/2] + E4M3 scales [N, K/16] under
one fp32 global scale (`reference.quant.nvfp4`'s interchange layout, as checkpoints and the quantize op store it).

Op: `touchstone::w4a16_nvfp4_gemm(x, codes, scales, decode_scale) -> y` (bf16 [M, N]); call it through
`w4a16_nvfp4_gemm` below, which has the reference's signature (`reference.gemm.w4a16_nvfp4`). It computes what the
mirror computes: the weights are decoded inside the K loop (never written out) as E2M1 value times their block's
E4M3 scale, exact in bf16, multiplied with x on the tensor cores (fp32 accumulation), and the fp32 sum of each
output (each split's, with split-K) is multiplied by the global decode scale before the one bf16 rounding. Hopper
has no FP4 tensor cores: this is the weight-only path of an NVFP4 checkpoint there (vLLM's is Marlin's FP4 kernel).

Structure: one kernel for every M, the MMA computed transposed (y^T tile [BLOCK_N, BLOCK_M] = W tile [BLOCK_N, BK] @
x tile^T), so the decoded weights are tl.dot's first operand and BLOCK_M may be 16 (M = 1..16 pays for 16 MMA
rows). A K tile is GROUPS blocks of 16: its code bytes [BLOCK_N, GROUPS * 8] are split into low and high nibbles
(elements 2i and 2i + 1), each decoded in fp32 integer ops (`kernels.w4a16_mxfp4_gemm._signed_nibble`: the E2M1
value times 2**-126) and multiplied by 2**126 and the block's scale (the E4M3 byte through Triton's fp8 cast), then
interleaved back into K order for one dot with x read in K order. Rows past N and blocks past K read as code 0
(zero weights). Split-K (`kernels.split_k`) for the tall-K, few-row shapes of decode.

On NVIDIA sm_90 and later the weights are decoded by packed integer and bf16x2 instructions instead
(`_blocked_nvfp4_weights`, through the MXFP4 GEMM's `_packed_word_weights`): the codes read as int32 words (two a block
row), each word's eight codes four bf16x2 registers of E2M1 value times 2**-126, times 2**126 and the block's
E4M3 scale as a bf16x2 pair (E2M1 times E4M3 has at most 6 significant bits and lies in 2**-10 .. 2688, so
every product is exact in bf16), and x's K tile permuted to the words' order (`_in_word_k_order`). Both decodes
give the same bytes (`packed_decode`); codes whose rows are not whole int32 words take the fp32 decode.

Every launch-table row compiles for sm_90 (Triton 3.6 without a GPU: `triton.compile` on a GPUTarget("cuda", 90,
32), which the suite runs) to wgmma and a cubin, in both decodes and both EVEN_K forms.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._boundary import check_device, runs_interpreted
from kernels._packed_ptx import packed_ptx
from kernels._tiles import store_partial
from kernels.split_k import launch_split, sum_splits
from kernels.w4a16_mxfp4_gemm import _in_word_k_order, _packed_word_weights, _signed_nibble
from reference.gemm.w4a16_nvfp4 import check_w4a16_nvfp4_args
from reference.quant.nvfp4 import NVFP4_BLOCK_SIZE
from reference.quant.nvfp4_global_scale import DecodeScale, GlobalScale, decode_value

TWO_126 = tl.constexpr(8.507059173023462e37)

# Planted bugs for the suite's negative controls; FAULT is a constexpr, so fault 0 compiles them away.
FAULTS = {
    "none": 0,
    "scale_of_next_block": 1,  # block j's weights scaled by block j+1's scale (the last block keeps its own)
    "swap_nibbles": 2,  # the high nibble taken as element 2i
    "no_global_scale": 3,  # the fp32 sums rounded without the global scale
    "scale_past_end": 4,  # block j scaled by block j+1's scale, unclamped: the last row reads one scale past the end
}

# (largest M, BLOCK_N, BLOCK_M, GROUPS, SPLIT_K, warps, stages): the first row whose M bound holds. Swept on the
# H200 (`python -m bench.gemm.w4a16_nvfp4_launch_sweep`, N = K = 8192, CUDA-graph replays with an L2 flush, the
# packed decode; bf16 matmul 44.6 / 45.1 / 47.1 / 53.2 us at M = 1 / 16 / 64 / 256): M = 16 37.7 us = 1.20x bf16
# (M = 1 39.0 us; the best there, (128, 16, 4, 8, 4, 3), 38.0); M = 64 49.4 us = 0.96x (the fp32 decode of the
# previous row 64.1 us); M = 256 120.2 us = 0.44x (0.83x dequantize-then-matmul's 99.4 us: the runner dequantizes
# there). The M <= 32 and larger-M rows are the MXFP4 dot path's, not swept here.
_GPU_CONFIGS = (
    (16, 64, 16, 8, 4, 4, 3),
    (32, 64, 32, 8, 4, 4, 3),
    (64, 128, 64, 4, 4, 8, 3),
    (256, 128, 128, 4, 2, 4, 3),
    (None, 128, 128, 8, 1, 8, 3),
)
# The interpreter costs ~1 ms per program and much more per tl.dot: few programs, short K loops.
_INTERPRETER_CONFIGS = ((None, 16, 16, 2, 1, 1, 1),)


@triton.jit
def _tile_operands(
    codes_ptr, scales_ptr, n, n_mask, tile, codes_row_stride, scales_row_stride, n_blocks,
    GROUPS: tl.constexpr, UNITS: tl.constexpr, EVEN_K: tl.constexpr, FAULT: tl.constexpr,
):  # fmt: skip
    """K tile `tile` of rows n as loaded: codes [BLOCK_N, GROUPS * UNITS] (UNITS code elements a block row: 8
    bytes, or 2 int32 words) and E4M3 scale bytes [BLOCK_N, GROUPS]; rows past N and blocks past K (`EVEN_K`
    false) read as code 0 and scale 0. The planted scale faults act here."""
    unit = tile * GROUPS * UNITS + tl.arange(0, GROUPS * UNITS)
    block = tile * GROUPS + tl.arange(0, GROUPS)
    scale_block = block
    if FAULT == 1:
        scale_block = tl.minimum(block + 1, n_blocks - 1)
    if FAULT == 4:
        scale_block = block + 1
    code_offsets = n[:, None] * codes_row_stride + unit[None, :]
    scale_offsets = n[:, None] * scales_row_stride + scale_block[None, :]
    if EVEN_K:
        codes = tl.load(codes_ptr + code_offsets, mask=n_mask[:, None], other=0)
        scale = tl.load(scales_ptr + scale_offsets, mask=n_mask[:, None], other=0)
    else:
        codes = tl.load(codes_ptr + code_offsets, mask=n_mask[:, None] & (unit // UNITS < n_blocks)[None, :], other=0)
        scale = tl.load(scales_ptr + scale_offsets, mask=n_mask[:, None] & (block < n_blocks)[None, :], other=0)
    return codes, scale


@triton.jit
def _nvfp4_weight_tile(
    codes_ptr, scales_ptr, n, n_mask, tile, codes_row_stride, scales_row_stride, n_blocks,
    GROUPS: tl.constexpr, EVEN_K: tl.constexpr, FAULT: tl.constexpr,
):  # fmt: skip
    """K tile `tile` of rows n as bf16 [BLOCK_N, GROUPS * 16] in K order: E2M1 value times the block's E4M3
    scale, exact, decoded in fp32 from the code bytes. Blocks past K and rows past N read as code 0."""
    BYTES: tl.constexpr = GROUPS * 8
    codes, scale = _tile_operands(
        codes_ptr, scales_ptr, n, n_mask, tile, codes_row_stride, scales_row_stride, n_blocks, GROUPS, 8, EVEN_K,
        FAULT,
    )  # fmt: skip
    scale = scale.to(tl.float8e4nv, bitcast=True).to(tl.float32)
    scale = tl.reshape(tl.broadcast_to(scale[:, :, None], [n.shape[0], GROUPS, 8]), [n.shape[0], BYTES])
    codes = codes.to(tl.int32)
    low = _signed_nibble(codes << 28) * TWO_126 * scale  # element 2i: exact (a bf16 value, see the reference)
    high = _signed_nibble(codes << 24) * TWO_126 * scale  # element 2i + 1
    if FAULT == 2:
        low, high = high, low
    return tl.reshape(tl.join(low, high), [n.shape[0], BYTES * 2]).to(tl.bfloat16)


@triton.jit
def _e4m3_scale_pairs(scale):
    """E4M3 bytes -> int32 bf16x2 of the scale in both halves (exact: every E4M3 value is a bf16 value; NaN
    stays NaN), the packed decode's scale operand."""
    bits = scale.to(tl.float8e4nv, bitcast=True).to(tl.bfloat16).to(tl.uint16, bitcast=True).to(tl.uint32)
    return (bits * 0x00010001).to(tl.int32, bitcast=True)


@triton.jit
def _blocked_nvfp4_weights(
    words_ptr, scales_ptr, n, n_mask, tile, words_row_stride, scales_row_stride, n_blocks,
    GROUPS: tl.constexpr, EVEN_K: tl.constexpr, FAULT: tl.constexpr,
):  # fmt: skip
    """`_nvfp4_weight_tile`'s values by the packed decode, columns in `_in_word_k_order`: words_ptr holds the
    codes as int32 words (8 codes each, 2 a block and row), so a thread's loads are whole 8-byte block rows and
    it needs one scale per block and row. Rows past N and blocks past K read as code 0 and scale 0."""
    WORDS: tl.constexpr = GROUPS * 2
    codes, scale = _tile_operands(
        words_ptr, scales_ptr, n, n_mask, tile, words_row_stride, scales_row_stride, n_blocks, GROUPS, 2, EVEN_K,
        FAULT,
    )  # fmt: skip
    pairs = tl.broadcast_to(_e4m3_scale_pairs(scale)[:, :, None], [n.shape[0], GROUPS, 2])
    pairs = tl.reshape(pairs, [n.shape[0], WORDS])
    return _packed_word_weights(codes, pairs, FAULT == 2)


@triton.jit
def _w4a16_nvfp4_kernel(
    x_ptr, codes_ptr, scales_ptr, decode_ptr, out_ptr, M, N, n_blocks, tiles_per_split, x_row_stride,
    codes_row_stride, scales_row_stride, out_row_stride, out_split_stride,
    BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, GROUPS: tl.constexpr, EVEN_K: tl.constexpr,
    OUT_FP32: tl.constexpr, FAULT: tl.constexpr, PACKED: tl.constexpr = False,
):  # fmt: skip
    # program (n tile, m tile, split); acc is y^T's tile. PACKED: codes_ptr holds int32 words, its stride in words.
    pid_n, pid_m, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = n < N
    n = tl.where(n_mask, n, 0).to(tl.int64)
    m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    m_mask = m < M
    m = tl.where(m_mask, m, 0).to(tl.int64)
    BK: tl.constexpr = GROUPS * 16
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    first = split * tiles_per_split
    last = tl.minimum(first + tiles_per_split, tl.cdiv(n_blocks, GROUPS))
    for tile in range(first, last):
        if PACKED:
            w = _blocked_nvfp4_weights(
                codes_ptr, scales_ptr, n, n_mask, tile, codes_row_stride, scales_row_stride, n_blocks, GROUPS,
                EVEN_K, FAULT,
            )  # fmt: skip
        else:
            w = _nvfp4_weight_tile(
                codes_ptr, scales_ptr, n, n_mask, tile, codes_row_stride, scales_row_stride, n_blocks, GROUPS,
                EVEN_K, FAULT,
            )  # fmt: skip
        k = tile * BK + tl.arange(0, BK)
        x_offsets = m[:, None] * x_row_stride + k[None, :]
        if EVEN_K:
            x = tl.load(x_ptr + x_offsets)
        else:
            x = tl.load(x_ptr + x_offsets, mask=(k < n_blocks * 16)[None, :], other=0.0)
        if PACKED:
            x = _in_word_k_order(x, BK)
        acc = tl.dot(w, tl.trans(x), acc)
    if FAULT != 3:
        acc = acc * tl.load(decode_ptr)
    out = out_ptr + split.to(tl.int64) * out_split_stride + m[None, :] * out_row_stride + n[:, None]
    store_partial(out, acc, n_mask[:, None] & m_mask[None, :], OUT_FP32)


def packed_decode(codes: torch.Tensor) -> bool:
    """Whether the weight tiles of `codes` are decoded by the packed PTX (NVIDIA sm_90 and later, codes whose rows
    are whole int32 words) or in fp32 (`_nvfp4_weight_tile`: the interpreter, ROCm, older NVIDIA GPUs). Both give
    the same bytes."""
    words = codes.shape[1] % 4 == 0 and codes.stride(0) % 4 == 0 and codes.storage_offset() % 4 == 0
    return words and packed_ptx(codes.device)


def launch_config(m: int, device: torch.device) -> tuple:
    """(BLOCK_N, BLOCK_M, GROUPS, SPLIT_K, warps, stages) for M rows on `device`."""
    table = _INTERPRETER_CONFIGS if runs_interpreted(device) else _GPU_CONFIGS
    return next(row[1:] for row in table if row[0] is None or m <= row[0])


def launch(
    x: torch.Tensor,
    codes: torch.Tensor,
    scales: torch.Tensor,
    decode_scale: torch.Tensor,
    config: tuple | None = None,
    fault: str = "none",
    packed: bool | None = None,
) -> torch.Tensor:
    """Validate, allocate and launch on the decode scale (a 0-dim fp32 tensor on x's device). `config` overrides
    the table (launch sweeps); `fault` plants a named bug (negative controls only); `packed` overrides
    `packed_decode` (False: the fp32 decode on any device; True where it is not available is refused)."""
    check_w4a16_nvfp4_args(x, codes, scales, DecodeScale(decode_scale))
    check_device(x=x, codes=codes, scales=scales, decode_scale=decode_scale)
    for name, t in (("x", x), ("codes", codes), ("scales", scales)):
        if t.shape[1] > 1 and t.stride(1) != 1:
            raise ValueError(f"{name}: last dim must have stride 1, got strides {t.stride()}; call .contiguous()")
    m, k = x.shape
    n = codes.shape[0]
    y = torch.empty(m, n, dtype=torch.bfloat16, device=x.device)
    if m == 0 or n == 0:
        return y
    if k == 0:
        return y.zero_()
    if packed and not packed_decode(codes):
        raise ValueError("packed=True: the packed decode needs NVIDIA sm_90+ and codes rows of whole int32 words")
    packed = packed_decode(codes) if packed is None else packed
    words = codes.view(torch.int32) if packed else codes
    block_n, block_m, groups, split_k, warps, stages = config or launch_config(m, x.device)
    n_blocks = k // NVFP4_BLOCK_SIZE
    split_k, tiles_per_split = launch_split(triton.cdiv(n_blocks, groups), split_k)
    out = y if split_k == 1 else torch.empty(split_k, m, n, dtype=torch.float32, device=x.device)
    _w4a16_nvfp4_kernel[(triton.cdiv(n, block_n), triton.cdiv(m, block_m), split_k)](
        x, words, scales, decode_scale, out, m, n, n_blocks, tiles_per_split, x.stride(0), words.stride(0),
        scales.stride(0), n, m * n,
        BLOCK_N=block_n, BLOCK_M=block_m, GROUPS=groups, EVEN_K=n_blocks % groups == 0, OUT_FP32=split_k > 1,
        FAULT=FAULTS[fault], PACKED=packed, num_warps=warps, num_stages=stages,
    )  # fmt: skip
    if split_k > 1:
        sum_splits(out, y)
    return y


@torch.library.custom_op("touchstone::w4a16_nvfp4_gemm", mutates_args=())
def _gemm_op(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, decode_scale: torch.Tensor) -> torch.Tensor:
    return launch(x, codes, scales, decode_scale)


@_gemm_op.register_fake
def _(x, codes, scales, decode_scale):
    check_w4a16_nvfp4_args(x, codes, scales, DecodeScale(decode_scale))
    return x.new_empty(x.shape[0], codes.shape[0], dtype=torch.bfloat16)


def w4a16_nvfp4_gemm(
    x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, global_scale: GlobalScale
) -> torch.Tensor:
    """Kernel twin of `reference.gemm.w4a16_nvfp4.w4a16_nvfp4_gemm_mirror` (bf16 [M, N])."""
    # the op validates the operands at its boundary; here only the scale's convention is resolved
    return torch.ops.touchstone.w4a16_nvfp4_gemm(x, codes, scales, decode_value(global_scale))
