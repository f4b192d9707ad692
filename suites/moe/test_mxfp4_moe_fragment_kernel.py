"""The MXFP4 MoE op on expert weights in the fragment layout (`kernels.mxfp4_moe_fragment`) against its paired
references: within the "mxfp4_moe" LOSSY row against `mxfp4_moe_mirror` and above its SQNR floor against
`mxfp4_moe_ideal`, for the codes and scales the words stand for (`kernels.mxfp4_fragment_layout.interchange`).

Every tier: hypothesis draws of the routing (suites/moe/routing_draws.py: 0, 1, 5 and 33 tokens, skew, expert maps),
hidden and intermediate sizes (multiples of the layout's 64-wide steps), both activations with gpt-oss's biases;
an assignment to an id outside [0, E) adds nothing; the combine (`kernels.moe_combine`) bit for bit against the
fp32 sum of the kept rows in slot order, with NaN in the dropped ones; named bad arguments; opcheck. Where the
packed PTX runs (NVIDIA sm_90+) the layer's tensor-core GEMVs (`kernels.mxfp4_moe_fragment_gemv`) take these draws,
and also: every launch config the bench sweeps, beside the
interchange layer on the same layer; CUDA-graph replay; the same bytes with zeroed and with poisoned surroundings
(guard bytes after every input, free memory poisoned, so an unwritten output or a read past an input shows); and
negative controls: gate and up swapped, the neighbouring expert's weights, a scale pair read one step late, which
for the last expert's last tile lands in guard bytes (poison). Elsewhere, and beyond the GEMVs' assignments, the op
runs the bf16 layer on the experts it decodes (`kernels.mxfp4_fragment_dequantize`, `kernels.fused_moe`): its
controls (gate and up swapped, the neighbouring expert) on every tier; asking for the GEMVs where the PTX does not
run, or for the scale fault on the bf16 path, is refused by name.
Values at unit scale (randn activations, weights / sqrt(fan-in)), where a gate/up swap is visible.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels._packed_ptx import packed_ptx
from kernels.tolerances import assert_lossy, families
from reference.moe import quantized as ref
from suites.guard_bytes import Guards, assert_guarded_call_agrees
from suites.moe.routing_draws import decode_routing, draw_routing, drop_one, on
from suites.moe.test_mxfp4_moe_kernel import _args

layout = pytest.importorskip("kernels.mxfp4_fragment_layout")
kernel = pytest.importorskip("kernels.mxfp4_moe_fragment")
gemv_kernel = pytest.importorskip("kernels.mxfp4_moe_fragment_gemv")

# (WARPS, U, DEPTH, GROUPS): the configs `bench.moe.launch_sweep` races and the table can pick.
LAUNCH_CONFIGS = [
    (8, 2, 1, 1), (4, 2, 1, 1), (4, 1, 1, 1), (2, 2, 1, 1), (2, 2, 2, 1), (1, 2, 1, 1), (4, 2, 0, 1), (2, 2, 1, 2)
]  # fmt: skip
# (first GEMV's, second's) pairs the table picks, run as pairs too.
CONFIG_PAIRS = [((4, 1, 1, 1), (4, 2, 1, 1))]


def test_config_table_stays_in_the_tested_configs():
    """Every config `gpu_config` can pick is one this suite runs on a GPU (a pair of two configs as that pair),
    and the GEMVs' limit is where the table was measured."""
    pairs = {kernel.gpu_config(n) for n in range(1, 4 * kernel.MAX_ASSIGNMENTS)}
    tested = {(c, c) for c in LAUNCH_CONFIGS} | set(CONFIG_PAIRS)
    assert pairs <= tested, pairs - tested
    assert kernel.gpu_config(4) == ((4, 1, 1, 1), (4, 2, 1, 1)) and kernel.gpu_config(64) == ((2, 2, 1, 1),) * 2
    assert all(first[3] == second[3] for _, first, second in kernel.CONFIGS)


def test_config_pair_refused_when_groups_differ():
    with pytest.raises(ValueError, match="config: both GEMVs run on one alignment"):
        kernel.gemv_configs(((4, 2, 1, 1), (2, 2, 1, 2)))
    assert kernel.gemv_configs((4, 2, 1, 1)) == ((4, 2, 1, 1), (4, 2, 1, 1))


def fragment_args(args: list) -> list:
    """The interchange layer's arguments with w13 and w2 (codes, scales) replaced by (words, pairs)."""
    x, w13, s13, w2, s2, *rest = args
    return [x, *layout.prepare(w13, s13), *layout.prepare(w2, s2), *rest]


def gemv_runs(device: str) -> bool:
    return packed_ptx(torch.device(device))


def _check(args, device, fault="none", placed=None, **launch):
    got = kernel.launch(*(placed or on(fragment_args(args), device)), fault=fault, **launch).cpu()
    if args[0].shape[0] == 0:
        assert got.shape == args[0].shape
        return
    assert_lossy(families.MXFP4_MOE, got, ref.mxfp4_moe_mirror(*args), ref.mxfp4_moe_ideal(*args), "mxfp4_moe")


@st.composite
def layers(draw):
    hidden, inter = draw(st.sampled_from([(64, 64), (128, 64), (64, 128)]))
    activation = draw(st.sampled_from(["silu", "swiglu_oai"]))
    return _args(hidden, inter, draw_routing(draw), activation, draw(st.integers(0, 2**31 - 1)))


@settings(deadline=None, max_examples=10)
@given(layers())
def test_kernel_tracks_both_references(device, args):
    _check(args, device)


def _decode(activation="silu", expert_map=False, tokens=3):
    """`decode_routing`'s layer: 8 experts, top 2, the last expert routed to."""
    return _args(128, 64, decode_routing(tokens, expert_map), activation, 3)


@pytest.mark.parametrize("config", LAUNCH_CONFIGS + CONFIG_PAIRS)
@pytest.mark.parametrize("activation", ["silu", "swiglu_oai"])
def test_launch_configs_beside_the_interchange_layer(device, config, activation):
    """Every launch config on 21 tokens (more than 8 on some experts: two blocks of 8, or one of 16), with half the
    experts on this rank, within the row; the op's bf16 path on the same layer within it too."""
    if not gemv_runs(device):
        pytest.skip("the tensor-core GEMVs are PTX for NVIDIA sm_90+")
    args = _decode(activation, expert_map=True, tokens=21)
    _check(args, device, config=config, gemv=True)
    _check(args, device, gemv=False)


@pytest.mark.parametrize("config", [(4, 1, 1, 1), (2, 2, 1, 2)])
def test_silu_gate_and_up_in_one_loop_give_the_bytes_of_two(device, config, monkeypatch):
    """silu's gate and up tiles walked in one K loop (UP_TOGETHER) give the bytes of two loops, one tile after the
    other: each tile's sums take the same turns in the same order."""
    if not gemv_runs(device):
        pytest.skip("the tensor-core GEMVs are PTX for NVIDIA sm_90+")
    placed = on(fragment_args(_decode("silu", expert_map=True, tokens=21)), device)
    monkeypatch.setattr(gemv_kernel, "UP_TOGETHER", True)
    together = kernel.launch(*placed, config=config, gemv=True)
    monkeypatch.setattr(gemv_kernel, "UP_TOGETHER", False)
    assert torch.equal(together, kernel.launch(*placed, config=config, gemv=True))


# Run by `suites.compile_for_sm90`: the first GEMV with silu, its gate and up tiles in one K loop and in two.
_COMPILE_FIRST_GEMV_FOR_SM90 = """
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, compile
from kernels import mxfp4_moe_fragment_gemv as m

for together in (False, True):
    signature = dict(x_ptr="*i32", words_ptr="*i32", pairs_ptr="*i32", bias_ptr="*bf16", out_ptr="*bf16",
                     sorted_ptr="*i32", expert_ids_ptr="*i32", post_ptr="*i32", weights_ptr="*fp32")
    signature |= dict.fromkeys(("n_assign", "tiles", "n_steps", "local", "A_DIV", "x_row_stride", "out_row_stride",
                                "bias_e_stride", "up_first"), "i32")
    constants = dict(ACT=1, HAS_BIAS=True, MUL_WEIGHT=False, WARPS=4, U=1, DEPTH=1, GROUPS=1, FAULT=0, EARLY=True,
                     PDL=True, UP_TOGETHER=together)
    signature |= dict.fromkeys(constants, "constexpr")
    source = ASTSource(fn=m._moe_fragment_gemv_kernel, signature=signature, constexprs=constants)
    ptx = compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "num_stages": 1}).asm["ptx"]
    print(together, ptx.count("mma.sync"))
"""


def test_first_gemv_compiles_for_sm90_with_gate_and_up_together_or_apart():
    """The first GEMV (silu, bias) through Triton's compiler for sm_90 with no GPU, both ways: each lowers to
    tensor-core MMAs, 4 a tile's turn (one loop of both tiles' 8, or two loops of 4)."""
    from suites.compile_for_sm90 import run_compiler

    assert run_compiler(_COMPILE_FIRST_GEMV_FOR_SM90) == ["False 8", "True 8"]


@pytest.mark.parametrize("fault", ["gate_up_swapped", "neighbour_expert", "mx_scale_past_end"])
@pytest.mark.parametrize("activation", ["silu", "swiglu_oai"])
def test_negative_controls_are_caught(device, fault, activation):
    """The planted bugs of the GEMVs; the late scale pair of the last expert's last tile reads guard bytes."""
    if not gemv_runs(device):
        pytest.skip("the tensor-core GEMVs are PTX for NVIDIA sm_90+")
    args = _decode(activation)
    placed = on(fragment_args(args), device)
    placed[4] = Guards().guarded("w2_pairs", placed[4])
    with pytest.raises(AssertionError):
        _check(args, device, fault, placed)


@pytest.mark.parametrize("fault", ["gate_up_swapped", "neighbour_expert"])
def test_bf16_path_negative_controls_are_caught(device, fault):
    with pytest.raises(AssertionError):
        _check(_decode(), device, fault, gemv=False)


def test_bf16_path_refuses_the_scale_fault(device):
    with pytest.raises(ValueError, match="planted in the GEMVs only"):
        kernel.launch(*on(fragment_args(_decode()), device), fault="mx_scale_past_end", gemv=False)


def test_zeroed_and_poisoned_surroundings_give_the_same_bytes(device):
    if not gemv_runs(device):
        pytest.skip("the tensor-core GEMVs are PTX for NVIDIA sm_90+")
    x, w13, p13, w2, p2, weights, ids, activation, b13, b2, _ = fragment_args(_decode("swiglu_oai", tokens=5))
    inputs = dict(x=x, w13=w13, w13_pairs=p13, w2=w2, w2_pairs=p2, topk_weights=weights, topk_ids=ids)
    inputs.update(w13_bias=b13, w2_bias=b2)
    assert_guarded_call_agrees(lambda **a: kernel.launch(**a, activation=activation), inputs, device)


def test_a_dropped_assignment_adds_nothing(device):
    """An expert id outside [0, E) (a caller's bug the alignment drops) adds nothing: the layer equals the mirror of
    the same routing with that assignment's weight zero and a valid id; the combine skips the row no GEMV wrote
    (free memory poisoned on a GPU, so that row is NaN)."""
    placed, host = drop_one(_decode("swiglu_oai", tokens=5), 6, 5, 8, device, fragment_args)
    got = kernel.launch(*placed).cpu()
    assert_lossy(families.MXFP4_MOE, got, ref.mxfp4_moe_mirror(*host), ref.mxfp4_moe_ideal(*host), "mxfp4_moe")


@pytest.mark.parametrize("top_k", [1, 3])
def test_combine_sums_the_kept_rows_in_order(device, top_k):
    """`kernels.moe_combine`: each token's kept rows summed in fp32 in slot order, rounded once (bit for bit); rows
    of ids outside [0, E) skipped, whatever their bytes (NaN here)."""
    from kernels.moe_combine import combine

    g = torch.Generator().manual_seed(top_k)
    tokens, hidden, experts = 3, 1030, 4
    slots = torch.randn(tokens * top_k, hidden, generator=g).to(torch.bfloat16)
    ids = torch.randint(0, experts, (tokens, top_k), generator=g, dtype=torch.int32)
    ids[1, 0], ids[2, -1] = experts, -1
    dropped = ((ids < 0) | (ids >= experts)).reshape(-1)
    slots[dropped] = float("nan")
    want = torch.zeros(tokens, hidden)
    for j in range(top_k):
        row = slots.view(tokens, top_k, hidden)[:, j].float()
        want += torch.where(dropped.view(tokens, top_k)[:, j, None], 0.0, row)
    got = combine(slots.to(device), ids.to(device), experts).cpu()
    assert torch.equal(got, want.to(torch.bfloat16))


def test_gemv_is_refused_where_its_ptx_does_not_run(device):
    if gemv_runs(device):
        pytest.skip("the PTX runs here")
    with pytest.raises(ValueError, match="gemv: the tensor-core GEMV is PTX"):
        kernel.launch(*on(fragment_args(_decode()), device), gemv=True)


def test_opcheck(device):
    torch.library.opcheck(
        torch.ops.touchstone.mxfp4_moe_fragment.default,
        tuple(on(fragment_args(_decode("swiglu_oai")), device)),
        test_utils=("test_schema", "test_faketensor"),
    )


def test_bad_arguments_are_named(device):
    x, w13, p13, w2, p2, weights, ids = on(fragment_args(_decode()), device)[:7]
    with pytest.raises(TypeError, match="w13_pairs"):
        kernel.mxfp4_moe_fragment(x, w13, p13[:, :, :1], w2, p2, weights, ids)
    with pytest.raises(TypeError, match="w2: must be int32"):
        kernel.mxfp4_moe_fragment(x, w13, p13, w2.view(torch.float32), p2, weights, ids)
    with pytest.raises(TypeError, match="x: must be bf16"):
        kernel.mxfp4_moe_fragment(x.half(), w13, p13, w2, p2, weights, ids)
    with pytest.raises(ValueError, match="topk_weights"):
        kernel.mxfp4_moe_fragment(x, w13, p13, w2, p2, weights[:, :1], ids)
    with pytest.raises(ValueError, match="w13"):
        kernel.mxfp4_moe_fragment(x[:, :64], w13, p13, w2, p2, weights, ids)
    with pytest.raises(ValueError, match="fault"):
        kernel.launch(x, w13, p13, w2, p2, weights, ids, fault="no_such_bug")


@pytest.mark.gpu_only(reason="captures and replays a CUDA graph")
def test_graph_replay_equals_eager(device):
    static = on(fragment_args(_decode("swiglu_oai", tokens=4)), device)
    kernel.mxfp4_moe_fragment(*static)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = kernel.mxfp4_moe_fragment(*static)
    for seed in range(3):
        g = torch.Generator().manual_seed(seed)
        static[6].copy_(torch.stack([torch.randperm(8, generator=g)[:2] for _ in range(4)]).to(device))
        graph.replay()
        assert torch.equal(out, kernel.mxfp4_moe_fragment(*static))
