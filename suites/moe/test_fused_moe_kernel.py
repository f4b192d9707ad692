"""The MoE kernels (`kernels.moe_align`, `kernels.moe_gemm` through `kernels.fused_moe`) against the references:
the alignment bit-exact with `reference.moe.align` and passing its contract checker, the layer within the
"fused_moe" LOSSY row against `fused_moe_mirror` and above its SQNR floor against `fused_moe_ideal`, over
hypothesis draws of experts, top-k, tokens (0, 1, odd, more than E x block), hidden and intermediate sizes that
are no multiples of the tiles, skew (every token on one expert, empty experts), expert-parallel maps, both
activations with biases; opcheck of both ops; inputs followed by guard bytes and allocations from zeroed or
poisoned memory giving the same bytes; negative controls: planted bugs in both kernels."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels._boundary import runs_interpreted
from kernels.tolerances import assert_lossy, families, lossy_metrics
from reference.moe import experts as ref
from reference.moe.align import Alignment, align_block_size, check_alignment
from suites.guard_bytes import assert_guarded_call_agrees, poisoned_allocations
from suites.moe.routing_draws import drop_one

align = pytest.importorskip("kernels.moe_align")
fused = pytest.importorskip("kernels.fused_moe")


@st.composite
def layers(draw):
    experts = draw(st.sampled_from([1, 3, 8]))
    top_k = draw(st.integers(1, min(experts, 4)))
    tokens = draw(st.sampled_from([0, 1, 5, 33]))
    hidden, inter = draw(st.sampled_from([(40, 24), (32, 48), (17, 9)]))
    activation = draw(st.sampled_from(sorted(ref.ACTIVATIONS)))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    skew = draw(st.sampled_from(["random", "one_expert"]))
    if skew == "one_expert" or tokens == 0:
        first = torch.randperm(experts, generator=g)[:top_k]
        ids = first.repeat(tokens, 1)
    else:
        ids = torch.stack([torch.randperm(experts, generator=g)[:top_k] for _ in range(tokens)])
    weights = torch.softmax(torch.randn(tokens, top_k, generator=g), -1)
    expert_map = None
    if draw(st.booleans()) and experts > 1:
        here = torch.randperm(experts, generator=g)[: (experts + 1) // 2]
        expert_map = torch.full((experts,), -1, dtype=torch.int32)
        expert_map[here] = torch.arange(here.numel(), dtype=torch.int32)
    local = experts if expert_map is None else int((expert_map >= 0).sum())
    bias = activation == "swiglu_oai"
    return dict(
        tokens=tokens, hidden=hidden, inter=inter, local=local, ids=ids, weights=weights, activation=activation,
        expert_map=expert_map, bias=bias, dtype=draw(st.sampled_from([torch.bfloat16, torch.float16])),
        seed=draw(st.integers(0, 2**31 - 1)),
    )  # fmt: skip


def _tensors(p: dict, device: str):
    g = torch.Generator().manual_seed(p["seed"])
    h, i, e, dtype = p["hidden"], p["inter"], p["local"], p["dtype"]
    x = torch.randn(p["tokens"], h, generator=g).to(dtype)
    w13 = (torch.randn(e, 2 * i, h, generator=g) * h**-0.5).to(dtype)
    w2 = (torch.randn(e, h, i, generator=g) * i**-0.5).to(dtype)
    b13 = torch.randn(e, 2 * i, generator=g).to(dtype) if p["bias"] else None
    b2 = torch.randn(e, h, generator=g).to(dtype) if p["bias"] else None
    args = [x, w13, w2, p["weights"], p["ids"], p["activation"], b13, b2, p["expert_map"]]
    return args, [t.to(device) if isinstance(t, torch.Tensor) else t for t in args]


def _check(p: dict, device: str, fault: str = "none") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The layer into poisoned workspaces (`poisoned_allocations`), on the CPU too: a row no GEMM wrote and the
    combine summed is NaN (the GEMMs write zeros for another rank's expert). Returns (kernel, mirror, ideal)."""
    host, on_device = _tensors(p, device)
    with poisoned_allocations(device):
        got = fused.launch(*on_device, fault=fault).cpu()
    mirror, ideal = ref.fused_moe_mirror(*host), ref.fused_moe_ideal(*host)
    if p["tokens"]:
        assert_lossy(families.FUSED_MOE, got, mirror, ideal, "fused_moe")
    else:
        assert got.shape == (0, p["hidden"])
    return got, mirror, ideal


@settings(deadline=None)
@given(layers())
def test_kernel_tracks_both_references(device, p):
    _check(p, device)


@settings(deadline=None)
@given(layers(), st.sampled_from([1, 4, 16]))
def test_alignment_is_the_reference_bit_for_bit(device, p, block):
    ids, expert_map = p["ids"], p["expert_map"]
    experts = expert_map.numel() if expert_map is not None else 8  # every drawn id is < 8
    got = align.moe_align_block_size(
        ids.to(device), experts, block, None if expert_map is None else expert_map.to(device)
    )
    want = align_block_size(ids, experts, block, expert_map)
    names = ("sorted_token_ids", "expert_ids", "num_tokens_post_padded")
    for name, a, b in zip(names, got, vars(want).values(), strict=True):
        assert torch.equal(a.cpu(), b), name


def _skewed(device: str):
    g = torch.Generator().manual_seed(4)
    p = dict(
        tokens=33, hidden=40, inter=24, local=8, activation="silu", expert_map=None, bias=False,
        dtype=torch.bfloat16, seed=3, weights=torch.softmax(torch.randn(33, 2, generator=g), -1),
        ids=torch.stack([torch.randperm(8, generator=torch.Generator().manual_seed(t))[:2] for t in range(33)]),
    )  # fmt: skip
    return p


def test_alignment_named_case_bytes(device):
    """`reference.moe.align`'s named case, on the kernel: expert 3 empty, one run padded by three."""
    got = align.moe_align_block_size(torch.tensor([[0, 2], [2, 1], [0, 2]], device=device), 4, 4)
    pad = 6
    assert got[0].tolist() == [0, 4, pad, pad, 3, pad, pad, pad, 1, 2, 5, pad] + [pad] * 8
    assert got[1].tolist() == [0, 1, 2, -1, -1] and got[2].tolist() == [12]


def test_fixed_layer_within_the_row(device):
    """A fixed 33-token, 8-expert, top-2 layer (the sanitizer tier's case for the grouped GEMM)."""
    _check(_skewed(device), device)


@pytest.mark.parametrize("tokens", [3, 33])
@pytest.mark.parametrize("bias", [False, True], ids=["silu", "swiglu_oai"])
def test_zeroed_and_poisoned_surroundings_give_the_same_bytes(device, tokens, bias):
    """Every input followed by guard bytes and the free memory the op allocates from (its workspaces and output)
    filled, once with zeros and once with poison (NaN / 0xFF): the same output bytes, every guard byte intact
    (suites.guard_bytes). Hidden 40 and intermediate 24 are off every tile, so a tile's masked edge reading past a
    weight's end would pick up poison."""
    p = dict(_skewed(device), bias=bias, activation="swiglu_oai" if bias else "silu")
    p.update(tokens=tokens, ids=p["ids"][:tokens], weights=p["weights"][:tokens])
    host, _ = _tensors(p, device)
    x, w13, w2, weights, ids, activation, b13, b2, _ = host
    inputs = dict(x=x, w13=w13, w2=w2, topk_weights=weights, topk_ids=ids)
    if bias:
        inputs.update(w13_bias=b13, w2_bias=b2)
    assert_guarded_call_agrees(lambda **a: fused.launch(**a, activation=activation), inputs, device)


def test_another_ranks_experts_add_nothing(device):
    """The fixed layer under an expert-parallel map with three of its 8 experts on another rank, into poisoned
    workspaces: their rows are the zeros the GEMMs write for expert -1, so the layer is this rank's share."""
    p = _skewed(device)
    p["expert_map"] = torch.tensor([0, -1, 1, -1, 2, 3, -1, 4], dtype=torch.int32)
    p["local"] = 5
    _check(p, device)


def test_a_carried_intermediate_flip_stays_within_the_row(device):
    """A hypothesis draw where the first GEMM's sums, in another order than the mirror's, flip one fp16 ulp of an
    intermediate that the second GEMM carries into 7 of token 0's 17 outputs (interpreter): rms_rel 4.7e-4 over
    the layer's 85 outputs, within the row's one-ulp rms bound (`kernels.tolerances.table`)."""
    weights = [[0.1226, 0.0289, 0.8485], [0.6705, 0.2094, 0.1201], [0.5067, 0.3010, 0.1923], [0.1971, 0.4491, 0.3538],
               [0.5934, 0.0508, 0.3558]]  # fmt: skip
    p = dict(
        tokens=5, hidden=17, inter=9, local=4, activation="swiglu_oai", bias=True, dtype=torch.float16, seed=67,
        ids=torch.tensor([[7, 2, 5], [4, 6, 2], [4, 2, 3], [7, 3, 2], [0, 4, 6]]), weights=torch.tensor(weights),
        expert_map=torch.tensor([-1, -1, 1, -1, -1, 2, 3, 0], dtype=torch.int32),
    )  # fmt: skip
    got, mirror, ideal = _check(p, device)
    if runs_interpreted(torch.device(device)):  # the case still is what it names: token 0 alone off, by > 1/2 ulp
        assert (got != mirror).any(dim=1).tolist() == [True, False, False, False, False]
        assert lossy_metrics(got, mirror, ideal).rms_rel > 2.0**-12


def test_a_dropped_assignment_adds_nothing(device):
    """An expert id outside [0, E) adds nothing: the alignment drops it, so no GEMM writes its per-assignment row,
    which is never zeroed, and the combine (`kernels.moe_combine`) skips it by its id."""
    p = _skewed(device)
    host, _ = _tensors(p, device)
    placed, host = drop_one(host, 4, 3, 8, device)
    got = fused.launch(*placed).cpu()
    assert_lossy(families.FUSED_MOE, got, ref.fused_moe_mirror(*host), ref.fused_moe_ideal(*host), "fused_moe")


def test_prefill_tiles_read_weights_through_tma_within_the_row(device):
    """Prefill tiles (BM 64, BK 64) on the fixed layer: on Hopper (and in the interpreter) the weight tiles come
    through TMA descriptors, rows past an expert's N included; the layer stays within the row, and a planted
    bug still shows through that path."""
    from kernels.moe_gemm import Tiles, weights_through_tma

    p = _skewed(device)
    host, on_device = _tensors(p, device)
    tiles = (Tiles(64, 32, 64, 4, 2, 2), Tiles(64, 32, 64, 4, 2, 2))
    sm90 = device != "cuda" or torch.cuda.get_device_capability()[0] >= 9
    assert weights_through_tma(on_device[1], tiles[0], "silu", False) == sm90
    got = fused.launch(*on_device, tiles=tiles).cpu()
    assert_lossy(families.FUSED_MOE, got, ref.fused_moe_mirror(*host), ref.fused_moe_ideal(*host), "fused_moe")
    with pytest.raises(AssertionError):
        bad = fused.launch(*on_device, tiles=tiles, fault="gate_up_swapped").cpu()
        assert_lossy(families.FUSED_MOE, bad, ref.fused_moe_mirror(*host), ref.fused_moe_ideal(*host), "fused_moe")


@pytest.mark.parametrize("fault", ["gate_up_swapped", "neighbour_expert", "neighbour_expert_block"])
def test_negative_controls_are_caught(device, fault):
    with pytest.raises(AssertionError):
        _check(_skewed(device), device, fault)


@pytest.mark.parametrize("tokens", [3, 150])  # 6 assignments: one program on every device; 300: several
@pytest.mark.parametrize("expert_map", [False, True])
def test_alignment_paths_bit_for_bit_and_their_controls(device, tokens, expert_map):
    """Both launch paths of `kernels.moe_align` (one program up to its CHUNK assignments, four launches
    beyond) equal the reference, and each path's planted bugs break the contract."""
    g = torch.Generator().manual_seed(tokens)
    ids = torch.stack([torch.randperm(64, generator=g)[:2] for _ in range(tokens)])
    here = torch.arange(64) % 3 != 0  # two thirds of the experts on this rank, local ids in order
    mapping = torch.where(here, here.cumsum(0) - 1, -1).to(torch.int32) if expert_map else None
    on = None if mapping is None else mapping.to(device)
    got = align.moe_align_block_size(ids.to(device), 64, 16, on)
    want = align_block_size(ids, 64, 16, mapping)
    for a, b in zip(got, vars(want).values(), strict=True):
        assert torch.equal(a.cpu(), b)
    for fault in ("padded_count_plus_one", "neighbour_expert_block"):
        bad = Alignment(*(t.cpu() for t in align.launch(ids.to(device), 64, 16, on, fault=fault)))
        if fault == "padded_count_plus_one":
            with pytest.raises(AssertionError):
                check_alignment(bad, ids, 64, 16, mapping)
        else:
            assert not torch.equal(bad.expert_ids, want.expert_ids)


def test_negative_control_padded_count_breaks_the_alignment_contract(device):
    ids = _skewed(device)["ids"]
    got = align.launch(ids.to(device), 8, 16, fault="padded_count_plus_one")
    with pytest.raises(AssertionError, match="num_tokens_post_padded"):
        check_alignment(Alignment(*(t.cpu() for t in got)), ids, 8, 16)


def test_opcheck(device):
    p = _skewed(device)
    _, args = _tensors(p, device)
    torch.library.opcheck(
        torch.ops.touchstone.fused_moe.default, tuple(args), test_utils=("test_schema", "test_faketensor")
    )
    torch.library.opcheck(
        torch.ops.touchstone.moe_align_block_size.default,
        (args[4], 8, 16, None),
        test_utils=("test_schema", "test_faketensor"),
    )


def test_bad_arguments_are_named(device):
    p = _skewed(device)
    _, args = _tensors(p, device)
    x, w13, w2, weights, ids = args[:5]
    with pytest.raises(ValueError, match="topk_ids"):
        fused.fused_moe(x, w13, w2, weights[:, :1].expand(-1, 9), ids.repeat(1, 5)[:, :9])  # top-k 9 > 8 experts
    with pytest.raises(ValueError, match="topk_weights"):
        fused.fused_moe(x, w13, w2, weights[:, :1], ids)
    with pytest.raises(TypeError, match="x, w13, w2"):
        fused.fused_moe(x.float(), w13.float(), w2.float(), weights, ids)
    with pytest.raises(ValueError, match="expert_map"):
        align.moe_align_block_size(ids, 8, 16, torch.full((8,), 9, dtype=torch.int32, device=ids.device))
    with pytest.raises(ValueError, match="block_size"):
        align.moe_align_block_size(ids, 8, 0)


@pytest.mark.gpu_only(reason="captures and replays a CUDA graph")
def test_graph_replay_equals_eager(device):
    """No host sync anywhere in the op: it captures, and a replay on new routings equals eager calls."""
    p = _skewed(device)
    _, args = _tensors(p, device)
    static = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    fused.fused_moe(*static)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fused.fused_moe(*static)
    for seed in range(3):
        g = torch.Generator().manual_seed(seed)
        ids = torch.stack([torch.randperm(8, generator=g)[:2] for _ in range(33)]).to(device)
        static[4].copy_(ids)
        graph.replay()
        assert torch.equal(out, fused.fused_moe(*static))
