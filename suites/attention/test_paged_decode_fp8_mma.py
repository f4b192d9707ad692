"""The FP8-cache decode's MMA kernel (`kernels.paged_decode_fp8_mma`, the op's FP8 split kernel where its PTX runs:
NVIDIA sm_90+, head 128, groups up to 8, blocks of a multiple of 16 tokens) against `reference.attention.paged`
through the ("paged_decode", dtype) rows, forced on (`mma=True`) at every launch shape it can take: drawn problems,
ragged and empty warps (sequences shorter than one warp's tokens), split counts, group sizes 1..8, q and V scales
far outside fp16's range, the planted block-table off-by-one. Where the op takes it is `takes_mma`, checked on
both sides of each bound."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kernels._packed_ptx import packed_ptx
from kernels.tolerances import assert_lossy, families
from reference.attention import paged as ref
from suites.attention.paged_cases import build_fp8, fixed, on

kernel = pytest.importorskip("kernels.paged_decode")

GPU_ONLY = "the MMA kernel is PTX for NVIDIA sm_90 and later"
# (mma_warps, mma_sub): the launch table's, and the edges of each axis.
CONFIGS = [(4, 2), (4, 1), (8, 1), (2, 2), (1, 1), (8, 2)]


def _needs_ptx(device: str) -> None:
    if not packed_ptx(torch.device(device)):
        pytest.skip(GPU_ONLY)


def check(p: dict, device: str, config: tuple[int, int] = CONFIGS[0], fault: str = "none", v_factor=1.0, q_factor=1.0):
    """The MMA kernel on build_fp8(p) (q times q_factor, the softmax scale divided by it; V scales times v_factor)
    against the mirror and the ideal."""
    q, k_cache, v_cache, table, lens, scale, k_scale, v_scale = build_fp8(p)
    q, scale, v_scale = (q.float() * q_factor).to(q.dtype), scale / q_factor, v_scale * v_factor
    splits = p["num_splits"]
    mirror = ref.paged_decode_mirror(q, k_cache, v_cache, table, lens, scale, splits, k_scale, v_scale)
    ideal = ref.paged_attention_ideal(q, k_cache, v_cache, table, lens, scale, k_scale=k_scale, v_scale=v_scale)
    got = kernel.launch_paged_decode(
        *on(device, q, k_cache, v_cache, table, lens), scale, splits, *on(device, k_scale, v_scale), fault=fault,
        config=dict(mma_warps=config[0], mma_few_warps=config[0], mma_sub=config[1]), mma=True,
    )  # fmt: skip
    assert_lossy(families.PAGED_DECODE, got.cpu(), mirror, ideal, f"paged decode mma {config} {p}")


def _problem(**changes) -> dict:
    return fixed(**(dict(head=128, kv_heads=2, spread=4.0) | changes))


@pytest.mark.parametrize("config", CONFIGS, ids=str)
@pytest.mark.parametrize("group", [1, 3, 4, 8])
def test_launch_shapes(config, group, device):
    """Every (warps, sub-tiles) over groups 1..8 (3: odd, padding heads), sequences of 1, 17 and 300 tokens (warps
    that read nothing, a ragged last sub-tile), a shared prefix, 1 and 3 splits, bf16 and fp16 q."""
    _needs_ptx(device)
    for splits, dtype in ((1, torch.bfloat16), (3, torch.float16)):
        p = _problem(group=group, seq_lens=[300, 17, 1], num_splits=splits, dtype=dtype, share_prefix=True, seed=5)
        check(p, device, config)


@st.composite
def mma_problems(draw):
    return _problem(
        dtype=draw(st.sampled_from([torch.bfloat16, torch.float16])),
        block_size=draw(st.sampled_from([16, 32, 64])),
        kv_heads=draw(st.integers(1, 3)),
        group=draw(st.integers(1, 8)),
        seq_lens=draw(st.lists(st.integers(1, 400), min_size=1, max_size=3)),
        num_splits=draw(st.sampled_from([1, 2, 5])),
        share_prefix=draw(st.booleans()),
        extra_width=draw(st.integers(0, 2)),
        unused=draw(st.sampled_from(["minus_one", "garbage"])),
        sharpness=draw(st.sampled_from([1.0, 4.0])),
        seed=draw(st.integers(0, 2**31 - 1)),
    )


@given(p=mma_problems(), spread=st.sampled_from([0.0, 4.0]))
def test_drawn_problems(p, spread, device):
    _needs_ptx(device)
    check(p | dict(spread=spread), device)


@pytest.mark.parametrize("q_factor", [2.0**20, 2.0**-20], ids=["q-huge", "q-tiny"])
def test_bf16_q_far_outside_fp16_range(q_factor, device):
    """q scaled into fp16's range by a power of two and the scores scaled back (see the generic kernel's test)."""
    _needs_ptx(device)
    check(_problem(seq_lens=[150, 37], num_splits=2, seed=21), device, q_factor=q_factor)


@pytest.mark.parametrize("v_factor", [2.0**24, 2.0**-24], ids=["v-huge", "v-tiny"])
def test_v_scales_far_outside_fp16_range(v_factor, device):
    """p * v_scale rounded in each iteration's power-of-two range and the accumulator's units kept exact."""
    _needs_ptx(device)
    check(_problem(seq_lens=[150, 37], num_splits=2, seed=22), device, v_factor=v_factor)


def test_negative_control_block_table_off_by_one(device):
    _needs_ptx(device)
    p = _problem(group=2, seq_lens=[40, 7], num_splits=2, extra_width=1, spare_blocks=2, unused="garbage", seed=4)
    with pytest.raises(AssertionError, match="paged decode mma"):
        check(p, device, fault="block_table_off_by_one")
    check(p, device)


def test_takes_mma_bounds(device):
    """The op takes the MMA kernel for head 128, groups up to 8, blocks of 16k tokens where the PTX runs, and the
    generic kernel on the other side of each bound (and everywhere else); `mma=True` there is refused by name."""
    q, k_cache, *_ = on(device, *build_fp8(_problem(group=8))[:2])
    runs = packed_ptx(torch.device(device))
    assert kernel.takes_mma(q, k_cache, 8) == runs
    assert not kernel.takes_mma(q, k_cache, 9)
    q64, k64 = on(device, *build_fp8(fixed(head=64, spread=4.0))[:2])
    assert not kernel.takes_mma(q64, k64, 4)
    q8, k8 = on(device, *build_fp8(_problem(block_size=8))[:2])
    assert not kernel.takes_mma(q8, k8, 4)
    q, k_cache, v_cache, table, lens, scale, k_scale, v_scale = build_fp8(fixed(head=64, spread=4.0))
    tensors = on(device, q, k_cache, v_cache, table, lens)
    with pytest.raises(ValueError, match="mma: the FP8 MMA kernel"):
        kernel.launch_paged_decode(*tensors, scale, 1, *on(device, k_scale, v_scale), mma=True)
