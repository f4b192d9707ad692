"""Split-K's sum (`kernels.split_k.sum_splits`): the fp32 partials added in split order and rounded once, bit
for bit, for each output dtype the GEMMs use; and the split arithmetic of the launchers.

Negative control: the same partials added in another order must give other bytes for the data used here, so
the equality test below is one that an order change would fail."""

from __future__ import annotations

import pytest
import torch

from kernels.split_k import fill_splits, launch_split, sum_splits


def partials(splits: int, m: int, n: int, device: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(splits * 1000 + m * 10 + n)
    # Magnitudes 2**-10 .. 2**10 with cancellation, so that the order of the fp32 adds shows in the bits.
    values = torch.randn(splits, m, n, generator=g) * torch.exp2(torch.randint(-10, 11, (splits, m, n), generator=g))
    return values.to(device)


def in_order(p: torch.Tensor, dtype: torch.dtype, order=None) -> torch.Tensor:
    total = None
    for s in order if order is not None else range(p.shape[0]):
        total = p[s].clone() if total is None else total + p[s]
    return total.to(dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize(("splits", "m", "n"), [(2, 1, 7), (3, 5, 300), (8, 2, 1500)])
def test_sum_is_in_split_order(splits, m, n, dtype, device):
    p = partials(splits, m, n, device)
    out = torch.empty(m, n, dtype=dtype, device=device)
    assert sum_splits(p, out) is out
    assert torch.equal(out.cpu(), in_order(p.cpu(), dtype))


def test_empty_output(device):
    out = torch.empty(0, 4, dtype=torch.bfloat16, device=device)
    assert sum_splits(torch.empty(2, 0, 4, device=device), out).numel() == 0


@pytest.mark.parametrize(
    ("k_tiles", "asked", "want"), [(10, 1, (1, 10)), (10, 4, (4, 3)), (10, 6, (5, 2)), (3, 8, (3, 1))]
)
def test_split_arithmetic(k_tiles, asked, want):
    """At least one K tile a split, no empty split: 10 tiles asked in 6 splits are 5 of 2."""
    assert launch_split(k_tiles, asked) == want


@pytest.mark.parametrize(
    ("tiles", "sms", "most", "want"),
    [(32, 132, 64, 4), (16, 132, 64, 8), (112, 132, 64, 1), (200, 132, 64, 1), (1, 132, 6, 6), (0, 132, 3, 3)],
)
def test_splits_that_fill_the_sms(tiles, sms, most, want):
    """One program an SM: 32 tiles of 8192 outputs on 132 SMs take 4 splits, 16 take 8; more tiles than SMs take
    none; never past `most` (the K tiles there are)."""
    assert fill_splits(tiles, sms, most) == want


def test_negative_control_order_shows_in_the_bytes():
    p = partials(8, 2, 1500, "cpu")
    forward = in_order(p, torch.float32)
    assert not torch.equal(forward, in_order(p, torch.float32, order=range(7, -1, -1)))
