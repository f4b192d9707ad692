"""The FP8-cache decode's parts on their own: the e4m3 -> fp16 word decoder (every code against ml_dtypes, on
the PTX and the portable path, each where it runs), `fp16_range` at named values, q and V scales far outside
fp16's range through the whole kernel (the powers of two that bring them into range must come back out
exactly), and the launch boundary's check that the codes can be read as whole words."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from kernels._e4m3 import e4m3_words_to_fp16, fp16_range
from kernels._packed_ptx import packed_ptx
from kernels.tolerances import assert_lossy, families
from reference.attention import paged as ref
from suites.attention.paged_cases import build_fp8, fixed, make_cache, on

kernel = pytest.importorskip("kernels.paged_decode")


@triton.jit
def _decode_words(words_ptr, out_ptr, PTX: tl.constexpr):
    words = tl.load(words_ptr + tl.arange(0, 64))[None, :]
    tl.store(out_ptr + tl.arange(0, 256)[None, :], e4m3_words_to_fp16(words, PTX))


@pytest.mark.parametrize("ptx", [False, True], ids=["portable", "ptx"])
def test_every_code_decodes_to_its_fp16(ptx, device):
    """Codes 0..255 packed four to a word, code i in byte i % 4 of word i // 4: output i is code i's value
    (ml_dtypes), bit for bit, -0.0 at 0x80 and NaN at 0x7F / 0xFF included."""
    if ptx and not packed_ptx(torch.device(device)):
        pytest.skip("the packed PTX runs on NVIDIA sm_90 and later only")
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    want = torch.from_numpy(codes.numpy().view(ml_dtypes.float8_e4m3fn).astype(np.float16))
    out = torch.empty(256, dtype=torch.float16, device=device)
    _decode_words[(1,)](codes.view(torch.int32).to(device), out, PTX=ptx)
    got = out.cpu()
    nan = want.isnan()
    assert nan.sum() == 2 and torch.equal(got.isnan(), nan)
    assert torch.equal(got[~nan].view(torch.int16), want[~nan].view(torch.int16))


@triton.jit
def _ranges(x_ptr, down_ptr, up_ptr):
    i = tl.arange(0, 8)
    down, up = fp16_range(tl.load(x_ptr + i))
    tl.store(down_ptr + i, down)
    tl.store(up_ptr + i, up)


def test_fp16_range_named_values(device):
    """down puts the value in [2**14, 2**15); zero and subnormals get the largest normal power 2**126; up is
    1 / down exactly."""
    x = torch.tensor([1.0, 1.5, 2.0**15, 65504.0, 0.0, 2.0**-149, 3e38, 2.0**-20])
    want = torch.tensor([2.0**14, 2.0**14, 0.5, 0.5, 2.0**126, 2.0**126, 2.0**-113, 2.0**34])
    down, up = (torch.empty(8, device=device) for _ in range(2))
    _ranges[(1,)](x.to(device), down, up)
    assert torch.equal(down.cpu(), want)
    assert torch.equal(up.cpu(), 1.0 / want)
    scaled = x[:4] * want[:4]
    assert ((scaled >= 2.0**14) & (scaled < 2.0**15)).all()


def _problem(dtype: torch.dtype, spread: float, group: int = 4) -> dict:
    return fixed(dtype=dtype, kv_heads=2, group=group, seq_lens=[150, 37], num_splits=2, seed=21, spread=spread)


@pytest.mark.parametrize("q_scale", [2.0**20, 2.0**-20], ids=["q-huge", "q-tiny"])
def test_bf16_q_far_outside_fp16_range(q_scale, device):
    """A bf16 q of magnitude 2**20 would overflow fp16 and one of 2**-20 would lose most of its bits in fp16's
    subnormals: the kernel must scale q into fp16's range and the score back, so the output stays within the
    table's row against the mirror and the ideal (a kernel that casts q straight to fp16 returns NaN or noise)."""
    q, k_cache, v_cache, table, lens, scale, k_scale, v_scale = build_fp8(_problem(torch.bfloat16, 2.0))
    q = (q.float() * q_scale).bfloat16()
    scale = scale / q_scale  # the same softmax, whatever q's magnitude
    mirror = ref.paged_decode_mirror(q, k_cache, v_cache, table, lens, scale, 2, k_scale, v_scale)
    ideal = ref.paged_attention_ideal(q, k_cache, v_cache, table, lens, scale, k_scale=k_scale, v_scale=v_scale)
    got = kernel.launch_paged_decode(
        *on(device, q, k_cache, v_cache, table, lens), scale, 2, *on(device, k_scale, v_scale)
    )
    assert_lossy(families.PAGED_DECODE, got.cpu(), mirror, ideal, f"q x {q_scale}")


@pytest.mark.parametrize("group", [4, 16], ids=["group4", "group16"])
@pytest.mark.parametrize("factor", [2.0**24, 2.0**-24], ids=["v-huge", "v-tiny"])
def test_v_scales_far_outside_fp16_range(factor, group, device):
    """A bf16 decode with every V scale times 2**24 or 2**-24 (as if V were that large or small): p * v_scale
    would overflow fp16 or vanish in it, so it must be rounded in each tile's own power-of-two range and
    scaled back after the MMA (a kernel rounding p * v_scale in fp16 as it stands returns Inf/NaN or zeros).
    bf16 only: an fp16 decode's output itself cannot hold such values. Group 4 carries the tile's largest V
    scale in a padding row of the softmax max; group 16 has none and reduces the scales on their own."""
    q, k_cache, v_cache, table, lens, scale, k_scale, v_scale = build_fp8(_problem(torch.bfloat16, 4.0, group))
    v_scale = v_scale * factor
    mirror = ref.paged_decode_mirror(q, k_cache, v_cache, table, lens, scale, 2, k_scale, v_scale)
    ideal = ref.paged_attention_ideal(q, k_cache, v_cache, table, lens, scale, k_scale=k_scale, v_scale=v_scale)
    got = kernel.launch_paged_decode(
        *on(device, q, k_cache, v_cache, table, lens), scale, 2, *on(device, k_scale, v_scale)
    )
    assert_lossy(families.PAGED_DECODE, got.cpu(), mirror, ideal, f"v_scale x {factor}")


def test_fp8_cache_needs_whole_words(device):
    """Head size 30 is not a whole number of 4-code words: a one-line ValueError naming the cache."""
    k_cache, v_cache = make_cache(16, 1, 30, torch.float8_e4m3fn, 2)
    scales = torch.ones(2, 16, 1)
    q = torch.ones(1, 2, 30, dtype=torch.bfloat16)
    table, lens = torch.tensor([[0, 1]], dtype=torch.int32), torch.tensor([5], dtype=torch.int32)
    with pytest.raises(ValueError, match="k_cache: an FP8 cache is read in 4-byte words"):
        kernel.launch_paged_decode(*on(device, q, k_cache, v_cache, table, lens), 0.2, 1, *on(device, scales, scales))
