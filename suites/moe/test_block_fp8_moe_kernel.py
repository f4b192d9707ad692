"""The block-FP8 MoE op (`kernels.block_fp8_moe`) against its paired references: within the "block_fp8_moe"
LOSSY row against `block_fp8_moe_mirror` and above its SQNR floor against `block_fp8_moe_ideal`, over hypothesis
draws of experts, top-k, tokens (0, 1, odd, more than E x block), skew (every token on one expert), expert-parallel
maps and hidden/intermediate sizes (multiples of the 128-wide blocks, as the format requires); opcheck; CUDA-graph
replay; named bad arguments; inputs followed by guard bytes and allocations from zeroed or poisoned memory giving
the same bytes (with a scale read one past the end as its control); the grouped GEMM quantizing its inputs as it
loads them equal, byte for byte, to the separate quantization pass (and a fused amax missing a lane caught against
the mirror);
negative controls on both paths (the grouped GEMM, and the decode GEMV of `kernels.moe_gemv`): a weight scale
read from the neighbouring K block, gate and up swapped, the neighbouring expert's weights. Values are drawn at
unit scale (randn activations, weights scaled by 1 / sqrt(fan-in)), where a gate/up swap costs ~30 dB, not the
~17 dB of small-scale MoE test draws."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels.tolerances import assert_lossy, families
from reference.moe import quantized as ref
from reference.quant.fp8 import quantize_fp8_blocks
from suites.guard_bytes import assert_guarded_call_agrees
from suites.moe.routing_draws import decode_routing, draw_routing, drop_one, local_experts, on

kernel = pytest.importorskip("kernels.block_fp8_moe")


def _blocks(w: torch.Tensor):
    parts = [quantize_fp8_blocks(e) for e in w]
    return torch.stack([p[0] for p in parts]), torch.stack([p[1] for p in parts])


def _args(hidden, inter, routing, seed):
    experts, ids, weights, expert_map = routing
    g = torch.Generator().manual_seed(seed)
    local = local_experts(experts, expert_map)
    x = torch.randn(ids.shape[0], hidden, generator=g).to(torch.bfloat16)
    w13, w13_s = _blocks(torch.randn(local, 2 * inter, hidden, generator=g) * hidden**-0.5)
    w2, w2_s = _blocks(torch.randn(local, hidden, inter, generator=g) * inter**-0.5)
    return [x, w13, w13_s, w2, w2_s, weights, ids, "silu", expert_map]


@st.composite
def layers(draw):
    hidden, inter = draw(st.sampled_from([(128, 128), (256, 128), (128, 256)]))
    return _args(hidden, inter, draw_routing(draw), draw(st.integers(0, 2**31 - 1)))


def _check(args, device, fault="none"):
    got = kernel.launch(*on(args, device), fault=fault).cpu()
    if args[0].shape[0] == 0:
        assert got.shape == args[0].shape
        return
    mirror, ideal = ref.block_fp8_moe_mirror(*args), ref.block_fp8_moe_ideal(*args)
    assert_lossy(families.BLOCK_FP8_MOE, got, mirror, ideal, "block_fp8_moe")


@settings(deadline=None, max_examples=12)
@given(layers())
def test_kernel_tracks_both_references(device, args):
    _check(args, device)


def _fixed():
    g = torch.Generator().manual_seed(7)
    ids = torch.stack([torch.randperm(8, generator=torch.Generator().manual_seed(t))[:2] for t in range(33)])
    return _args(256, 128, (8, ids, torch.softmax(torch.randn(33, 2, generator=g), -1), None), 5)


def test_fixed_layer_within_the_row(device):
    """A fixed 33-token, 8-expert, top-2 layer (the sanitizer tier's case for the block-FP8 mode)."""
    _check(_fixed(), device)


@pytest.mark.parametrize("fault", ["none", "weight_scale_next_k_block", "gate_up_swapped"])
def test_prefill_tiles_through_tma(device, fault):
    """Prefill tiles (BM 64, one 128-deep scale step): the E4M3 weight tiles come through TMA descriptors on
    Hopper and in the interpreter; within the row, and planted bugs caught on that path too."""
    from kernels.moe_gemm import Tiles, weights_through_tma

    args = on(_fixed(), device)
    tiles = (Tiles(64, 64, 128, 4, 2, 2), Tiles(64, 64, 128, 4, 2, 2))
    assert weights_through_tma(args[1], tiles[0], "silu", False) == (
        device != "cuda" or torch.cuda.get_device_capability()[0] >= 9
    )
    got = kernel.launch(*args, fault=fault, tiles=tiles).cpu()
    fixed = _fixed()
    mirror, ideal = ref.block_fp8_moe_mirror(*fixed), ref.block_fp8_moe_ideal(*fixed)
    if fault == "none":
        assert_lossy(families.BLOCK_FP8_MOE, got, mirror, ideal, "block_fp8_moe")
    else:
        with pytest.raises(AssertionError):
            assert_lossy(families.BLOCK_FP8_MOE, got, mirror, ideal, "block_fp8_moe")


@pytest.mark.parametrize("fault", ["weight_scale_next_k_block", "gate_up_swapped", "neighbour_expert"])
def test_negative_controls_are_caught(device, fault):
    with pytest.raises(AssertionError):
        _check(_fixed(), device, fault)


def _peaks_in_last_lanes():
    """`_fixed`'s layer with every 128-wide group of x peaking in its last element (8x the group's largest
    other magnitude, alternating sign): the case an amax that misses a lane gets wrong."""
    args = _fixed()
    x = args[0].float().view(33, -1, 128)
    peak = 8 * x[..., :-1].abs().amax(-1)
    x[..., -1] = torch.where(torch.arange(x.shape[1]) % 2 == 0, peak, -peak)
    args[0] = x.view(33, -1).to(torch.bfloat16)
    return args


@pytest.mark.parametrize("bm", [16, 64])
def test_fused_quantization_gives_the_separate_pass_bytes(device, bm):
    """The grouped GEMMs quantizing their inputs as they load them (`kernels.moe_gemm`'s QUANT_A) and the
    separate `kernels.fp8_quant` pass give the same output bytes, at decode (BM 16) and prefill (BM 64) tiles,
    on a layer whose groups peak in their last lane; and within the row against both references."""
    from kernels.moe_gemm import Tiles

    args = _peaks_in_last_lanes()
    tiles = (Tiles(bm, 64, 128, 4, 2, 2), Tiles(bm, 64, 128, 4, 2, 2))
    fused, separate = (kernel.launch(*on(args, device), tiles=tiles, fuse_quant=f).cpu() for f in (True, False))
    assert torch.equal(fused, separate)
    mirror, ideal = ref.block_fp8_moe_mirror(*args), ref.block_fp8_moe_ideal(*args)
    assert_lossy(families.BLOCK_FP8_MOE, fused, mirror, ideal, "block_fp8_moe")


def test_negative_control_a_fused_amax_missing_a_lane_is_caught(device):
    """A fused quantization whose amax skips each group's last element saturates that element: caught against
    the mirror, on the layer whose groups peak there."""
    from kernels.moe_gemm import Tiles

    args = _peaks_in_last_lanes()
    tiles = (Tiles(16, 64, 128, 4, 2, 2), Tiles(16, 64, 128, 4, 2, 2))
    got = kernel.launch(*on(args, device), tiles=tiles, fuse_quant=True, fault="fused_amax_skips_last_lane").cpu()
    mirror, ideal = ref.block_fp8_moe_mirror(*args), ref.block_fp8_moe_ideal(*args)
    with pytest.raises(AssertionError):
        assert_lossy(families.BLOCK_FP8_MOE, got, mirror, ideal, "block_fp8_moe")


# Run by `suites.compile_for_sm90`: the block-FP8 grouped GEMM at the GPU table's tiles (decode: BM 16, pointer
# loads, mma.sync; prefill: BM 64, TMA weight tiles, wgmma), its inputs E4M3 or quantized as they load.
_COMPILE_GROUPED_FOR_SM90 = """
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, compile
from kernels import moe_gemm as m

for row in (m.GPU_TILES[0], m.GPU_TILES[-1]):
    first, _ = m.fp8_tiles(*row[1:])
    w_tma = first.bm >= 64
    for quant in (False, True):
        signature = dict(a_ptr="*bf16" if quant else "*fp8e4nv", w_ptr="*fp8e4nv", bias_ptr="*fp8e4nv",
                         out_ptr="*bf16", sorted_ptr="*i32", expert_ids_ptr="*i32", post_ptr="*i32",
                         weights_ptr="*fp32", as_ptr="*fp32", ws_ptr="*fp32")
        signature |= dict.fromkeys(("n_assign", "N", "K", "A_DIV", "num_experts", "stride_am", "stride_we",
                                    "stride_wn", "stride_be", "stride_om", "stride_asm", "stride_wse", "stride_wsn",
                                    "eps_bits"), "i32")
        signature["w_desc"] = f"tensordesc<fp8e4nv[{first.bn}, {first.bk}]>" if w_tma else "constexpr"
        constants = dict(ACT=1, HAS_BIAS=False, MUL_WEIGHT=False, SCALED=True, MX=False, BM=first.bm, BN=first.bn,
                         BK=first.bk, GROUP_M=first.group_m, EVEN_K=True, FAULT=0, MX_PACKED=False, W_TMA=w_tma,
                         QUANT_A=quant)
        if not w_tma:
            constants["w_desc"] = None
        signature |= dict.fromkeys(constants, "constexpr")
        source = ASTSource(fn=m._moe_gemm_kernel, signature=signature, constexprs=constants)
        options = {"num_warps": first.warps, "num_stages": first.stages}
        ptx = compile(source, target=GPUTarget("cuda", 90, 32), options=options).asm["ptx"]
        print(first.bm, quant, "wgmma" in ptx, "cvt.rn.satfinite.e4m3x2.f32" in ptx)
"""


def test_grouped_gemm_compiles_for_sm90():
    """The grouped GEMM's block-FP8 mode at the GPU table's decode and prefill tiles, with E4M3 inputs and with
    inputs quantized as they load, through Triton's compiler for sm_90 with no GPU: each lowers (decode to
    mma.sync, prefill to wgmma), and only the quantizing variant converts to E4M3 (its PTX holds the saturating
    conversion)."""
    from suites.compile_for_sm90 import run_compiler

    assert run_compiler(_COMPILE_GROUPED_FOR_SM90) == [
        "16 False False False", "16 True False True", "64 False True False", "64 True True True"
    ]  # fmt: skip


def _decode(expert_map=False, tokens=3):
    """`decode_routing`'s layer (`kernels.moe_gemv`'s block-FP8 path)."""
    return _args(256, 128, decode_routing(tokens, expert_map), 3)


@pytest.mark.parametrize("expert_map", [False, True])
def test_decode_path_within_the_row_and_beside_the_grouped_gemm(device, expert_map):
    """Up to `kernels.moe_gemv.takes(..., fp8=True)` assignments the layer is one GEMV an assignment; the grouped
    GEMM (forced by `tiles`) on the same layer is within the same row: both paths against both references."""
    from kernels import moe_gemv
    from kernels.moe_gemm import choose_tiles, fp8_tiles

    args = _decode(expert_map)
    assert moe_gemv.takes(args[6].numel(), fp8=True)
    _check(args, device)
    placed = on(args, device)
    tiles = fp8_tiles(*choose_tiles(placed[0].device, 6, 8, 256, 128))
    grouped = kernel.launch(*placed, tiles=tiles).cpu()
    mirror, ideal = ref.block_fp8_moe_mirror(*args), ref.block_fp8_moe_ideal(*args)
    assert_lossy(families.BLOCK_FP8_MOE, grouped, mirror, ideal, "block_fp8_moe")


@pytest.mark.parametrize("path", ["gemv", "grouped"])
def test_zeroed_and_poisoned_surroundings_give_the_same_bytes(device, path):
    """Every input followed by guard bytes (the E4M3 weights and their fp32 block scales included) and the free
    memory the op allocates from (quantized activations, workspaces, output) filled, once with zeros and once with
    poison (NaN / 0xFF): the same output bytes, every guard byte intact (suites.guard_bytes), on the decode GEMV and
    on the grouped GEMM (forced by `tiles`). A scale read past the last block would pick up NaN."""
    from kernels.moe_gemm import choose_tiles, fp8_tiles

    x, w13, s13, w2, s2, weights, ids, activation, _ = _decode()
    tiles = None if path == "gemv" else fp8_tiles(*choose_tiles(torch.device(device), 6, 8, 256, 128))
    inputs = dict(x=x, w13=w13, w13_scales=s13, w2=w2, w2_scales=s2, topk_weights=weights, topk_ids=ids)
    assert_guarded_call_agrees(lambda **a: kernel.launch(**a, activation=activation, tiles=tiles), inputs, device)


@pytest.mark.parametrize("path", ["gemv", "grouped"])
def test_negative_control_a_scale_read_past_the_end_is_caught(device, path):
    """The same check on a call whose w2 scales are read one element later (a view of the guarded buffer shifted by
    one fp32: its last block's scale is the first guard word): the poisoned run differs."""
    from kernels.moe_gemm import choose_tiles, fp8_tiles

    x, w13, s13, w2, s2, weights, ids, activation, _ = _decode()
    tiles = None if path == "gemv" else fp8_tiles(*choose_tiles(torch.device(device), 6, 8, 256, 128))
    inputs = dict(x=x, w13=w13, w13_scales=s13, w2=w2, w2_scales=s2, topk_weights=weights, topk_ids=ids)

    def late(w2_scales, **a):
        shifted = w2_scales.as_strided(w2_scales.shape, w2_scales.stride(), w2_scales.storage_offset() + 1)
        return kernel.launch(**a, w2_scales=shifted, activation=activation, tiles=tiles)

    with pytest.raises(AssertionError, match="differ between zeroed and poisoned"):
        assert_guarded_call_agrees(late, inputs, device)


@pytest.mark.parametrize("path", ["gemv", "grouped"])
def test_a_dropped_assignment_adds_nothing(device, path):
    """An expert id outside [0, E) adds nothing on both paths: its per-assignment row is written by no GEMV or GEMM
    and never zeroed, and the combine (`kernels.moe_combine`) skips it by its id."""
    from kernels.moe_gemm import choose_tiles, fp8_tiles

    args = _decode()
    placed, host = drop_one(args, 6, 5, 8, device)
    tiles = fp8_tiles(*choose_tiles(placed[0].device, 6, 8, 256, 128)) if path == "grouped" else None
    got = kernel.launch(*placed, tiles=tiles).cpu()
    mirror, ideal = ref.block_fp8_moe_mirror(*host), ref.block_fp8_moe_ideal(*host)
    assert_lossy(families.BLOCK_FP8_MOE, got, mirror, ideal, "block_fp8_moe")


@pytest.mark.parametrize("fault", ["weight_scale_next_k_block", "gate_up_swapped", "neighbour_expert"])
def test_decode_path_negative_controls(device, fault):
    with pytest.raises(AssertionError):
        _check(_decode(), device, fault)


def _bytes(t):
    return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t


def test_opcheck(device):
    """opcheck's test_schema compares inputs with float arithmetic torch lacks for float8_e4m3fn: the schema's
    no-mutation claim is checked on the bytes instead."""
    args = on(_fixed(), device)
    before = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    torch.library.opcheck(torch.ops.touchstone.block_fp8_moe.default, tuple(args), test_utils=("test_faketensor",))
    for old, new in zip(before, args, strict=True):
        assert not isinstance(old, torch.Tensor) or torch.equal(_bytes(old), _bytes(new))


def test_bad_arguments_are_named(device):
    x, w13, w13_s, w2, w2_s, weights, ids = on(_fixed(), device)[:7]
    with pytest.raises(ValueError, match="w13_scales"):
        kernel.block_fp8_moe(x, w13, w13_s[:, :1], w2, w2_s, weights, ids)
    with pytest.raises(TypeError, match="w2"):
        kernel.block_fp8_moe(x, w13, w13_s, w2.to(torch.bfloat16), w2_s, weights, ids)
    with pytest.raises(TypeError, match="x: must be bf16 or fp16"):
        kernel.block_fp8_moe(x.float(), w13, w13_s, w2, w2_s, weights, ids)
    with pytest.raises(ValueError, match="topk_ids"):
        kernel.block_fp8_moe(x, w13, w13_s, w2, w2_s, weights[:, :1].expand(-1, 9), ids.repeat(1, 5)[:, :9])


@pytest.mark.gpu_only(reason="captures and replays a CUDA graph")
@pytest.mark.parametrize("layer", [_fixed, _decode], ids=["grouped", "decode"])
def test_graph_replay_equals_eager(device, layer):
    """No host sync in the op (quantization included), on either path: it captures, and replays on new routings
    equal eager."""
    static = on(layer(), device)
    tokens = static[6].shape[0]
    kernel.block_fp8_moe(*static)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = kernel.block_fp8_moe(*static)
    for seed in range(3):
        g = torch.Generator().manual_seed(seed)
        static[6].copy_(torch.stack([torch.randperm(8, generator=g)[:2] for _ in range(tokens)]).to(device))
        graph.replay()
        assert torch.equal(out, kernel.block_fp8_moe(*static))
