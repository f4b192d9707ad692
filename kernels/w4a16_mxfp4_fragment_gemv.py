"""W4A16 MXFP4 GEMV on tensor cores, in Triton with inline PTX: y = x @ W^T for a few rows of x (decode), W in
`kernels.mxfp4_fragment_layout`'s prepared layout.

Op: `touchstone::w4a16_mxfp4_fragment_gemv(x, words, pairs) -> y` (bf16 [M, N]); call it through
`w4a16_mxfp4_fragment_gemv` below. It computes what `reference.gemm.w4a16_mxfp4.w4a16_mxfp4_gemm_mirror` computes
for the interchange codes and scales that `kernels.mxfp4_fragment_layout.interchange` gives back.

Why: the CUDA-core GEMV (`kernels.w4a16_mxfp4_gemm._gemv_kernel`) issues ~4.9 instructions a weight (decode, an
FFMA each, x's conversions; Nsight Compute on the H200 at N = K = 8192: 10.2 M warp instructions, 0.74 issued a
cycle per scheduler), and its tensor-core path pays ~4.4 a weight in its decode at M = 2..16. Here each thread
runs one `mma.sync.m16n8k16` per 8 of its weights and the fragment layout decodes a weight in 9/8 integer ops:
~2.6 instructions a weight in the sm_90 SASS of the K loop at every M up to 8, 3.1 up to 16.

Measured (H200, one launch a CUDA-graph replay with a cold L2, N = K = 8192 unless named, at b9dd9a4, before PDL
and the launch by the grid): M = 1 19.2-19.7 us against the CUDA-core GEMV's 20.2 (1.03-1.05x; gpt-oss's 5760 x 2880
1.14x; Llama-3.1-8B's projections 0.93-1.0x); M = 8 20.2 us against 37.7 (1.87x, 2.2x bf16 matmul); M = 16 (two
column groups) 34.0 us against 38.1. At M = 1 the kernel is no longer issue-bound (0.54 issued a cycle per
scheduler, DRAM 42 % busy, 33 % of stalls on global loads) but latency-bound like any single-wave stream of this
size: a plain Triton read of the same 34 MiB takes 17.0 us (0.50x the 1 GiB memcpy roof) and a device copy of it
23.1 us, so this GEMV runs at 0.88x the same-size read. Launched as a decode step launches it (with PDL, 8 in a
CUDA graph on distinct weights: `bench.gemm.w4a16_mxfp4_gemv_sweep`) its launch and ramp-up overlap the GEMV before:
13.9 us at M = 1 (0.64x memcpy), 14.9 at M = 8, 20.3 at M = 16, 38.4 at M = 32; 28672 x 4096 at M = 1 21.7 us
(0.72x). Scale bytes in place of the bf16 pairs (4.25 bits a weight instead of 4.5, decoded with prmt, shl and a
packed max for byte 0) were 2.7 % slower at M = 1 and 1.8 % faster at M = 8 in such chains of the 8B projections:
not taken. The lone launch at baf4e9f (reports/cuda-h200/w4a16_mxfp4_gemm.md): M = 1 19.6 us, M = 4 19.9 us, M = 16
28.3 us (36.1 us at M = 1 in the 696e54f run did not come back: 19.1-19.7 us in four graph replays since).

Structure. Thread tensors have one element a thread (shape [32 * WARPS]), so the inline PTX sees exactly the registers
of its lane and can issue the warp-wide `mma.sync` (all 32 lanes always execute it: no masks on the asm). Program p
takes rows 16p .. 16p + 15 (a row tile; with TILES = 2, tiles 2p and 2p + 1 on the same x pairs) and the x rows 8q .. 8q
+ 7 (q = program_id(1): column n of the MMA is x row 8q + n, rows past M read row M - 1 and are not stored; past M = 8 a
program takes two such column groups, 16 x rows, on the same decoded weights); its WARPS warps take K steps (64) in
turns, U consecutive steps a turn, with DEPTH turns of loads issued ahead in registers, and add their fp32 partials
through shared memory at the end. With WTILES warp teams (WTILES > 1) a program takes WTILES times the row tiles: team
i (warps i, i + WTILES, ...) works on its own tile(s) and takes the steps in turns within the team, all teams reading
the same x pairs at about the same time, so x comes from L2 once for the program and from L1 for the other teams (above
8 rows x is most of what a lane reads a step). Per step and lane: decode four words (R0..R3 of rows g and g + 8, blocks
0 and 1) and multiply each register by 2**126 (exact: the E2M1 value as a normal bf16), two MMAs a block into a zeroed
fp32 fragment (x rows as the B fragment, read as bf16 pairs), then acc += block sum * scale (fp32 FMA; the scale from
its bf16 in one op).

Arithmetic: products of bf16 x and exact E2M1 weights in the tensor core's fp32 accumulation, each block's sum
scaled by its power of two (exact unless it over- or underflows) and added in fp32; one rounding to bf16. The
same class of order as `kernels.w4a16_mxfp4_gemm`'s dot path (lossy bounds against the mirror; named cases
exact). Scale byte 0xFF gives NaN for its row; bytes 253 and 254 are outside the contract as in the GEMM.

Above GEMV_MAX_M rows, and at every M where the PTX cannot run (the interpreter, ROCm, NVIDIA before sm_90:
`kernels._packed_ptx.packed_ptx`), the op runs the tiled GEMM on the same words
(`kernels.w4a16_mxfp4_fragment_gemm`): one layout serves every batch size, and the runner stores nothing else
(prefill dequantizes it: `kernels.mxfp4_fragment_dequantize`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels import mxfp4_fragment_layout as layout
from kernels import w4a16_mxfp4_fragment_gemm
from kernels._boundary import check_device
from kernels._packed_ptx import packed_ptx
from kernels._pdl import launch_args, wait_then_release
from kernels._tiles import mma_lanes, split4

# Planted bugs for the suite's negative controls (constexpr FAULT; 0 compiles them away).
FAULTS = {
    "none": 0,
    "rows_swapped": 1,  # rows g and g + 8 of a tile exchanged
    "scale_of_next_block": 2,  # block 0 of a step scaled by block 1's scale
}

GROUP = 8  # x rows of one MMA (n8); a program takes one group, or two when M > 8


# (WARPS, U steps a turn, DEPTH turns of loads ahead) by the grid: row tiles (N / 16), steps (K / 64) and rows of x.
# `python -m bench.gemm.w4a16_mxfp4_gemv_sweep` on the H200 (each GEMV launched with PDL in a CUDA graph of 8 on
# distinct weights, as the decode step runs them; N 2048..28672 x K 2048..14336 at M = 1, 8, 16, and N 4096..28672 x
# K 4096..14336 at M = 16, 24, 32; reports/cuda-h200/launch_sweeps/w4a16_mxfp4_gemv_sweep.csv). One column group
# (M <= 8): U = 2 with DEPTH 1 was the best or within 1 % on every shape (U = 1, DEPTH 0 or 2: 3-60 % slower;
# Triton's own pipelining, `tl.range(num_stages=3..8)`, 2-7x slower, not offered), and the warps a program follow
# the grid: 256 row tiles or fewer with K of 8192 and more want 16 (4096 x 14336: 13.3 us against 15.2 with 8), 1792
# tiles 4 (28672 x 4096: 21.8 us against 24.1), 8 in between (8192 x 8192: 14.0 us, 16.6 with 4, 17.4 with 16).
U_STEPS, DEPTH_TURNS = 2, 1
# Two column groups a program (M > 8): the best by row tiles, for up to 16 rows and for more (two or more programs a
# row tile), within 8 % of each shape's best at K >= 4096. 128 tiles or fewer: 8 warps, 16 at K = 14336 up to 16
# rows, 4 at K = 2048 above (2048 x 2048 at M = 32: 6.2 us, 7.5 with 8). K = 2048 from 256 tiles: 4 warps (4096 x
# 2048 at M = 16: 6.7 us, 7.6 with (8, 2, 1)).
# Measured at M = 16 / 32 (us): 4096 x 14336 (8, 2, 1) 22.6 / (8, 1, 1) 29.9; 6144 x 4096 (8, 2, 1) 10.7 / (4, 2, 1)
# 13.8, where (8, 1, 1) took 12.4 / 22.4; 8192 x 8192 (8, 1, 1) 20.4 / 39.0, where (4, 2, 1) took 23.7 / 40.7;
# 14336 x 8192 (4, 2, 1) 38.6 / 61.6, 3 % behind (8, 1, 1) at M = 16 and 17 % ahead at 32.
TWO_GROUPS = (  # (most row tiles, config up to 16 rows, config above)
    (256, (8, 2, 1), (8, 1, 1)),
    (384, (8, 2, 1), (4, 2, 1)),
    (512, (8, 1, 1), (8, 1, 1)),
)
# Above 16 rows the GEMV's programs re-read each row tile's words once per 16 rows. Since the tiled GEMM decodes each
# lane's words straight into its wgmma operand (dac1247), it takes more than 16 rows on layers of BIG_TILE_STEPS row
# tiles x K steps or more (6144 x 4096 weights and up) and more than 32 elsewhere. H200, PDL chains of 8 launches on 8
# weight copies (`python -m bench.gemm.w4a16_mxfp4_gemv_sweep --teams`: the table's GEMV and its "tiled GEMM" control
# line), GEMV against the tiled GEMM's table row, us: M = 16: 8192 x 8192 18.8 / 21.7, 28672 x 4096 29.0 / 40.3, 6144 x
# 4096 11.0 / 14.3; M = 20: 8192 x 8192 28.0 / 23.5, 28672 x 4096 53.0 / 39.8, 4096 x 14336 27.2 / 24.5, 6144 x 4096
# 15.9 / 14.7, the smaller 4096 x 4096 10.3 / 11.0; M = 32: 4096 x 4096 10.5 / 11.2; M = 48: 4096 x 4096 15.9 / 14.6.
# Lone launches (CUDA-graph replays, cold L2) agree: M = 20, 8192 x 8192 31.4 / 26.7, 28672 x 4096 56.6 / 42.9. Before
# it (the tiled GEMM converting its decoded tiles through shared memory) the GEMV kept up to 48 and 64 rows.
GEMV_MAX_M = 32
WIDE_TILES = 1792  # row tiles of 28672-row layers (Llama-3.1-8B's gate_up)
BIG_TILE_STEPS, BIG_MAX_M = 384 * 64, 16
# Two row tiles a program (TILES = 2: each turn's x pairs read once for both tiles' MMAs) above 8 rows, where K is
# 8192 or more or the row tiles are WIDE_TILES or more; one elsewhere. The same sweep at 9428f7f (us, two tiles
# against the best of one; reports/cuda-h200/launch_sweeps/w4a16_mxfp4_gemv_sweep_row_tiles.csv): 8192 x 8192 at M
# = 24 / 32 (4, 2, 1) 28.2 / 28.4 against 38.2 / 38.5, at M = 16 (8, 2, 1) 19.8 against 20.4; 4096 x 14336 at M =
# 16 (16, 2, 1) 21.3, at M = 24 / 32 (8, 2, 1) 27.3 / 28.4; 28672 x 4096 at M = 16 / 24 (4, 2, 1) 32.5 / 56.8. A run
# before it had one tile at 22.8, 28.5 / 29.6, 35.0 / 57.5 on those. With K = 4096 on fewer row tiles (4096 and 6144
# rows) one tile was as fast or faster (6144 x 4096 at M = 16: 10.7 against 12.7), and at M <= 8 one tile was
# faster on 8192 x 8192 (13.9 against 18.2 at M = 1).
TWO_TILES_STEPS = 128
# Warp teams (WTILES = 2: half the warps on one row tile, half on the next, both reading the same x pairs at the same
# steps, so the second read of them comes from L1; a program then reads x once per 32 rows of W where it read it once
# per 16 or shared it in registers). Above 8 rows x is 2 to 4 times the bytes of the words a lane reads a step, and
# every program reads all of it from L2. Above 8 rows the config comes from ABOVE_8: `python -m
# bench.gemm.w4a16_mxfp4_gemv_sweep --m 16 24 32 48 64` on the H100 at 9032801 (N x K of 2048 x 2048, 4096 x 4096, 4096
# x 14336, 6144 x 4096, 8192 x 8192, 14336 x 4096, 28672 x 4096): each row is the config within 10 % of the best at each
# M of its band on the shapes it covers (re-run with this table at 2887807 and at 29464a2, whose CSV is
# reports/cuda-h100-80gb-hbm3/launch_sweeps/w4a16_mxfp4_gemv_sweep.csv: worst 1.095x the best, 6144 x 4096 at M = 48),
# where the table without teams (above, tuned on the H200) was up to 25 % behind. Us, this table against that one at the
# same M: M = 16: 6144 x 4096 10.9 against 14.3, 4096 x 14336 19.5 against 21.3, 28672 x 4096 30.6 against 34.0, 14336 x
# 4096 17.7 against 21.8 (one team, two tiles); M = 32: 14336 x 4096 26.8 against 33.6, 6144 x 4096 15.8 against 19.8,
# 4096 x 4096 10.4 against 12.0; M = 64: 8192 x 8192 50.1 against 53.5, 4096 x 14336 47.5 against 57.6. Four or eight
# teams were the best only on 4096 x 4096 at 24 to 64 rows, by under 1 %. Above 32 rows (two programs a pair of row
# tiles) the GEMV beat the tiled GEMM of then on every shape of the sweep (M = 64: 8192 x 8192 50.1 against 58.4, 4096
# x 14336 47.5 against 59.5, 2048 x 2048 6.8 against 13.0); the tiled GEMM of dac1247 takes those rows (GEMV_MAX_M,
# above), and `launch(..., gemv=True)` still runs these rows (the sweeps, the GPU tests).
ABOVE_8 = (  # (most rows of x, ((fewest row tiles, config), ...)): the first row whose bounds the layer is within
    (2 * GROUP, ((WIDE_TILES, (4, 2, 1, 2, 2)), (513, (4, 2, 1, 2)), (257, (8, 2, 1, 1, 2)))),
    (4 * GROUP, ((896, (4, 2, 1, 2, 2)), (257, (4, 2, 1, 2)), (129, (8, 2, 1, 1, 2)))),
    (8 * GROUP, ((512, (4, 2, 1, 2, 2)), (129, (4, 2, 1, 2)), (0, (8, 2, 1, 1, 2)))),
)
DEEP_UP_TO_16 = (16, 2, 1, 1, 2)  # up to 16 rows on 256 row tiles or fewer with K >= 8192 (4096 x 14336)


def _above_8(tiles: int, steps: int, m: int) -> tuple[int, ...] | None:
    """ABOVE_8's config for `m` > 8 rows on `tiles` row tiles of `steps` K steps; None where the table without teams
    stays."""
    if m <= 2 * GROUP and tiles <= 256 and steps >= TWO_TILES_STEPS:
        return DEEP_UP_TO_16
    for most, rows in ABOVE_8:
        if m <= most:
            return next((config for fewest, config in rows if tiles >= fewest), None)
    return None


def gpu_config(tiles: int, steps: int, m: int) -> tuple[int, ...]:
    """(WARPS, U, DEPTH, TILES[, WTILES]) of the GEMV for `tiles` row tiles, `steps` K steps and `m` rows of x (the
    sweep's best, above)."""
    above_8 = _above_8(tiles, steps, m) if m > GROUP else None
    if above_8:
        return above_8
    if m > GROUP and (steps >= TWO_TILES_STEPS or tiles >= WIDE_TILES):
        if tiles >= WIDE_TILES:
            warps = 4
        elif tiles <= 256:
            warps = 16 if m <= 2 * GROUP else 8
        else:
            warps = 8 if m <= 2 * GROUP else 4
        return warps, U_STEPS, DEPTH_TURNS, 2
    return (*_turns(tiles, steps, m), 1)


def _turns(tiles: int, steps: int, m: int) -> tuple[int, int, int]:
    if m <= GROUP:
        if tiles <= 256:
            return 16 if steps >= 128 else 8, U_STEPS, DEPTH_TURNS
        return 4 if tiles >= 1792 or (tiles >= 896 and steps <= 32) else 8, U_STEPS, DEPTH_TURNS
    if tiles <= 128:
        if m > 2 * GROUP:
            return 4 if steps <= 32 else 8, U_STEPS, DEPTH_TURNS
        return 16 if steps >= 224 else 8, U_STEPS, DEPTH_TURNS
    if steps <= 32:
        return 4, U_STEPS, DEPTH_TURNS
    for most, up_to_16, above in TWO_GROUPS:
        if tiles <= most:
            return up_to_16 if m <= 2 * GROUP else above
    return 4, U_STEPS, DEPTH_TURNS


def takes_gemv(m: int, tiles: int, steps: int) -> bool:
    """Whether the GEMV (rather than the tiled GEMM) takes `m` rows of x on `tiles` row tiles of `steps` K steps,
    where its PTX runs."""
    return m <= GEMV_MAX_M and (tiles * steps < BIG_TILE_STEPS or m <= BIG_MAX_M)


def _step_ptx(groups: int, full: bool) -> str:
    """PTX of one step for one lane, for `groups` column groups of 8 x rows (1 or 2). Operands, in order: the new
    accumulators (f32, 4 a group: rows g, g + 8 x columns 2c, 2c + 1 of the group); the 4 words (block 0 row g,
    block 0 row g + 8, block 1 row g, block 1 row g + 8); x pairs, 8 a group (block 0: 4, block 1: 4); the 2
    scale pairs (block 0, 1: row g in the low half, g + 8 in the high); the accumulators. `full`: all four
    accumulators of a group (M > 1); else the two of column 2c (one x row: only lane c = 0's count)."""
    mma = "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"
    out, words = 0, 4 * groups
    xs = words + 4
    pairs = xs + 8 * groups
    acc_in = pairs + 2
    s = (
        "{\n.reg .b32 t, u, mk, bias, sc, r<16>;\n.reg .f32 p<16>, z, sa, sb, a<8>;\n"
        f"mov.b32 mk, {layout.MASK:#010x};\nmov.b32 bias, {layout.BIAS_BF16X2:#010x};\nmov.f32 z, 0f00000000;\n"
    )
    for w in range(4):  # r[4w .. 4w + 3]: R0..R3 of word w
        s += layout.decode_ptx(f"${words + w}", tuple(f"r{4 * w + i}" for i in range(4)))
    for j in range(groups):
        for b in range(2):
            # A: (R0 g, R0 g+8, R1 g, R1 g+8) for the block's first k16, (R2, R3) for its second; words 2b, 2b + 1.
            g_, h_ = 4 * (2 * b), 4 * (2 * b + 1)
            part = ",".join(f"p{4 * (2 * j + b) + i}" for i in range(4))
            x = xs + 8 * j + 4 * b
            s += f"{mma} {{{part}}}, {{r{g_},r{h_},r{g_ + 1},r{h_ + 1}}}, {{${x},${x + 1}}}, {{z,z,z,z}};\n"
            s += f"{mma} {{{part}}}, {{r{g_ + 2},r{h_ + 2},r{g_ + 3},r{h_ + 3}}}, {{${x + 2},${x + 3}}}, {{{part}}};\n"
    for b in range(2):
        pair = f"${pairs + b}"
        s += f"shl.b32 sc, {pair}, 16;\nmov.b32 sa, sc;\nand.b32 sc, {pair}, 0xFFFF0000;\nmov.b32 sb, sc;\n"
        for j in range(groups):
            for i in (0, 1, 2, 3) if full else (0, 2):
                before = f"${acc_in + 4 * j + i}" if b == 0 else f"a{4 * j + i}"
                scale = "sa" if i < 2 else "sb"
                s += f"fma.rn.f32 a{4 * j + i}, p{4 * (2 * j + b) + i}, {scale}, {before};\n"
    if not full:
        s += f"mov.f32 a1, ${acc_in + 1};\nmov.f32 a3, ${acc_in + 3};\n"
    s += "".join(f"mov.f32 ${out + i}, a{i};\n" for i in range(4 * groups))
    return s + "}"


STEP_ONE = tl.constexpr(_step_ptx(1, False))
STEP_FULL = tl.constexpr(_step_ptx(1, True))
STEP_TWO_GROUPS = tl.constexpr(_step_ptx(2, True))


@triton.jit
def _step(words, pairs, x00, x10, x01, x11, acc, GROUPS: tl.constexpr, FULL: tl.constexpr, FAULT: tl.constexpr):
    """One step of every lane: words [T, 4], scale pairs [T, 2], x pairs [T, 4] of (block, column group) 00, 10,
    01, 11; acc the 8 accumulators (4 a column group; the second group's untouched with one group)."""
    w0, w1, w2, w3 = split4(words)
    s0, s1 = tl.split(pairs)
    if FAULT == 1:
        w0, w1, w2, w3 = w1, w0, w3, w2
    if FAULT == 2:
        s0 = s1
    a0, a1, a2, a3 = split4(x00)
    b0, b1, b2, b3 = split4(x10)
    if GROUPS == 2:
        c0, c1, c2, c3 = split4(x01)
        d0, d1, d2, d3 = split4(x11)
        return tl.inline_asm_elementwise(
            STEP_TWO_GROUPS,
            "=f," * 8 + "r," * 22 + "f," * 7 + "f",
            [
                w0,
                w1,
                w2,
                w3,
                a0,
                a1,
                a2,
                a3,
                b0,
                b1,
                b2,
                b3,
                c0,
                c1,
                c2,
                c3,
                d0,
                d1,
                d2,
                d3,
                s0,
                s1,
                acc[0],
                acc[1],
                acc[2],
                acc[3],
                acc[4],
                acc[5],
                acc[6],
                acc[7],
            ],
            dtype=(tl.float32,) * 8,
            is_pure=True,
            pack=1,
        )
    else:
        if FULL:
            ptx: tl.constexpr = STEP_FULL
        else:
            ptx: tl.constexpr = STEP_ONE
        r0, r1, r2, r3 = tl.inline_asm_elementwise(
            ptx,
            "=f,=f,=f,=f," + "r," * 14 + "f,f,f,f",
            [w0, w1, w2, w3, a0, a1, a2, a3, b0, b1, b2, b3, s0, s1, acc[0], acc[1], acc[2], acc[3]],
            dtype=(tl.float32, tl.float32, tl.float32, tl.float32),
            is_pure=True,
            pack=1,
        )
        return r0, r1, r2, r3, acc[4], acc[5], acc[6], acc[7]


@triton.jit
def _turn_steps(turn, n_steps, U: tl.constexpr):
    """The U steps turn * U .. of every lane ([T, U]): whether each is live, and the step read (step 0 past the end)."""
    step = (turn * U)[:, None] + tl.arange(0, U)[None, :]
    live = step < n_steps
    return live, tl.where(live, step, 0)


@triton.jit
def _turn_weights(words_ptr, pairs_ptr, tile, turn, n_steps, lane, g, U: tl.constexpr):
    """The weights of the U steps turn * U .. of every lane: words [T, 4, U], scale pairs [T, 2, U]. Steps past
    the end re-read step 0 with zero scales (they add nothing). `tile`: one for the program, or [T, 1] (a lane's)."""
    live, s = _turn_steps(turn, n_steps, U)
    at = (tile * n_steps + s).to(tl.int64)
    four = tl.arange(0, 4)
    words = tl.load(words_ptr + ((at * 32 + lane[:, None]) * 4)[:, None, :] + four[None, :, None])
    two = tl.arange(0, 2)
    pairs = tl.load(pairs_ptr + ((at * 8 + g[:, None]) * 2)[:, None, :] + two[None, :, None])
    pairs = tl.where(live[:, None, :], pairs, 0)
    return words, pairs


@triton.jit
def _turn_x(x_ptr, turn, n_steps, c, x_rows, x_rows_2, x_row_stride, U: tl.constexpr, GROUPS: tl.constexpr):
    """x pairs [T, 4, U] of (block, column group) 00, 10, 01, 11 for the U steps turn * U .. (the group-1 ones are
    group 0's with one group); steps past the end read step 0."""
    _, s = _turn_steps(turn, n_steps, U)
    x00, x10 = _x_pairs(x_ptr, x_rows, c, s, x_row_stride)
    if GROUPS == 2:
        x01, x11 = _x_pairs(x_ptr, x_rows_2, c, s, x_row_stride)
    else:
        x01, x11 = x00, x10
    return x00, x10, x01, x11


@triton.jit
def _turn_loads(
    words_ptr, pairs_ptr, x_ptr, tile, turn, n_steps, lane, g, c, x_rows, x_rows_2, x_row_stride,
    U: tl.constexpr, GROUPS: tl.constexpr,
):  # fmt: skip
    """Everything the U steps turn * U .. of every lane read: `_turn_weights`, then `_turn_x`."""
    words, pairs = _turn_weights(words_ptr, pairs_ptr, tile, turn, n_steps, lane, g, U)
    x00, x10, x01, x11 = _turn_x(x_ptr, turn, n_steps, c, x_rows, x_rows_2, x_row_stride, U, GROUPS)
    return words, pairs, x00, x10, x01, x11


@triton.jit
def _x_pairs(x_ptr, rows, c, s, x_row_stride):
    """x pairs [T, 4, U] of blocks 0 and 1 of steps s ([T, U]): lane (g, c)'s elements 8c .. 8c + 7 of x row rows."""
    four = tl.arange(0, 4)
    at = (rows.to(tl.int64) * x_row_stride + 4 * c)[:, None] + s * 32
    return tl.load(x_ptr + at[:, None, :] + four[None, :, None]), tl.load(
        x_ptr + at[:, None, :] + 16 + four[None, :, None]
    )


@triton.jit
def _turn(loads, acc, U: tl.constexpr, GROUPS: tl.constexpr, FULL: tl.constexpr, FAULT: tl.constexpr):
    """Every step of a turn (U = 1 or 2), in order."""
    words, pairs, x00, x10, x01, x11 = loads
    T: tl.constexpr = words.shape[0]
    if U == 1:
        acc = _step(
            tl.reshape(words, [T, 4]), tl.reshape(pairs, [T, 2]), tl.reshape(x00, [T, 4]), tl.reshape(x10, [T, 4]),
            tl.reshape(x01, [T, 4]), tl.reshape(x11, [T, 4]), acc, GROUPS, FULL, FAULT,
        )  # fmt: skip
    else:
        wa, wb = tl.split(words)
        pa, pb = tl.split(pairs)
        a00, b00 = tl.split(x00)
        a10, b10 = tl.split(x10)
        a01, b01 = tl.split(x01)
        a11, b11 = tl.split(x11)
        acc = _step(wa, pa, a00, a10, a01, a11, acc, GROUPS, FULL, FAULT)
        acc = _step(wb, pb, b00, b10, b01, b11, acc, GROUPS, FULL, FAULT)
    return acc


@triton.jit
def warp_sums(acc0, acc1, acc2, acc3, WARPS: tl.constexpr, WTILES: tl.constexpr):
    """A column group's four accumulators summed over the warps of each row tile (through shared memory; warp w
    works on the program's tile w % WTILES): [WTILES * 32] each, element 32 i + l of tile i, lane l = 4 g + c
    holding (row g, x column 2c), (g, 2c + 1), (g + 8, 2c), (g + 8, 2c + 1) of the tile, the m16n8 C fragment."""
    r0 = tl.sum(tl.reshape(acc0, [WARPS // WTILES, WTILES * 32]), axis=0)
    r1 = tl.sum(tl.reshape(acc1, [WARPS // WTILES, WTILES * 32]), axis=0)
    r2 = tl.sum(tl.reshape(acc2, [WARPS // WTILES, WTILES * 32]), axis=0)
    r3 = tl.sum(tl.reshape(acc3, [WARPS // WTILES, WTILES * 32]), axis=0)
    return r0, r1, r2, r3


@triton.jit
def _store_group(
    out_ptr, acc0, acc1, acc2, acc3, tile, every, last, first_col, M, out_row_stride, WARPS: tl.constexpr,
    WTILES: tl.constexpr,
):  # fmt: skip
    """A column group's four accumulators, summed over the warps of each tile, rounded once, stored: the WTILES
    tiles tile, tile + every, ..., those past `last` not."""
    r0, r1, r2, r3 = warp_sums(acc0, acc1, acc2, acc3, WARPS, WTILES)
    at = tl.arange(0, WTILES * 32)
    lanes = at % 32
    rows = tile + (at // 32) * every
    n = rows * 16 + lanes // 4
    col = first_col + 2 * (lanes % 4)
    out = out_ptr + col.to(tl.int64) * out_row_stride + n
    live = rows <= last
    tl.store(out, r0.to(tl.bfloat16), mask=live & (col < M))
    tl.store(out + 8, r2.to(tl.bfloat16), mask=live & (col < M))
    tl.store(out + out_row_stride, r1.to(tl.bfloat16), mask=live & (col + 1 < M))
    tl.store(out + out_row_stride + 8, r3.to(tl.bfloat16), mask=live & (col + 1 < M))


@triton.jit
def _both_turns(now, now2, acc, acc2, U: tl.constexpr, GROUPS: tl.constexpr, FULL: tl.constexpr, FAULT: tl.constexpr,
                TILES: tl.constexpr):  # fmt: skip
    """A turn of the first row tile (`now`: its weights and the x pairs) and, with TILES = 2, of the second
    (`now2`: its weights; the same x pairs)."""
    acc = _turn(now, acc, U, GROUPS, FULL, FAULT)
    if TILES == 2:
        acc2 = _turn((now2[0], now2[1], now[2], now[3], now[4], now[5]), acc2, U, GROUPS, FULL, FAULT)
    return acc, acc2


@triton.jit
def fragment_rows(
    x_ptr, words_ptr, pairs_ptr, tile, tile2, n_steps, x_rows, x_rows_2, x_row_stride,
    WARPS: tl.constexpr, U: tl.constexpr, DEPTH: tl.constexpr, GROUPS: tl.constexpr, FULL: tl.constexpr,
    FAULT: tl.constexpr, PDL: tl.constexpr, TILES: tl.constexpr, WTILES: tl.constexpr,
):  # fmt: skip
    """A program's K loop: the 8 fp32 accumulators (4 a column group, per lane) of row tile `tile` of the prepared
    words against the x rows x_rows (column group 0; per lane, the row of its MMA column g) and x_rows_2 (group 1);
    with TILES = 2 also those of row tile `tile2` on the same x pairs, read once for both: (acc, acc2) (with one
    tile, acc2 is zeros). The WARPS warps take the steps in turns of U, DEPTH turns of loads ahead in registers
    (register prefetch; 0: none); with WTILES > 1 they are WTILES teams, warp w in team w % WTILES, each on its own
    tiles (`tile` and `tile2` then [T, 1], a lane's) and taking the steps in turns among its WARPS / WTILES warps.
    With PDL the first turn's weights are requested before the wait for the kernel that writes x (`kernels._pdl`): a
    caller whose weight address depends on an earlier kernel waits itself and passes False."""
    T: tl.constexpr = 32 * WARPS
    TEAM: tl.constexpr = WARPS // WTILES  # warps taking turns on one tile
    lane, warp, g, c = mma_lanes(WARPS)
    warp = warp // WTILES  # a warp's place in its team
    zero = tl.zeros([T], dtype=tl.float32)
    acc = (zero, zero, zero, zero, zero, zero, zero, zero)
    acc2 = acc
    turns = tl.cdiv(n_steps, TEAM * U)
    where = (words_ptr, pairs_ptr, x_ptr, tile)
    lanes = (n_steps, lane, g, c, x_rows, x_rows_2, x_row_stride)
    weights2 = (words_ptr, pairs_ptr, tile2)
    per_lane = (n_steps, lane, g)
    if DEPTH == 0:
        wait_then_release(PDL)
        for i in range(0, turns):
            now = _turn_loads(*where, i * TEAM + warp, *lanes, U, GROUPS)
            now2 = now[:2]
            if TILES == 2:
                now2 = _turn_weights(*weights2, i * TEAM + warp, *per_lane, U)
            acc, acc2 = _both_turns(now, now2, acc, acc2, U, GROUPS, FULL, FAULT, TILES)
    elif DEPTH == 1:
        words, pairs = _turn_weights(words_ptr, pairs_ptr, tile, warp, n_steps, lane, g, U)
        ahead2 = (words, pairs)
        if TILES == 2:
            ahead2 = _turn_weights(*weights2, warp, *per_lane, U)
        wait_then_release(PDL)
        x00, x10, x01, x11 = _turn_x(x_ptr, warp, n_steps, c, x_rows, x_rows_2, x_row_stride, U, GROUPS)
        ahead = (words, pairs, x00, x10, x01, x11)
        for i in range(0, turns):
            now = ahead
            now2 = ahead2
            ahead = _turn_loads(*where, (i + 1) * TEAM + warp, *lanes, U, GROUPS)
            if TILES == 2:
                ahead2 = _turn_weights(*weights2, (i + 1) * TEAM + warp, *per_lane, U)
            acc, acc2 = _both_turns(now, now2, acc, acc2, U, GROUPS, FULL, FAULT, TILES)
    else:
        wait_then_release(PDL)
        ahead = _turn_loads(*where, warp, *lanes, U, GROUPS)
        after = _turn_loads(*where, TEAM + warp, *lanes, U, GROUPS)
        ahead2 = ahead[:2]
        after2 = after[:2]
        if TILES == 2:
            ahead2 = _turn_weights(*weights2, warp, *per_lane, U)
            after2 = _turn_weights(*weights2, TEAM + warp, *per_lane, U)
        for i in range(0, turns):
            now = ahead
            now2 = ahead2
            ahead = after
            ahead2 = after2
            after = _turn_loads(*where, (i + 2) * TEAM + warp, *lanes, U, GROUPS)
            if TILES == 2:
                after2 = _turn_weights(*weights2, (i + 2) * TEAM + warp, *per_lane, U)
            acc, acc2 = _both_turns(now, now2, acc, acc2, U, GROUPS, FULL, FAULT, TILES)
    return acc, acc2


@triton.jit
def _fragment_gemv_kernel(
    x_ptr, words_ptr, pairs_ptr, out_ptr, M, N, n_steps, x_row_stride, out_row_stride,
    WARPS: tl.constexpr, U: tl.constexpr, DEPTH: tl.constexpr, GROUPS: tl.constexpr, TILES: tl.constexpr,
    WTILES: tl.constexpr, FULL: tl.constexpr, FAULT: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    # x_ptr: int32 words (bf16 pairs) [M, K/2]; program (TILES * WTILES row tiles, column block of 8 * GROUPS x
    # rows): team i of the warps takes tiles base + TILES i (and + 1 with TILES = 2).
    base, q = tl.program_id(0) * (TILES * WTILES), tl.program_id(1)
    last = N // 16 - 1
    _, warp, g, _ = mma_lanes(WARPS)
    first = q * 8 * GROUPS
    # MMA column g of group j is x row first + 8 j + g; rows past M compute a copy of row M - 1, never stored.
    x_rows = tl.minimum(first + g, M - 1)
    x_rows_2 = tl.minimum(first + 8 + g, M - 1)
    if WTILES == 1:
        tile = base
    else:
        tile = (base + (warp % WTILES) * TILES)[:, None]
    # A tile past the last (N / 16 not a multiple of the program's tiles) reads the last one again, not stored.
    acc, acc2 = fragment_rows(
        x_ptr, words_ptr, pairs_ptr, tl.minimum(tile, last), tl.minimum(tile + 1, last), n_steps, x_rows, x_rows_2,
        x_row_stride, WARPS, U, DEPTH, GROUPS, FULL, FAULT, PDL, TILES, WTILES,
    )  # fmt: skip
    _store_tile(out_ptr, acc, base, TILES, last, first, M, out_row_stride, WARPS, GROUPS, WTILES)
    if TILES == 2:
        _store_tile(out_ptr, acc2, base + 1, TILES, last, first, M, out_row_stride, WARPS, GROUPS, WTILES)


@triton.jit
def _store_tile(
    out_ptr, acc, tile, every, last, first, M, out_row_stride, WARPS: tl.constexpr, GROUPS: tl.constexpr,
    WTILES: tl.constexpr,
):  # fmt: skip
    """The column groups of the warp teams' row tiles tile, tile + every, ... (`_store_group`)."""
    rest = (tile, every, last, first, M, out_row_stride)
    _store_group(out_ptr, acc[0], acc[1], acc[2], acc[3], *rest, WARPS, WTILES)
    if GROUPS == 2:
        rest = (tile, every, last, first + 8, M, out_row_stride)
        _store_group(out_ptr, acc[4], acc[5], acc[6], acc[7], *rest, WARPS, WTILES)


def check_fragment_args(x: torch.Tensor, words: torch.Tensor, pairs: torch.Tensor) -> tuple[int, int]:
    """(N, K) of a valid call; a one-line error naming the argument otherwise."""
    if x.dtype != torch.bfloat16 or x.dim() != 2:
        raise TypeError(f"x: must be bf16 [M, K], got {x.dtype} {tuple(x.shape)}")
    n, k = layout.check_weights(words, pairs)
    if x.shape[1] != k:
        raise ValueError(f"x: K = {x.shape[1]} does not match the weights' K = {k}")
    return n, k


def check_x_words(x: torch.Tensor) -> None:
    """The GEMV reads x's rows as int32 words (bf16 pairs): rows contiguous, starting on 4-byte boundaries."""
    if x.stride(1) != 1 or x.stride(0) % 2 or x.data_ptr() % 4:
        raise ValueError(f"x: rows must be contiguous and start on 4-byte boundaries, got strides {x.stride()}")


def launch(x, words, pairs, config: tuple | None = None, fault: str = "none", gemv: bool | None = None) -> torch.Tensor:
    """Validate, allocate and launch; `config` overrides the chosen kernel's launch (the GEMV's (WARPS, U, DEPTH,
    TILES[, WTILES]) or the tiled kernel's table row: sweeps), `fault` plants a named bug (negative controls), `gemv`
    forces the GEMV (True) or the tiled kernel (False); by default the GEMV takes the rows `takes_gemv` gives it where
    its PTX runs."""
    n, k = check_fragment_args(x, words, pairs)
    check_device(x=x, words=words, pairs=pairs)
    m, tiles = x.shape[0], n // layout.ROWS
    ptx = packed_ptx(x.device)
    if gemv is None:
        gemv = ptx and takes_gemv(m, tiles, words.shape[1])
    if gemv and not ptx:
        raise ValueError(f"gemv: the tensor-core GEMV is PTX for NVIDIA sm_90+, which {x.device} does not run")
    if not gemv:
        if fault not in w4a16_mxfp4_fragment_gemm.FAULTS:
            tiled = list(w4a16_mxfp4_fragment_gemm.FAULTS)
            raise ValueError(f"fault: {fault!r} is planted in the GEMV only; the tiled GEMM has {tiled}")
        return w4a16_mxfp4_fragment_gemm.launch(x, words, pairs, config=config, fault=fault)
    y = torch.empty(m, n, dtype=torch.bfloat16, device=x.device)
    if m == 0 or n == 0:
        return y
    check_x_words(x)
    groups = 1 if m <= GROUP else 2
    warps, u, depth, row_tiles, *teams = config or gpu_config(tiles, k // layout.STEP_K, m)
    wtiles = teams[0] if teams else 1
    if row_tiles not in (1, 2):
        raise ValueError(f"config: row tiles a team must be 1 or 2, got {row_tiles}")
    if wtiles not in (1, 2, 4, 8) or warps % wtiles:
        raise ValueError(f"config: warp teams must be 1, 2, 4 or 8 and divide the {warps} warps, got {wtiles}")
    xw = x.view(torch.int32)
    _fragment_gemv_kernel[(triton.cdiv(tiles, row_tiles * wtiles), triton.cdiv(m, GROUP * groups))](
        xw, words, pairs, y, m, n, k // layout.STEP_K, xw.stride(0), y.stride(0),
        WARPS=warps, U=u, DEPTH=depth, GROUPS=groups, TILES=row_tiles, WTILES=wtiles, FULL=m > 1, FAULT=FAULTS[fault],
        num_warps=warps, num_stages=1, **launch_args(x.device),
    )  # fmt: skip
    return y


@torch.library.custom_op("touchstone::w4a16_mxfp4_fragment_gemv", mutates_args=())
def _fragment_gemv_op(x: torch.Tensor, words: torch.Tensor, pairs: torch.Tensor) -> torch.Tensor:
    return launch(x, words, pairs)


@_fragment_gemv_op.register_fake
def _(x, words, pairs):
    n, _ = check_fragment_args(x, words, pairs)
    return x.new_empty(x.shape[0], n)


def w4a16_mxfp4_fragment_gemv(x: torch.Tensor, words: torch.Tensor, pairs: torch.Tensor) -> torch.Tensor:
    """bf16 [M, N]: the mirror of x against `kernels.mxfp4_fragment_layout.interchange(words, pairs)`, for any M
    (the GEMV up to GEMV_MAX_M rows where its PTX runs, `takes_gemv`; the tiled GEMM on the same words otherwise)."""
    return torch.ops.touchstone.w4a16_mxfp4_fragment_gemv(x, words, pairs)
