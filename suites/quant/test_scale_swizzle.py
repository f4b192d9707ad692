"""The 128x4 scale swizzle: offsets by the published formula, its inverse, padding, and an independent check
(vLLM's `recover_swizzled_scales` reshape/permute) that the layout is the one the kernels read."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kernels.tolerances import assert_exact
from reference.quant.scale_swizzle import (
    PAD_BYTE,
    swizzle_scales_128x4,
    swizzled_offsets,
    swizzled_shape,
    unswizzle_scales_128x4,
)


def recover_swizzled_scales(swizzled: torch.Tensor) -> torch.Tensor:
    """vLLM tests' unswizzle: reshape(1, Mp/128, Sp/4, 32, 4, 4).permute(0, 1, 4, 3, 2, 5) -> [Mp, Sp]."""
    mp, sp = swizzled.shape
    tiles = swizzled.reshape(1, mp // 128, sp // 4, 32, 4, 4).permute(0, 1, 4, 3, 2, 5)
    return tiles.reshape(mp, sp)


def random_scales(m: int, s: int, seed: int) -> torch.Tensor:
    return torch.randint(1, 256, (m, s), generator=torch.Generator().manual_seed(seed), dtype=torch.uint8)


@given(m=st.integers(1, 300), s=st.integers(1, 20), seed=st.integers(0, 2**31 - 1))
def test_inverse_and_recover_identity(m, s, seed):
    scales = random_scales(m, s, seed)
    swizzled = swizzle_scales_128x4(scales)
    mp, sp = swizzled_shape(m, s)
    assert tuple(swizzled.shape) == (mp, sp) and mp % 128 == 0 and sp % 4 == 0 and mp - m < 128 and sp - s < 4
    assert_exact(unswizzle_scales_128x4(swizzled, m, s), scales, "unswizzle(swizzle(x))")
    recovered = recover_swizzled_scales(swizzled)
    assert_exact(recovered[:m, :s], scales, "recover_swizzled_scales")
    padding = torch.ones(mp, sp, dtype=torch.bool)
    padding[:m, :s] = False
    assert (recovered[padding] == PAD_BYTE).all(), "padding rows and columns hold PAD_BYTE"


def test_named_offsets():
    """Hand-computed offsets from (mTile * numKTiles + kTile) << 9 | (m%32) << 4 | ((m/32)%4) << 2 | (k%4)."""
    offsets = swizzled_offsets(256, 8)  # 2 row tiles x 2 column tiles
    cases = {
        (0, 0): 0,
        (0, 3): 3,
        (1, 0): 16,
        (31, 0): 496,
        (32, 0): 4,
        (96, 1): 13,
        (33, 2): 22,
        (0, 4): 512,
        (127, 7): 512 + 31 * 16 + 3 * 4 + 3,
        (128, 0): 1024,
        (255, 7): 2047,
    }
    for (row, col), want in cases.items():
        assert int(offsets[row, col]) == want, f"offset of ({row}, {col})"
    assert torch.equal(offsets.flatten().sort().values, torch.arange(256 * 8)), "a permutation"


def test_one_16_byte_line_holds_rows_32_apart():
    scales = torch.arange(128 * 4, dtype=torch.int32).view(128, 4).to(torch.uint8)  # row r, col c -> 4r + c (mod 256)
    line = swizzle_scales_128x4(scales).flatten()[16:32]  # the second 16-byte line: m % 32 == 1
    rows = [1, 33, 65, 97]
    want = torch.tensor([(4 * r + c) % 256 for r in rows for c in range(4)], dtype=torch.uint8)
    assert_exact(line, want, "line 1 = columns 0..3 of rows 1, 33, 65, 97")


def test_fp8_scales_keep_their_dtype():
    scales = random_scales(130, 6, 3).view(torch.float8_e4m3fn)
    swizzled = swizzle_scales_128x4(scales)
    assert swizzled.dtype == torch.float8_e4m3fn
    assert_exact(swizzled.view(torch.uint8), swizzle_scales_128x4(scales.view(torch.uint8)))


def test_bad_input_is_refused_by_name():
    with pytest.raises(ValueError, match="scales: must be 2-D"):
        swizzle_scales_128x4(torch.zeros(2, 3, 4, dtype=torch.uint8))
    with pytest.raises(TypeError, match="scales: must hold 1-byte scales"):
        swizzle_scales_128x4(torch.zeros(2, 3))
    with pytest.raises(ValueError, match=r"swizzled: shape .* is not the swizzled shape"):
        unswizzle_scales_128x4(torch.zeros(128, 4, dtype=torch.uint8), 129, 4)
