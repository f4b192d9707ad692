"""The tolerance policy itself: lossy checks measure finite entries and demand exact non-finite agreement."""

from __future__ import annotations

import pytest
import torch

from bench.correctness import lossy_check
from suites.tolerances import LOSSY, LossyBound, assert_agree, assert_lossy, lossy_metrics

FAMILY = "tolerance_selftest"
INF, NAN = float("inf"), float("nan")


@pytest.fixture(autouse=True)
def _row(monkeypatch):
    monkeypatch.setitem(LOSSY, (FAMILY, torch.float32), LossyBound(1e-3, 1e-3, 20.0, "self-test row"))


def test_equal_infinities_and_nans_are_not_errors():
    x = torch.tensor([INF, -INF, NAN, 1.0, -2.0])
    assert assert_lossy(FAMILY, x, x, x.double()).max_rel == 0.0
    assert lossy_check(FAMILY)(x, x).startswith("close")


@pytest.mark.parametrize("got", [[-INF, -INF, NAN, 1.0, -2.0], [INF, -INF, 0.0, 1.0, -2.0], [INF, 5.0, NAN, 1.0, -2.0]])
def test_nonfinite_disagreement_fails_both_checks(got):
    want = torch.tensor([INF, -INF, NAN, 1.0, -2.0])
    got = torch.tensor(got)
    with pytest.raises(AssertionError, match="positions differ"):
        assert_lossy(FAMILY, got, want, want.double())
    assert lossy_check(FAMILY)(got, want).startswith("mismatch")


def test_bounds_fail_on_finite_error():
    want = torch.tensor([1.0, 2.0, 4.0])
    got = want + torch.tensor([0.0, 0.0, 0.1])
    with pytest.raises(AssertionError, match="max_rel"):
        assert_lossy(FAMILY, got, want, want.double())
    assert lossy_check(FAMILY)(got, want).startswith("mismatch: max_rel")
    assert lossy_metrics(got, want, want).max_rel == pytest.approx(0.1 / 4)


def test_agreement_rows_fail_on_an_order_one_difference():
    want = torch.tensor([1.0, -2.0, 3.0], dtype=torch.float64)
    assert_agree("ssd_orders", want + 1e-14, want, "ulps")  # inside 1e-12 x 3
    with pytest.raises(AssertionError, match="ssd_orders"):
        assert_agree("ssd_orders", want + 1e-9, want, "drift")
    with pytest.raises(AssertionError, match="shape"):
        assert_agree("ssd_orders", want[:2], want, "shape")
