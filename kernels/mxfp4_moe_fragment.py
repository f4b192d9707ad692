"""The MXFP4 W4A16 MoE layer on expert weights prepared once in the fragment layout
(`kernels.mxfp4_fragment_layout.prepare` of the [E, N, K / 2] codes and [E, N, K / 32] scales): the kernel twin of
`reference.moe.quantized.mxfp4_moe_mirror` for the codes and scales that `interchange` gives back.

Op: `touchstone::mxfp4_moe_fragment(x, w13, w13_pairs, w2, w2_pairs, topk_weights, topk_ids, activation, w13_bias,
w2_bias, expert_map) -> out [T, H]`; call it through `mxfp4_moe_fragment` below. w13 int32 words [E, 2I / 16, H /
64, 32, 4] with pairs [E, 2I / 16, H / 64, 8, 2], w2 [E, H / 16, I / 64, 32, 4] with its pairs; x bf16 [T, H];
the rest as `kernels.mxfp4_moe` (w13 gate rows then up rows, or interleaved for "swiglu_oai"; expert ids global,
`expert_map` to local experts or -1).

Decode (up to MAX_ASSIGNMENTS (token, expert) assignments, where the packed PTX runs: NVIDIA sm_90+): the
alignment in blocks of 8 * GROUPS slots (`kernels.moe_align`, one launch), the tensor-core GEMV over the blocks
twice (`kernels.mxfp4_moe_fragment_gemv`: the activation fused in the first, the routing weight in the second,
whose expert ids and first weights are read before its PDL wait), and the combine (`kernels.moe_combine`: the k
rows of a token summed in fp32 and rounded once, an assignment the alignment dropped skipped). Both GEMVs and the
combine launch with PDL. No host synchronization.
Elsewhere (prefill, the interpreter, other GPUs) it decodes the experts to bf16 (`kernels.mxfp4_fragment_dequantize`,
exact) and runs the bf16 layer (`kernels.fused_moe`): the mirror's own arithmetic, as the runner's dense MXFP4
layers prefill (a transient bf16 copy of the experts: 1.6 GB a layer for gpt-oss-20b). H200, gpt-oss-20b at 4,096
tokens: see `bench.moe.mxfp4_moe`'s prefill rows.
"""

from __future__ import annotations

import torch

from kernels import fused_moe, moe_align
from kernels import mxfp4_fragment_layout as layout
from kernels._packed_ptx import packed_ptx
from kernels.fused_moe import check_layer_tensors
from kernels.moe_combine import combine
from kernels.moe_gemm import ACTIVATIONS
from kernels.moe_gemm import FAULTS as GEMM_FAULTS
from kernels.mxfp4_fragment_dequantize import dequantize_mxfp4_fragment
from kernels.mxfp4_moe_fragment_gemv import launch_gemv
from kernels.w4a16_mxfp4_fragment_gemv import check_x_words
from reference.moe.experts import check_moe_args

# The faults the GEMV plants (`kernels.moe_gemm`'s names and codes) and the alignment's.
FAULTS = ("none", "gate_up_swapped", "neighbour_expert", "mx_scale_past_end", *moe_align.FAULTS)

# (WARPS, U steps a turn, DEPTH turns of loads ahead, GROUPS column groups a block) of each GEMV by (token, expert)
# assignments. H200, gpt-oss-20b's experts (E 32, top 4, 2880 x 2880), the whole layer as CUDA-graph replays with a
# cold L2 (`python -m bench.moe.launch_sweep --cases mxfp4_fragment_decode`, the rows at 54c8ec7 in
# reports/cuda-h200/launch_sweeps/moe_launch_sweep.csv), against memcpy on the touched experts' bytes: 1 token (4
# assignments) (4, 2, 1, 1) 41.4 us, 0.30x ((4, 1, 1, 1) 40.5, 8 warps 44.5, 2 warps 42.1; the interchange layer's
# per-assignment GEMVs 44.4); 4 tokens (16) (4, 2, 1, 1) 84.8 us, 0.52x (2 warps 86.0; the interchange layer 123.7);
# 16 tokens (64) (2, 2, 1, 1) 131.1 us, 0.62x (4 warps 138.2, 1 warp 135.7; the interchange layer's grouped GEMM
# 290.0); 64 tokens (256) (1, 2, 1, 1) 199.4 us, 0.50x ((2, 2, 1, 1) 208.3; grouped 359.4). Fewer warps a program
# win as the blocks fill: more programs resident an SM, more loads in flight. Two turns of loads ahead, and blocks of
# 16 slots (GROUPS 2), were slower everywhere (4-25 %).
# Each GEMV alone (`--cases mxfp4_fragment_gemvs`, the rows at 41d5f9d): at 1 token the first GEMV's best is
# (4, 1, 1, 1), 22.2 us against 24.3 with U = 2 (2 warps 23.6), and the second's (4, 2, 1, 1), 15.3 against 17.0
# with U = 1; the layer with that pair 38.9 us (0.32x) against 41.5 with (4, 2, 1, 1) for both (the
# mxfp4_fragment_decode rows of the same run). Beyond 1 token only the one-config rows are taken: at 4 tokens the
# second GEMV alone is 2.6 % faster with (2, 1, 1, 1), but a one-off layer timing with that pair took 89.0 us
# against 85.5 (alone and after the first GEMV under PDL the configs rank differently).
# At 1 token the layer is bound by its two GEMVs' single waves: a lone kernel that only reads the layer's 53.0 MB
# takes 21.1 us, 0.60x the 1 GiB copy's rate (`python -m bench.read_floor`, beside each token count in the sweep),
# timed with do_bench's zeroing L2 flush; with the harness's read flush (bench.timing.clean_flush) 16.4 us. These
# configs were chosen under the zeroing flush.
CONFIGS = (  # (most assignments, first GEMV's config, second GEMV's)
    (4, (4, 1, 1, 1), (4, 2, 1, 1)),
    (16, (4, 2, 1, 1), (4, 2, 1, 1)),
    (128, (2, 2, 1, 1), (2, 2, 1, 1)),
)
WIDE_CONFIG = ((1, 2, 1, 1), (1, 2, 1, 1))
# Up to this many assignments the layer runs the GEMVs; beyond, the bf16 layer on the decoded experts, whose decode
# of every expert (1.6 GB of bf16 for gpt-oss-20b) costs ~0.65 ms whatever the tokens. gpt-oss-20b in the same sweep
# at b2f71d1: 256 tokens (1024 assignments) 0.536 ms here against 1.056 ms decoded (the interchange layer's grouped
# GEMM 0.578); 1024 tokens (4096) 1.886 ms here against 1.233 decoded (grouped 1.140).
MAX_ASSIGNMENTS = 1024


def gpu_config(assignments: int) -> tuple[tuple[int, int, int, int], tuple[int, int, int, int]]:
    """((WARPS, U, DEPTH, GROUPS) of the first GEMV, of the second) for `assignments` (token, expert) pairs (the
    sweep's best, above)."""
    for most, first, second in CONFIGS:
        if assignments <= most:
            return first, second
    return WIDE_CONFIG


def gemv_configs(config: tuple) -> tuple[tuple[int, int, int, int], tuple[int, int, int, int]]:
    """(first GEMV's, second's) from one (WARPS, U, DEPTH, GROUPS) for both or such a pair; ValueError naming
    `config` where the pair's GROUPS differ (one alignment serves both GEMVs)."""
    first, second = (config, config) if isinstance(config[0], int) else config
    if first[3] != second[3]:
        raise ValueError(f"config: both GEMVs run on one alignment, so GROUPS must agree, got {first} and {second}")
    return tuple(first), tuple(second)


def check_fragment_moe_args(
    x, w13, w13_pairs, w2, w2_pairs, topk_weights, topk_ids, activation, w13_bias, w2_bias, expert_map
):  # fmt: skip
    """The mirror's checks on the decoded shapes plus the layout's; one message naming the argument. Returns the
    global expert count."""
    n13, k13 = layout.check_weights(w13, w13_pairs, "w13", lead=1)
    n2, k2 = layout.check_weights(w2, w2_pairs, "w2", lead=1)
    if not isinstance(x, torch.Tensor) or x.dtype != torch.bfloat16:
        raise TypeError(f"x: must be bf16 (the weights decode to bf16), got {getattr(x, 'dtype', type(x))}")
    if activation == "silu" and n13 % (2 * layout.ROWS):
        raise ValueError(f"w13: 2 * intermediate = {n13} must be a multiple of {2 * layout.ROWS} (the up half's tiles)")
    meta = dict(dtype=x.dtype, device="meta")
    return check_moe_args(
        x, torch.empty(w13.shape[0], n13, k13, **meta), torch.empty(w2.shape[0], n2, k2, **meta), topk_weights,
        topk_ids, activation, w13_bias, w2_bias, expert_map, False,
    )  # fmt: skip


def dequantized(words: torch.Tensor, pairs: torch.Tensor) -> torch.Tensor:
    """bf16 [E, N, K]: a stack of experts' prepared weights, decoded exactly (`kernels.mxfp4_fragment_dequantize`
    on the stack viewed as one [E * N / 16, ...] matrix)."""
    e, tiles = words.shape[:2]
    flat = dequantize_mxfp4_fragment(words.view(e * tiles, *words.shape[2:]), pairs.view(e * tiles, *pairs.shape[2:]))
    return flat.view(e, tiles * layout.ROWS, flat.shape[1])


def takes(device: torch.device, assignments: int) -> bool:
    """Whether the layer runs its tensor-core GEMVs (rather than the bf16 layer on the decoded experts)."""
    return packed_ptx(device) and assignments <= MAX_ASSIGNMENTS


def launch(
    x, w13, w13_pairs, w2, w2_pairs, topk_weights, topk_ids, activation="silu", w13_bias=None, w2_bias=None,
    expert_map=None, fault: str = "none", config: tuple | None = None, gemv: bool | None = None,
):  # fmt: skip
    """Validate (shapes and dtypes only), allocate and launch. `fault` plants a named bug (`FAULTS`); `config`
    (one (WARPS, U, DEPTH, GROUPS) for both GEMVs, or a pair: `gemv_configs`) replaces `gpu_config`'s (sweeps);
    `gemv` forces the GEMVs (True) or the bf16 layer on the decoded experts (False)."""
    experts = check_fragment_moe_args(
        x, w13, w13_pairs, w2, w2_pairs, topk_weights, topk_ids, activation, w13_bias, w2_bias, expert_map
    )
    read = dict(x=x, w13=w13, w13_pairs=w13_pairs, w2=w2, w2_pairs=w2_pairs, w13_bias=w13_bias, w2_bias=w2_bias)
    check_layer_tensors(read, topk_weights, topk_ids)
    if fault not in FAULTS:
        raise ValueError(f"fault: must be one of {list(FAULTS)}, got {fault!r}")
    tokens, top_k = topk_ids.shape
    if gemv is None:
        gemv = takes(x.device, tokens * top_k)
    if gemv and not packed_ptx(x.device):
        raise ValueError(f"gemv: the tensor-core GEMV is PTX for NVIDIA sm_90+, which {x.device} does not run")
    if not gemv:
        if fault == "mx_scale_past_end":
            raise ValueError("fault: 'mx_scale_past_end' is planted in the GEMVs only (the bf16 layer reads no scales)")
        w13_16, w2_16 = dequantized(w13, w13_pairs), dequantized(w2, w2_pairs)
        return fused_moe.launch(
            x, w13_16, w2_16, topk_weights, topk_ids, activation, w13_bias, w2_bias, expert_map, fault=fault
        )
    check_x_words(x)
    first, second = gemv_configs(config) if config else gpu_config(tokens * top_k)
    align_fault = fault if fault in moe_align.FAULTS else "none"
    gemv_fault = 0 if fault in moe_align.FAULTS else GEMM_FAULTS[fault]
    alignment = moe_align.launch(topk_ids, experts, 8 * first[3], expert_map, align_fault)
    weights = topk_weights.reshape(-1).to(torch.float32).contiguous()
    inter, hidden = w2.shape[2] * layout.STEP_K, x.shape[1]
    h = torch.empty(tokens * top_k, inter, dtype=x.dtype, device=x.device)
    act = ACTIVATIONS[activation]
    launch_gemv(x, w13, w13_pairs, w13_bias, h, alignment, weights, top_k, act, False, first, gemv_fault)
    per_slot = torch.empty(tokens * top_k, hidden, dtype=x.dtype, device=x.device)  # the combine skips dropped rows
    launch_gemv(h, w2, w2_pairs, w2_bias, per_slot, alignment, weights, 1, 0, True, second, gemv_fault, early=True)
    return combine(per_slot, topk_ids, experts)


@torch.library.custom_op("touchstone::mxfp4_moe_fragment", mutates_args=())
def _mxfp4_moe_fragment_op(
    x: torch.Tensor,
    w13: torch.Tensor,
    w13_pairs: torch.Tensor,
    w2: torch.Tensor,
    w2_pairs: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    activation: str,
    w13_bias: torch.Tensor | None,
    w2_bias: torch.Tensor | None,
    expert_map: torch.Tensor | None,
) -> torch.Tensor:
    return launch(x, w13, w13_pairs, w2, w2_pairs, topk_weights, topk_ids, activation, w13_bias, w2_bias, expert_map)


@_mxfp4_moe_fragment_op.register_fake
def _(x, w13, w13_pairs, w2, w2_pairs, topk_weights, topk_ids, activation, w13_bias, w2_bias, expert_map):
    check_fragment_moe_args(
        x, w13, w13_pairs, w2, w2_pairs, topk_weights, topk_ids, activation, w13_bias, w2_bias, expert_map
    )
    return x.new_empty(x.shape)


def mxfp4_moe_fragment(
    x, w13, w13_pairs, w2, w2_pairs, topk_weights, topk_ids, activation="silu", w13_bias=None, w2_bias=None,
    expert_map=None,
):  # fmt: skip
    """Kernel twin of `reference.moe.quantized.mxfp4_moe_mirror` on the prepared weights (the "mxfp4_moe" row)."""
    return torch.ops.touchstone.mxfp4_moe_fragment(
        x, w13, w13_pairs, w2, w2_pairs, topk_weights, topk_ids, activation, w13_bias, w2_bias, expert_map
    )
