"""The tensor-core W4A16 MXFP4 GEMV (`kernels.w4a16_mxfp4_fragment_gemv`) and its fragment layout
(`kernels.mxfp4_fragment_layout`).

Every tier: the layout is a bijection (prepare then interchange gives the bytes back), a named word pins where
each element's bits go, and the kernel's decode PTX, run by the numpy PTX interpreter (suites/ptx_subset.py)
over every code at every position and 2**17 random words, gives the reference's E2M1 values bit for bit (three
planted bugs in that text must not; the scaled decode the tiled GEMM runs is checked the same way); the op
matches the mirror under the W4A16 GEMM's lossy policy (kernels.tolerances, "w4a16_mxfp4_gemm") and its named
cases exactly, on both of its paths: the tiled W4A16 GEMM on the same words (every tier: the interpreter runs its
Triton decode, a GPU of sm_90+ the PTX), whose planted bugs (a block scaled by its neighbour's scale, the halves
of each register exchanged) must be caught; and on a GPU that runs the PTX the tensor-core GEMV, with its launch
shapes (0, 1 and 2 turns of loads ahead, 1 and 2 steps a turn, one and two column groups) and its two planted
bugs (rows g and g + 8 exchanged, a block scaled by its neighbour's scale); elsewhere the GEMV cases are skipped
(they live in the PTX) and asking for it is refused by name.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kernels._boundary import runs_interpreted
from kernels._packed_ptx import packed_ptx
from kernels.tolerances import assert_exact, assert_lossy, families
from reference.gemm import w4a16_mxfp4 as ref
from reference.quant.mxfp4 import dequantize_mxfp4
from suites import oracles, ptx_subset
from suites.gemm.test_w4a16_mxfp4_gemm import NAMED, named_problem, quantized_weights
from suites.quant.mxfp4_cases import random_blocks

layout = pytest.importorskip("kernels.mxfp4_fragment_layout")
kernel = pytest.importorskip("kernels.w4a16_mxfp4_fragment_gemv")
FAMILY = families.W4A16_MXFP4_GEMM


def prepared(codes, scales, device):
    words, pairs = layout.prepare(codes, scales)
    return words.to(device), pairs.to(device)


@given(
    tiles=st.integers(1, 3),
    steps=st.integers(1, 3),
    batch=st.sampled_from([(), (2,)]),
    seed=st.integers(0, 2**31 - 1),
)
def test_prepare_is_undone_by_interchange(tiles, steps, batch, seed):
    gen = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 256, (*batch, 16 * tiles, 32 * steps), dtype=torch.uint8, generator=gen)
    scales = torch.randint(0, 256, (*batch, 16 * tiles, 2 * steps), dtype=torch.uint8, generator=gen)
    words, pairs = layout.prepare(codes, scales)
    assert words.shape == (*batch, tiles, steps, 32, 4) and pairs.shape == (*batch, tiles, steps, 8, 2)
    back_codes, back_scales = layout.interchange(words, pairs)
    assert_exact(back_codes, codes, "interchange(prepare(codes))")
    assert_exact(back_scales, scales, "interchange(prepare(scales))")


@pytest.mark.parametrize("batch", [(), (2,)])
def test_prepare_in_row_chunks_equals_one_pass(monkeypatch, batch):
    """`prepare` works PREPARE_ROWS rows at a time (a load's peak); chunks that do not divide N (80 rows in 32s)
    give the one-pass words and scale pairs."""
    gen = torch.Generator().manual_seed(4)
    codes = torch.randint(0, 256, (*batch, 80, 64), dtype=torch.uint8, generator=gen)
    scales = torch.randint(0, 256, (*batch, 80, 4), dtype=torch.uint8, generator=gen)
    whole = layout.prepare(codes, scales)
    monkeypatch.setattr(layout, "PREPARE_ROWS", 32)
    chunked = layout.prepare(codes, scales)
    assert_exact(chunked[0], whole[0], "words")
    assert_exact(chunked[1], whole[1], "scale pairs")


def test_a_named_word_and_its_place():
    """Row 0's first word (elements 0..7 of block 0, lane 0) with element j = code 0xF (-6) alone: its bits land
    on BIT_MAP[j], which the module doc derives (R0 at rotation 0: bits 6, 7, 8, 15 for element 0; R1 at 4; R2
    at 10; R3 split 14 / 6). Row 8's word is the lane's second word, block 1 its third; a scale pair holds rows
    g (low half) and g + 8 as bf16 (byte 0 the subnormal 0x0040, 0xFF NaN 0x7FC0)."""
    expected = [0x000081C0, 0x81C00000, 0x00081C00, 0x1C000008, 0x02070000, 0x00000207, 0x00306000, 0x60000030]
    for j, want in enumerate(expected):
        codes = torch.zeros(16, 32, dtype=torch.uint8)
        codes[0, j // 2] = 0xF << (4 * (j % 2))
        words, _ = layout.prepare(codes, torch.full((16, 2), 127, dtype=torch.uint8))
        assert words[0, 0, 0, 0].item() & 0xFFFFFFFF == want, f"element {j}: {words[0, 0, 0, 0].item():#x}"
        assert words.count_nonzero().item() == 1
    codes = torch.zeros(16, 32, dtype=torch.uint8)
    codes[8, 0], codes[0, 16] = 0x0F, 0x0F  # row 8 block 0, row 0 block 1: element 0 each
    scales = torch.full((16, 2), 127, dtype=torch.uint8)
    scales[0, 0], scales[8, 0], scales[0, 1] = 0, 255, 128
    words, pairs = layout.prepare(codes, scales)
    assert words[0, 0, 0].tolist() == [0, 0x81C0, 0x81C0, 0]
    assert [p & 0xFFFFFFFF for p in pairs[0, 0, 0].tolist()] == [0x7FC00040, 0x3F804000]


def test_four_rotations_of_the_mask_cannot_tile_a_word():
    """Why R3 is taken in two pieces (the layout's module doc): no four rotations of the register mask are
    disjoint, so no word layout gives every register as one rotation and one AND (one rotation may be 0: a tiling
    shifted is a tiling)."""

    def rotated(r):
        return {(b + r) % 32 for b in range(32) if layout.MASK >> b & 1}

    assert len(rotated(0)) == 8
    for rotations in itertools.combinations(range(1, 32), 3):
        sets = [rotated(0)] + [rotated(r) for r in rotations]
        assert len(set().union(*sets)) < 32, rotations
    covered = {layout.BIT_MAP[j][q] for j in range(8) for q in range(4)}
    assert covered == set(range(32))  # the layout used instead: every bit of the word holds one code bit


def decoded_by(ptx: str, scale_byte: int = 127) -> tuple[torch.Tensor, torch.Tensor]:
    """(what `ptx` decodes, what the reference decodes) for every code (0..15) at every element position, in words
    whose other elements are random, and 2**17 random words; a scaled decode gets the block scale `scale_byte`
    as its bf16 pair $5."""
    rng = np.random.default_rng(0)
    words = [rng.integers(0, 2**32, 2**17, dtype=np.uint64).astype(np.uint32)]
    for j in range(8):
        base = rng.integers(0, 2**32, 16, dtype=np.uint64).astype(np.uint32) & ~np.uint32(0xF << (4 * j))
        words.append(base | (np.arange(16, dtype=np.uint32) << np.uint32(4 * j)))
    interchange = np.concatenate(words)  # interchange words: element j in nibble j
    codes = torch.from_numpy(interchange.view(np.uint8).reshape(-1, 4).copy())
    block = torch.zeros(codes.shape[0], 16, dtype=torch.uint8)  # one MX block a word, scale 127 (1.0)
    block[:, :4] = codes
    scale = torch.full((codes.shape[0], 1), scale_byte, dtype=torch.uint8)
    want = dequantize_mxfp4(block, scale, dtype=torch.float32)
    # Prepare each word on its own row of a 16 x 64 tile: it is the lane-0 first word of its tile.
    padded = torch.zeros(codes.shape[0], 16, 32, dtype=torch.uint8)
    padded[:, 0, :4] = codes
    prepared_words, _ = layout.prepare(padded, torch.full((codes.shape[0], 16, 2), 127, dtype=torch.uint8))
    stored = prepared_words[:, 0, 0, 0, 0].numpy().view(np.uint32)
    bf = 0x0040 if scale_byte == 0 else scale_byte << 7
    out = ptx_subset.run(ptx, {4: stored, 5: np.full(stored.shape, bf | bf << 16, dtype=np.uint32)})
    regs = np.stack([out[i] for i in range(4)], axis=-1)
    halves = np.stack([regs & 0xFFFF, regs >> 16], axis=-1).reshape(-1, 8).astype(np.uint32)
    got = torch.from_numpy((halves << 16).view(np.float32))
    if scale_byte == 127:
        assert_exact(layout.decode_word(torch.from_numpy(stored.view(np.int32))), want[:, :8], "decode_word")
    return got, want[:, :8]


def test_decode_ptx_gives_the_reference_values():
    got, want = decoded_by(layout.decode_block_ptx())
    assert_exact(got, want, "decode PTX")


@pytest.mark.parametrize("scale_byte", [127, 0, 1, 130, 200])
def test_scaled_decode_ptx_gives_the_reference_values(scale_byte):
    """The tiled GEMM's and the dequantizer's decode: each register then times the block's bf16 scale pair ($5),
    against the reference's values at that scale (subnormal 2**-127 included)."""
    got, want = decoded_by(layout.decode_block_ptx(scaled=True), scale_byte)
    assert_exact(got, want, f"scaled decode PTX, scale byte {scale_byte}")


@pytest.mark.parametrize(
    "planted",
    [("$4, $4, 10;", "$4, $4, 11;"), ("0x00400040", "0x00400000"), ("mul.rn.bf16x2 $3, $3, bias;", "")],
    ids=["r2_rotation", "r3_low_mask", "r3_bias_dropped"],
)
def test_decode_ptx_controls(planted):
    """Negative controls on every tier: the decode text with one planted bug mismatches the reference."""
    got, want = decoded_by(layout.decode_block_ptx().replace(*planted))
    assert not torch.equal(got, want)


@st.composite
def problems(draw):
    x_exponent = draw(st.integers(-60, 60))
    return dict(
        m=draw(st.sampled_from([1, 1, 2, 3, 8, 9, 17])),
        n=16 * draw(st.integers(1, 3)),
        k=64 * draw(st.integers(1, 5)),
        seed=draw(st.integers(0, 2**31 - 1)),
        spread=draw(st.sampled_from([0.0, 4.0, 12.0])),
        mode=draw(st.sampled_from(("floor", "rceil", "even", "ceil"))),
        x_exponent=x_exponent,
        w_exponent=draw(st.integers(max(-100, -100 - x_exponent), min(100, 100 - x_exponent))),
        zero_block=draw(st.booleans()),
        gemv=draw(st.sampled_from([None, False])),
    )


def check(x, codes, scales, device, ideal, **launch):
    words, pairs = prepared(codes, scales, device)
    got = kernel.launch(x.to(device), words, pairs, **launch).cpu()
    assert got.dtype == torch.bfloat16 and got.shape == (x.shape[0], codes.shape[0])
    return assert_lossy(FAMILY, got, ref.w4a16_mxfp4_gemm_mirror(x, codes, scales), ideal)


@given(p=problems())
def test_matches_mirror_and_ideal(p, device):
    w, codes, scales = quantized_weights(p["n"], p["k"], p["seed"], p["spread"], p["w_exponent"], p["mode"])
    if p["zero_block"]:
        w[0, :32] = 0.0
        codes[0, :16], scales[0, 0] = 0, 0
    x = (random_blocks((p["m"], p["k"]), torch.float32, p["seed"] + 1, 2.0) * 2.0 ** p["x_exponent"]).to(torch.bfloat16)
    ideal = ref.w4a16_mxfp4_gemm_ideal(x, codes, scales) if p["spread"] > 4 else oracles.unquantized_product(x, w)
    check(x, codes, scales, device, ideal, gemv=p["gemv"])


def _padded(codes, scales):
    """A named problem's 3 x 64 weights padded to one 16-row tile (zero codes, scale 127)."""
    c = torch.zeros(16, 32, dtype=torch.uint8)
    s = torch.full((16, 2), 127, dtype=torch.uint8)
    c[:3], s[:3] = codes, scales
    return c, s


@pytest.mark.parametrize(
    ("name", "x_rows", "code_bytes", "scale_bytes", "want", "note"), NAMED, ids=[c[0] for c in NAMED]
)
def test_named_cases(name, x_rows, code_bytes, scale_bytes, want, note, device):
    x, codes, scales = named_problem(x_rows, code_bytes, scale_bytes)
    codes, scales = _padded(codes, scales)
    words, pairs = prepared(codes, scales, device)
    want = torch.tensor(want, dtype=torch.bfloat16)
    # One x row (the GEMV's M = 1 kernel) and nine (every accumulator, two column blocks), on the GEMV where its PTX
    # runs and on the tiled GEMM everywhere.
    for rows, gemv in itertools.product((1, 9), (True, False) if packed_ptx(torch.device(device)) else (False,)):
        for r in range(x.shape[0]):
            rows_x = x[r : r + 1].expand(rows, -1).contiguous().to(device)
            got = kernel.launch(rows_x, words, pairs, gemv=gemv)
            assert_exact(got.cpu()[:, 0], want[r].expand(rows), f"{name}: x row {r}, M = {rows}, gemv {gemv} ({note})")


@pytest.mark.parametrize("m", [2, 20])  # the GEMV where its PTX runs, and the tiled GEMM
def test_nan_scale_poisons_its_row_only(device, m):
    _, codes, scales = quantized_weights(32, 128, 3, 4.0, 0, "floor")
    scales[9, 2] = 0xFF
    x = random_blocks((m, 128), torch.bfloat16, 4, 2.0)
    words, pairs = prepared(codes, scales, device)
    got = kernel.w4a16_mxfp4_fragment_gemv(x.to(device), words, pairs).cpu()
    assert torch.isnan(got[:, 9]).all() and not torch.isnan(got[:, torch.arange(32) != 9]).any()


@pytest.mark.parametrize("fault", ["scale_of_next_block", "swap_nibbles"])
def test_tiled_path_planted_bugs_are_caught(fault, device):
    """Negative controls of the tiled GEMM on fragment words (every tier)."""
    w, codes, scales = quantized_weights(32, 256, 7, 6.0, 0, "floor")
    x = random_blocks((20, 256), torch.bfloat16, 8, 2.0)
    check(x, codes, scales, device, oracles.unquantized_product(x, w), gemv=False)
    with pytest.raises(AssertionError):
        check(x, codes, scales, device, oracles.unquantized_product(x, w), gemv=False, fault=fault)


def test_tiled_path_steps_past_the_end(device):
    """K = 3 steps in tiles of 2 (a K tile half past the end) and a split-K launch (two splits of one tile)."""
    w, codes, scales = quantized_weights(48, 192, 9, 6.0, 0, "even")
    x = random_blocks((19, 192), torch.bfloat16, 10, 3.0)
    ideal = oracles.unquantized_product(x, w)
    check(x, codes, scales, device, ideal, gemv=False, config=("dot", 16, 16, 4, 1, 1, 1))
    check(x, codes, scales, device, ideal, gemv=False, config=("dot", 16, 16, 2, 2, 1, 1))


@pytest.mark.parametrize("m", [32, 48, 64])
def test_tiled_table_rows(m, device):
    """The tiled GEMM's own launch row for M rows on a GPU (its tile, groups and split; SPLIT_K 0 resolved on the
    SM count): N of two and a half 256-row tiles, K of 9 steps (on the 4-group rows, all three here, the last K tile
    half past the end), 16 rows of the 64-row tile past M at M = 48. The interpreter runs its own few-program row,
    above."""
    if runs_interpreted(torch.device(device)):
        pytest.skip("the launch table's rows are GPU launch shapes")
    w, codes, scales = quantized_weights(640, 576, 12, 6.0, 0, "floor")
    x = random_blocks((m, 576), torch.bfloat16, 13 + m, 2.0)
    check(x, codes, scales, device, oracles.unquantized_product(x, w), gemv=False)


# Run by `suites.compile_for_sm90`: the tiled GEMM's K loop for the table's 33-256-row config, its pointers and x's
# row stride specialized as multiples of 16 (as a launch on an 8192-wide x is) or, the control, x's stride not.
_COMPILE_TILED_LOOP_FOR_SM90 = """
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, compile
from kernels import w4a16_mxfp4_fragment_gemm as m

_, block_n, block_m, groups, _, warps, stages = m.launch_config(64, 8192)
names = ("x_ptr", "words_ptr", "pairs_ptr", "out_ptr", "M", "N", "n_steps", "tiles_per_split", "x_row_stride",
         "out_row_stride", "out_split_stride")
signature = dict(zip(names, ("*bf16", "*i32", "*i32", "*fp32", *["i32"] * 7)))
constants = dict(BLOCK_N=block_n, BLOCK_M=block_m, GROUPS=groups, EVEN_K=True, OUT_FP32=True, FAULT=0, PTX=True,
                 PDL=False)
signature |= dict.fromkeys(constants, "constexpr")
for aligned in (True, False):
    multiples = [names.index(n) for n in ("x_ptr", "words_ptr", "pairs_ptr", "out_ptr")]
    multiples += [names.index("x_row_stride")] if aligned else []
    attrs = {(i,): [["tt.divisibility", 16]] for i in multiples}
    source = ASTSource(fn=m._fragment_gemm_kernel, signature=signature, constexprs=constants, attrs=attrs)
    ptx = compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": stages})
    loop = ptx.asm["ptx"].split("Inner Loop Header")[1].split("_crit_edge")[0]
    print(aligned, loop.count("wgmma.mma_async") > 0, loop.count("st.shared"))
"""


def test_tiled_loop_decodes_into_the_mma_registers():
    """The tiled GEMM's K loop compiled for sm_90 with no GPU (table row for 64 rows): wgmma takes the decoded
    weights from registers and the loop stores nothing to shared memory, since each lane's own words are its A
    operand (`kernels._mxfp4_fragment_tiles.fragment_tile`); a layout conversion there would be a shared-memory
    round trip of every decoded tile. Control: x's row stride not known to be a multiple of 16, x's tile is
    loaded to registers and stored to shared memory in the loop, and the same count sees it."""
    from suites.compile_for_sm90 import run_compiler

    aligned, control = run_compiler(_COMPILE_TILED_LOOP_FOR_SM90)
    assert aligned == "True True 0"
    assert control.startswith("False True ") and int(control.split()[-1]) > 0


def test_gemv_is_refused_where_its_ptx_does_not_run(device):
    if packed_ptx(torch.device(device)):
        pytest.skip("this device runs the GEMV's PTX")
    _, codes, scales = quantized_weights(16, 64, 11, 2.0, 0, "floor")
    words, pairs = prepared(codes, scales, device)
    with pytest.raises(ValueError, match="gemv: the tensor-core GEMV is PTX"):
        kernel.launch(torch.zeros(1, 64, dtype=torch.bfloat16, device=device), words, pairs, gemv=True)


GPU_ONLY = "the PTX kernel's launch shapes and planted bugs need a GPU that runs its PTX (sm_90+)"


# (WARPS, U, DEPTH, TILES[, WTILES]): every config the launcher's table gives
# (test_launch_table_stays_in_the_tested_shapes), and the edges of each axis (2 warps, DEPTH 0 and 2, two row tiles
# a team at each DEPTH, 2 to 8 warp teams: one warp a team, and teams past the last row tile).
LAUNCH_SHAPES = [
    (8, 2, 1, 1), (4, 2, 1, 1), (16, 2, 1, 1), (8, 1, 1, 1), (4, 1, 0, 1), (4, 1, 1, 1), (2, 2, 1, 1), (8, 1, 2, 1),
    (4, 2, 2, 1), (8, 2, 1, 2), (4, 2, 1, 2), (16, 2, 1, 2), (8, 1, 1, 2), (4, 1, 0, 2), (2, 2, 2, 2),
    (8, 2, 1, 1, 4), (16, 2, 1, 1, 4), (16, 2, 1, 1, 8), (8, 2, 1, 1, 8), (4, 2, 1, 2, 2), (8, 1, 0, 1, 2),
    (8, 2, 2, 1, 2), (2, 2, 1, 1, 2), (8, 2, 1, 1, 2), (16, 2, 1, 1, 2), (8, 2, 1, 2, 2),
]  # fmt: skip


def test_launch_table_stays_in_the_tested_shapes():
    """Every (WARPS, U, DEPTH, TILES) that `gpu_config` picks, over row tiles, K steps and rows of x from 1 to the
    GEMV's bound, is one that test_launch_shapes runs against the mirror on a GPU."""
    picked = {
        kernel.gpu_config(tiles, steps, m)
        for tiles in (1, 64, 128, 129, 256, 257, 384, 385, 512, 513, 896, 1791, 1792, 8192)
        for steps in (1, 31, 32, 33, 64, 127, 128, 223, 224, 1024)
        for m in range(1, kernel.GEMV_MAX_M + 1)
    }
    assert picked <= set(LAUNCH_SHAPES), sorted(picked - set(LAUNCH_SHAPES))


def test_gemv_row_bound():
    """The GEMV takes up to GEMV_MAX_M rows, and no more than BIG_MAX_M on layers of BIG_TILE_STEPS row tiles x K
    steps or more (4096 x 4096 weights: 256 x 64; 6144 x 4096: 384 x 64)."""
    assert kernel.takes_gemv(kernel.GEMV_MAX_M, 256, 64)
    assert not kernel.takes_gemv(kernel.GEMV_MAX_M + 1, 1, 1)
    assert kernel.takes_gemv(kernel.BIG_MAX_M, 384, 64)
    assert not kernel.takes_gemv(kernel.BIG_MAX_M + 1, 384, 64)
    assert kernel.takes_gemv(kernel.BIG_MAX_M, kernel.WIDE_TILES, 64)


@pytest.mark.parametrize("config", LAUNCH_SHAPES, ids=str)
def test_launch_shapes(config, device):
    """K = 7 steps over 2..16 warps of 1 or 2 steps a turn, 0..2 turns of loads ahead: turns and prefetches past the
    end; M from one x row to three programs of two column groups (the last one ragged); 3 row tiles, so with two a
    program, or 4 or 8 warp teams, tiles past the end (computed on the last tile again, not stored)."""
    if not packed_ptx(torch.device(device)):
        pytest.skip(GPU_ONLY)
    w, codes, scales = quantized_weights(48, 448, 5, 6.0, 0, "rceil")
    for m in (1, 5, 8, 13, 16, 40):
        x = random_blocks((m, 448), torch.bfloat16, 6 + m, 3.0)
        check(x, codes, scales, device, oracles.unquantized_product(x, w), config=config, gemv=True)


@pytest.mark.parametrize("fault", [f for f in kernel.FAULTS if f != "none"])
def test_planted_bugs_are_caught(fault, device):
    if not packed_ptx(torch.device(device)):
        pytest.skip(GPU_ONLY)
    w, codes, scales = quantized_weights(32, 256, 7, 6.0, 0, "floor")
    x = random_blocks((1, 256), torch.bfloat16, 8, 2.0)
    check(x, codes, scales, device, oracles.unquantized_product(x, w), gemv=True)  # passes without the bug
    with pytest.raises(AssertionError):
        check(x, codes, scales, device, oracles.unquantized_product(x, w), fault=fault, gemv=True)


@pytest.mark.parametrize("m", [2, 17])
def test_opcheck(device, m):
    _, codes, scales = quantized_weights(16, 64, 11, 2.0, 0, "floor")
    x = random_blocks((m, 64), torch.bfloat16, 12, 2.0)
    words, pairs = prepared(codes, scales, device)
    torch.library.opcheck(torch.ops.touchstone.w4a16_mxfp4_fragment_gemv.default, (x.to(device), words, pairs))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (dict(x=torch.zeros(2, 64, dtype=torch.float16)), "x: must be bf16"),
        (dict(x=torch.zeros(2, 128, dtype=torch.bfloat16)), "x: K = 128"),
        (dict(words=torch.zeros(1, 1, 32, 4, dtype=torch.int64)), "words: must be int32"),
        (dict(pairs=torch.zeros(1, 1, 8, 1, dtype=torch.int32)), "pairs: must be int32"),
    ],
    ids=["x_dtype", "x_k", "words_dtype", "pairs_shape"],
)
def test_bad_arguments_name_themselves(change, message):
    args = dict(
        x=torch.zeros(2, 64, dtype=torch.bfloat16),
        words=torch.zeros(1, 1, 32, 4, dtype=torch.int32),
        pairs=torch.zeros(1, 1, 8, 2, dtype=torch.int32),
    )
    args.update(change)
    with pytest.raises((TypeError, ValueError), match=message):
        kernel.w4a16_mxfp4_fragment_gemv(**args)


def test_layout_rejects_ragged_shapes():
    with pytest.raises(ValueError, match="multiple of 16"):
        layout.prepare(torch.zeros(8, 32, dtype=torch.uint8), torch.zeros(8, 2, dtype=torch.uint8))
    with pytest.raises(ValueError, match="scales: must be"):
        layout.prepare(torch.zeros(16, 32, dtype=torch.uint8), torch.zeros(16, 3, dtype=torch.uint8))
