"""The FP8-cache decode's MMA kernel (`kernels.paged_decode_fp8_mma`, the op's FP8 split kernel where its PTX runs:
NVIDIA sm_90+, head 128, groups up to 8, blocks of a multiple of 16 tokens).

Every tier: its PTX blocks, run by the numpy PTX interpreter (suites/ptx_subset.py) for whole warps, against the
layout its docstring states (the score block computes K . q over the permuted head dim, the P block transposes
the score fragment into the next MMA's B fragment, the PV block's prmt gives V^T's A fragment, the q block scales
and rounds), with small-integer operands so every sum is exact; a planted byte-selector swap must fail.
GPU (sm_90+): the kernel against `reference.attention.paged` through the ("paged_decode", dtype) rows, forced on
(`mma=True`) at every launch shape it can take: drawn problems, ragged and empty warps (sequences shorter than one
warp's tokens), split counts, group sizes 1..8, q and V scales far outside fp16's range, the planted block-table
off-by-one. Where the op takes it is `takes_mma`, checked on both sides of each bound."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kernels import paged_decode_fp8_mma as mma
from kernels._packed_ptx import packed_ptx
from kernels.tolerances import assert_lossy, families
from reference.attention import paged as ref
from suites import ptx_subset
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


# ---- the PTX blocks on the CPU tier: one or two warps through the numpy PTX interpreter ----
WARPS = 2
LANE = np.arange(32 * WARPS) % 32
G, C = LANE // 4, LANE % 4


def _e4m3(values: np.ndarray) -> np.ndarray:
    """E4M3 codes (uint8) of small integers (exact)."""
    return values.astype(np.float32).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)


def _words(byte_rows: np.ndarray) -> np.ndarray:
    """[lanes, 4n] bytes -> [lanes, n] little-endian uint32 words."""
    return np.ascontiguousarray(byte_rows).view(np.uint32)


def _fp16_words(values: np.ndarray) -> np.ndarray:
    """[lanes, 2n] values -> [lanes, n] words of fp16 pairs (element 2i in the low half; past fp16's range: Inf)."""
    with np.errstate(over="ignore"):
        return np.ascontiguousarray(values.astype(np.float16)).view(np.uint32)


def _f32(bits: np.ndarray) -> np.ndarray:
    return bits.astype(np.uint32).view(np.float32)


def _scores(qk_ptx: str, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(got [warps, lanes, 4], want [warps, 16 tokens, 8 heads]) of the score block on random integer K and q."""
    k = rng.integers(-8, 9, (WARPS, 16, 128))
    q = rng.integers(-4, 5, (WARPS, 8, 128))
    w = np.arange(32 * WARPS) // 32
    byte = 32 * C[:, None] + np.arange(32)[None, :]  # lane (g, c): bytes 32c .. 32c + 31 of its rows
    k_g = _words(_e4m3(k[w[:, None], G[:, None], byte]))
    k_h = _words(_e4m3(k[w[:, None], G[:, None] + 8, byte]))
    q_w = _fp16_words(q[w[:, None], G[:, None], byte])
    args = {4 + j: k_g[:, j] for j in range(8)} | {12 + j: k_h[:, j] for j in range(8)}
    args |= {20 + m: q_w[:, m] for m in range(16)} | {i: np.zeros(32 * WARPS, np.uint32) for i in range(4)}
    out = ptx_subset.run(qk_ptx, args)
    got = np.stack([_f32(out[i]) for i in range(4)], axis=-1).reshape(WARPS, 32, 4)
    return got, np.einsum("wtd,whd->wth", k, q)


def test_score_block_is_k_dot_q_in_the_fragment_layout():
    """Lane (g, c) gets S^T at tokens (g, g + 8) x heads (2c, 2c + 1): the head-dim permutation is consistent."""
    got, want = _scores(mma.QK_PTX.value, np.random.default_rng(0))
    g, c = np.arange(32) // 4, np.arange(32) % 4
    for i, (token, head) in enumerate(((g, 2 * c), (g, 2 * c + 1), (g + 8, 2 * c), (g + 8, 2 * c + 1))):
        assert np.array_equal(got[:, :, i], want[:, token, head]), f"score register {i}"


def _pv(pv_ptx: str, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(got [warps, lanes, 32], want [warps, 8 heads, 128]) of the P block then the PV block (accumulators from 0)
    on random V codes and p values that fp16 holds exactly."""
    v = rng.integers(-8, 9, (WARPS, 16, 128))
    p = rng.integers(0, 9, (WARPS, 16, 8)) / 8.0  # [token, head]
    w = np.arange(32 * WARPS) // 32
    pv_in = {
        2: p[w, G, 2 * C], 3: p[w, G, 2 * C + 1], 4: p[w, G + 8, 2 * C], 5: p[w, G + 8, 2 * C + 1],
    }  # fmt: skip
    frag = ptx_subset.run(mma.P_PTX.value, {i: x.astype(np.float32).view(np.uint32) for i, x in pv_in.items()})
    byte = 16 * G[:, None] + np.arange(16)[None, :]  # lane (g, c): bytes 16g .. 16g + 15 of its four tokens
    rows = [_words(_e4m3(v[w[:, None], (2 * C + r % 2 + 8 * (r // 2))[:, None], byte])) for r in range(4)]
    acc = []
    for word in range(4):
        args = {8 + r: rows[r][:, word] for r in range(4)} | {12: frag[0], 13: frag[1]}
        args |= {14 + i: np.zeros(32 * WARPS, np.uint32) for i in range(8)}
        out = ptx_subset.run(pv_ptx, args)
        acc += [_f32(out[i]) for i in range(8)]
    return np.stack(acc, axis=-1).reshape(WARPS, 32, 32), np.einsum("wth,wtd->whd", p, v)


def _check_pv(pv_ptx: str) -> None:
    got, want = _pv(pv_ptx, np.random.default_rng(1))
    g, c = np.arange(32) // 4, np.arange(32) % 4
    for k in range(32):  # accumulator 4i + r: head 2c + r % 2, d 16g + 2i + r // 2
        i, r = divmod(k, 4)
        assert np.array_equal(got[:, :, k], want[:, 2 * c + r % 2, 16 * g + 2 * i + r // 2]), f"accumulator {k}"


def test_p_and_pv_blocks_are_p_times_v_in_the_fragment_layout():
    """movmatrix turns the score fragment's p into the B fragment, prmt V's bytes into A fragments: lane (g, c)'s
    accumulator 4i + r is O at head 2c + r % 2 and d 16g + 2i + r // 2."""
    _check_pv(mma.PV_PTX.value)


def test_planted_byte_selector_swap_is_caught():
    """Negative control: token pairs (2c, 2c + 1) of the first M-tile swapped in the byte selector."""
    with pytest.raises(AssertionError, match="accumulator"):
        _check_pv(mma.PV_PTX.value.replace("0x5140", "0x4051"))


def test_q_block_scales_and_rounds_a_bf16_pair():
    """A bf16 pair times a power of two, each rounded to nearest even into fp16, low element in the low half."""
    lo = np.array([1.0, -3.5, 1.0 + 2**-7, 6e4, 2**-20], np.float32)
    hi = np.array([0.5, 2.0**-3, -(1.0 + 3 * 2**-7), -1.0, 3.0], np.float32)
    word = (lo.astype(ml_dtypes.bfloat16).view(np.uint16).astype(np.uint32)) | (
        hi.astype(ml_dtypes.bfloat16).view(np.uint16).astype(np.uint32) << 16
    )
    down = np.full(5, 2.0**3, np.float32).view(np.uint32)
    got = ptx_subset.run(mma.Q_PTX.value, {0: np.zeros(5, np.uint32), 1: word, 2: down})[0]
    want = _fp16_words(np.stack([lo * 8.0, hi * 8.0], axis=-1).astype(np.float32))[:, 0]
    assert np.array_equal(got, want)
