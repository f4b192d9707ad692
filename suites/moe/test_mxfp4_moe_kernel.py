"""The MXFP4 MoE op (`kernels.mxfp4_moe`) against its paired references: within the "mxfp4_moe" LOSSY row against
`mxfp4_moe_mirror` and above its SQNR floor against `mxfp4_moe_ideal`, over hypothesis draws of the routing
(suites/moe/routing_draws.py), hidden and intermediate sizes (multiples of the 32-element scale block, not of
the K tile), both activations, gpt-oss's biases; opcheck; CUDA-graph replay; named bad arguments; negative
controls: an E8M0 scale read past the last block (the scales followed by poisoned guard bytes), gate and up
swapped, the neighbouring expert's weights. Values at unit scale (randn activations, weights / sqrt(fan-in))."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels.tolerances import assert_lossy, families
from reference.moe import quantized as ref
from reference.quant.mxfp4 import quantize_mxfp4
from suites.guard_bytes import Guards
from suites.moe.routing_draws import decode_routing, draw_routing, drop_one, local_experts, on

kernel = pytest.importorskip("kernels.mxfp4_moe")


def _args(hidden, inter, routing, activation, seed):
    experts, ids, weights, expert_map = routing
    g = torch.Generator().manual_seed(seed)
    local = local_experts(experts, expert_map)
    x = torch.randn(ids.shape[0], hidden, generator=g).to(torch.bfloat16)
    w13, w13_s = quantize_mxfp4(torch.randn(local, 2 * inter, hidden, generator=g) * hidden**-0.5)
    w2, w2_s = quantize_mxfp4(torch.randn(local, hidden, inter, generator=g) * inter**-0.5)
    bias = activation == "swiglu_oai"
    b13 = torch.randn(local, 2 * inter, generator=g).to(torch.bfloat16) if bias else None
    b2 = torch.randn(local, hidden, generator=g).to(torch.bfloat16) if bias else None
    return [x, w13, w13_s, w2, w2_s, weights, ids, activation, b13, b2, expert_map]


@st.composite
def layers(draw):
    hidden, inter = draw(st.sampled_from([(64, 32), (96, 64), (32, 96)]))
    activation = draw(st.sampled_from(["silu", "swiglu_oai"]))
    return _args(hidden, inter, draw_routing(draw), activation, draw(st.integers(0, 2**31 - 1)))


def _check(args, device, fault="none", launch_args=None):
    got = kernel.launch(*(launch_args or on(args, device)), fault=fault).cpu()
    if args[0].shape[0] == 0:
        assert got.shape == args[0].shape
        return
    mirror, ideal = ref.mxfp4_moe_mirror(*args), ref.mxfp4_moe_ideal(*args)
    assert_lossy(families.MXFP4_MOE, got, mirror, ideal, "mxfp4_moe")


@settings(deadline=None, max_examples=12)
@given(layers())
def test_kernel_tracks_both_references(device, args):
    _check(args, device)


def _fixed(activation="silu"):
    g = torch.Generator().manual_seed(7)
    ids = torch.stack([torch.randperm(8, generator=torch.Generator().manual_seed(t))[:2] for t in range(33)])
    return _args(128, 64, (8, ids, torch.softmax(torch.randn(33, 2, generator=g), -1), None), activation, 5)


@pytest.mark.parametrize("activation", ["silu", "swiglu_oai"])
def test_fixed_layer_within_the_row(device, activation):
    """A fixed 33-token, 8-expert, top-2 layer (the sanitizer tier's case for the MXFP4 mode)."""
    _check(_fixed(activation), device)


@pytest.mark.parametrize("fault", ["gate_up_swapped", "neighbour_expert"])
def test_negative_controls_are_caught(device, fault):
    with pytest.raises(AssertionError):
        _check(_fixed(), device, fault)


def test_negative_control_scale_read_past_the_last_block(device):
    """Each block scaled by the next block's scale: the last expert's last row reads past w2_scales' end, into
    poison (0xFF, NaN in E8M0). The last expert is routed to, so the read happens."""
    args = _fixed()
    assert bool((args[6] == args[3].shape[0] - 1).any())
    guards = Guards()
    placed = on(args, device)
    placed[4] = guards.guarded("w2_scales", placed[4])
    with pytest.raises(AssertionError):
        _check(args, device, "mx_scale_past_end", placed)


def _decode(activation="silu", expert_map=False, tokens=3):
    """`decode_routing`'s layer (`kernels.moe_gemv`'s path)."""
    return _args(96, 64, decode_routing(tokens, expert_map), activation, 3)


@pytest.mark.parametrize("activation", ["silu", "swiglu_oai"])
@pytest.mark.parametrize("expert_map", [False, True])
def test_decode_path_within_the_row_and_beside_the_grouped_gemm(device, activation, expert_map):
    """Up to MAX_ASSIGNMENTS the layer is one GEMV an assignment; the grouped GEMM (forced by `tiles`) on the
    same layer is within the same row: both paths against both references."""
    from kernels import moe_gemv
    from kernels.moe_gemm import choose_tiles, mx_tiles

    args = _decode(activation, expert_map)
    assert moe_gemv.takes(args[6].numel())
    _check(args, device)
    placed = on(args, device)
    tiles = mx_tiles(placed[0].device, 6, 8, *choose_tiles(placed[0].device, 6, 8, 96, 64))
    grouped = kernel.launch(*placed, tiles=tiles).cpu()
    assert_lossy(families.MXFP4_MOE, grouped, ref.mxfp4_moe_mirror(*args), ref.mxfp4_moe_ideal(*args), "mxfp4_moe")


@pytest.mark.parametrize("path", ["gemv", "grouped"])
def test_a_dropped_assignment_adds_nothing(device, path):
    """An expert id outside [0, E) adds nothing on both paths: its per-assignment row is written by no GEMV or GEMM
    and never zeroed, and the combine (`kernels.moe_combine`) skips it by its id."""
    from kernels.moe_gemm import choose_tiles, mx_tiles

    args = _decode("swiglu_oai")
    placed, host = drop_one(args, 6, 5, 8, device)
    tiles = None
    if path == "grouped":
        tiles = mx_tiles(placed[0].device, 6, 8, *choose_tiles(placed[0].device, 6, 8, 96, 64))
    got = kernel.launch(*placed, tiles=tiles).cpu()
    assert_lossy(families.MXFP4_MOE, got, ref.mxfp4_moe_mirror(*host), ref.mxfp4_moe_ideal(*host), "mxfp4_moe")


@pytest.mark.parametrize("fault", ["gate_up_swapped", "neighbour_expert", "mx_scale_past_end"])
@pytest.mark.parametrize("activation", ["silu", "swiglu_oai"])
def test_decode_path_negative_controls(device, fault, activation):
    """The planted bugs on the GEMV path; the scale read past the end lands in guard bytes (poison)."""
    args = _decode(activation)
    placed = on(args, device)
    placed[4] = Guards().guarded("w2_scales", placed[4])
    with pytest.raises(AssertionError):
        _check(args, device, fault, placed)


def test_opcheck(device):
    torch.library.opcheck(
        torch.ops.touchstone.mxfp4_moe.default,
        tuple(on(_fixed("swiglu_oai"), device)),
        test_utils=("test_schema", "test_faketensor"),
    )


def test_bad_arguments_are_named(device):
    x, w13, w13_s, w2, w2_s, weights, ids = on(_fixed(), device)[:7]
    with pytest.raises(ValueError, match="w13_scales"):
        kernel.mxfp4_moe(x, w13, w13_s[:, :, :1], w2, w2_s, weights, ids)
    with pytest.raises(TypeError, match="w2"):
        kernel.mxfp4_moe(x, w13, w13_s, w2.to(torch.int32), w2_s, weights, ids)
    with pytest.raises(TypeError, match="x: must be bf16"):
        kernel.mxfp4_moe(x.half(), w13, w13_s, w2, w2_s, weights, ids)
    with pytest.raises(ValueError, match="topk_weights"):
        kernel.mxfp4_moe(x, w13, w13_s, w2, w2_s, weights[:, :1], ids)


@pytest.mark.gpu_only(reason="captures and replays a CUDA graph")
def test_graph_replay_equals_eager(device):
    static = on(_fixed("swiglu_oai"), device)
    kernel.mxfp4_moe(*static)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = kernel.mxfp4_moe(*static)
    for seed in range(3):
        g = torch.Generator().manual_seed(seed)
        static[6].copy_(torch.stack([torch.randperm(8, generator=g)[:2] for _ in range(33)]).to(device))
        graph.replay()
        assert torch.equal(out, kernel.mxfp4_moe(*static))
