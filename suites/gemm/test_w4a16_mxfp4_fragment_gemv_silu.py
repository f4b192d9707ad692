"""The W4A16 MXFP4 GEMV with SiLU-and-multiply in its store (`kernels.w4a16_mxfp4_fragment_gemv`'s
`w4a16_mxfp4_fragment_gemv_silu_and_mul`, the decode step's gate/up projection and activation in one launch).

Its contract is a composition of two ops the suites check on their own (`test_w4a16_mxfp4_fragment_gemv` against
the W4A16 mirror, `suites/activation` against the SiLU reference): the fused result equals, bit for bit,
`kernels.silu_and_mul` over the unfused op's [M, 2I] product on the same path. On a GPU that runs the PTX, the
GEMV path (M up to GEMV_MAX_M: one and two column groups, ragged) is the fused kernel, and its planted bug (the
up tile taken as the gate) must break the equality; above GEMV_MAX_M, and on every other tier, the op composes
the tiled GEMM and the SiLU kernel. Named values pin the arithmetic: exact products that SiLU maps to known
bf16 bytes. opcheck and argument checks on every tier.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kernels._packed_ptx import packed_ptx
from kernels.tolerances import assert_exact
from suites.gemm.test_w4a16_mxfp4_gemm import quantized_weights
from suites.quant.mxfp4_cases import random_blocks

layout = pytest.importorskip("kernels.mxfp4_fragment_layout")
kernel = pytest.importorskip("kernels.w4a16_mxfp4_fragment_gemv")
silu = pytest.importorskip("kernels.silu_and_mul")


def weights(inter: int, k: int, seed: int, device):
    """Gate rows then up rows (`inter` each) as fragment words and pairs on `device`."""
    _, codes, scales = quantized_weights(2 * inter, k, seed, 6.0, 0, "floor")
    words, pairs = layout.prepare(codes, scales)
    return words.to(device), pairs.to(device)


def composed(x, words, pairs, gemv):
    """The unfused op's product on the same path, then the SiLU kernel."""
    return silu.launch_silu_and_mul(kernel.launch(x, words, pairs, gemv=gemv))


def gemv_path(device, m: int) -> bool:
    return packed_ptx(torch.device(device)) and m <= kernel.GEMV_MAX_M


@given(
    m=st.sampled_from([1, 2, 7, 8, 9, 16, 17]),
    tiles=st.integers(1, 3),
    steps=st.integers(1, 5),
    seed=st.integers(0, 2**31 - 1),
    scale=st.sampled_from([2.0**-6, 1.0, 8.0]),
)
def test_equals_the_gemv_then_silu(m, tiles, steps, seed, scale, device):
    inter, k = 16 * tiles, 64 * steps
    words, pairs = weights(inter, k, seed, device)
    x = (random_blocks((m, k), torch.float32, seed + 1, 2.0) * scale).to(torch.bfloat16).to(device)
    got = kernel.w4a16_mxfp4_fragment_gemv_silu_and_mul(x, words, pairs)
    assert got.shape == (m, inter) and got.dtype == torch.bfloat16
    want = composed(x, words, pairs, gemv_path(device, m))
    assert_exact(got.cpu(), want.cpu(), f"M = {m}, I = {inter}, K = {k}")


def test_named_values(device):
    """Row 0 of gate and up: weights 1.0 at K index 0 (others 0), x[0] = v: the product is v exactly, and
    silu(v) * v rounds to the bf16 given: silu(0) * 0 = 0, silu(2) * 2 = 3.5232 -> 0x4061 (3.515625),
    silu(-2) * -2 = 0.4768 -> 0x3EF4 (0.4765625), silu(0.5) * 0.5 = 0.1555 -> 0x3E1F (fp32 arithmetic, one rounding)."""
    codes = torch.zeros(32, 32, dtype=torch.uint8)
    codes[0, 0] = 0x02  # E2M1 1.0 in the low nibble: element 0 of gate row 0
    codes[16, 0] = 0x02  # and of up row 0
    scales = torch.full((32, 2), 127, dtype=torch.uint8)
    words, pairs = (t.to(device) for t in layout.prepare(codes, scales))
    for v, want in ((0.0, 0x0000), (2.0, 0x4061), (-2.0, 0x3EF4), (0.5, 0x3E1F)):
        x = torch.zeros(1, 64, dtype=torch.bfloat16)
        x[0, 0] = v
        got = kernel.w4a16_mxfp4_fragment_gemv_silu_and_mul(x.to(device), words, pairs).cpu()
        assert got[0, 0].view(torch.int16).item() & 0xFFFF == want, f"x = {v}: {got[0, 0].item()}"
        assert (got[0, 1:] == 0).all()


def test_planted_bug_is_caught(device):
    if not packed_ptx(torch.device(device)):
        pytest.skip("the fused store lives in the GEMV's PTX path (NVIDIA sm_90+)")
    words, pairs = weights(32, 256, 3, device)
    x = random_blocks((3, 256), torch.bfloat16, 4, 2.0).to(device)
    want = composed(x, words, pairs, True)
    assert torch.equal(kernel.launch(x, words, pairs, silu_and_mul=True), want)
    assert not torch.equal(kernel.launch(x, words, pairs, silu_and_mul=True, fault="gate_up_swapped"), want)


@pytest.mark.parametrize("m", [2, 17])
def test_opcheck(device, m):
    words, pairs = weights(16, 64, 5, device)
    x = random_blocks((m, 64), torch.bfloat16, 6, 2.0).to(device)
    torch.library.opcheck(torch.ops.touchstone.w4a16_mxfp4_fragment_gemv_silu_and_mul.default, (x, words, pairs))


def test_odd_tile_count_is_refused():
    _, codes, scales = quantized_weights(48, 64, 7, 2.0, 0, "floor")  # 3 tiles: no whole gate and up halves
    words, pairs = layout.prepare(codes, scales)
    with pytest.raises(ValueError, match="words: silu_and_mul takes gate and up halves"):
        kernel.w4a16_mxfp4_fragment_gemv_silu_and_mul(torch.zeros(1, 64, dtype=torch.bfloat16), words, pairs)
