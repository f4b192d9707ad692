"""The tolerance policy itself: one bit-exact rule for asserts and verdicts; lossy checks measure finite entries
and demand exact non-finite agreement."""

from __future__ import annotations

import pytest
import torch

from kernels.tolerances import (
    LOSSY,
    LossyBound,
    assert_agree,
    assert_exact,
    assert_lossy,
    exact_verdict,
    lossy_metrics,
    lossy_verdict,
)

FAMILY = "tolerance_selftest"
INF, NAN = float("inf"), float("nan")


@pytest.fixture(autouse=True)
def _row(monkeypatch):
    monkeypatch.setitem(LOSSY, (FAMILY, torch.float32), LossyBound(1e-3, 1e-3, 20.0, "self-test row"))


def test_equal_infinities_and_nans_are_not_errors():
    x = torch.tensor([INF, -INF, NAN, 1.0, -2.0])
    assert assert_lossy(FAMILY, x, x, x.double()).max_rel == 0.0
    assert lossy_verdict(FAMILY, (x,), (x,)).startswith("close")


@pytest.mark.parametrize("got", [[-INF, -INF, NAN, 1.0, -2.0], [INF, -INF, 0.0, 1.0, -2.0], [INF, 5.0, NAN, 1.0, -2.0]])
def test_nonfinite_disagreement_fails_both_checks(got):
    want = torch.tensor([INF, -INF, NAN, 1.0, -2.0])
    got = torch.tensor(got)
    with pytest.raises(AssertionError, match="positions differ"):
        assert_lossy(FAMILY, got, want, want.double())
    assert lossy_verdict(FAMILY, (got,), (want,)).startswith("mismatch")


def test_bounds_fail_on_finite_error():
    want = torch.tensor([1.0, 2.0, 4.0])
    got = want + torch.tensor([0.0, 0.0, 0.1])
    with pytest.raises(AssertionError, match="max_rel"):
        assert_lossy(FAMILY, got, want, want.double())
    assert lossy_verdict(FAMILY, (got,), (want,)).startswith("mismatch: max_rel")
    assert lossy_metrics(got, want, want).max_rel == pytest.approx(0.1 / 4)


def test_agreement_rows_fail_on_an_order_one_difference():
    want = torch.tensor([1.0, -2.0, 3.0], dtype=torch.float64)
    assert_agree("ssd_orders", want + 1e-14, want, "ulps")  # inside 1e-12 x 3
    with pytest.raises(AssertionError, match="ssd_orders"):
        assert_agree("ssd_orders", want + 1e-9, want, "drift")
    with pytest.raises(AssertionError, match="shape"):
        assert_agree("ssd_orders", want[:2], want, "shape")


def _with_payload(bits: int) -> torch.Tensor:
    return torch.tensor([bits], dtype=torch.int32).view(torch.float32)


def test_one_exact_rule_nan_payloads_are_equal_signed_zeros_are_not():
    quiet, other = _with_payload(0x7FC00000), _with_payload(-0x003FFFFF)  # 0xFFC00001: sign set, payload 1
    assert torch.isnan(quiet).all() and torch.isnan(other).all()
    assert_exact(other, quiet)  # NaN positions agree; payload and sign of a NaN carry no meaning
    assert exact_verdict((other,), (quiet,)) == "exact"
    neg, pos = torch.tensor([-0.0]), torch.tensor([0.0])
    with pytest.raises(AssertionError, match="not bit-exact"):
        assert_exact(neg, pos)
    assert exact_verdict((neg,), (pos,)) == "mismatch 1/1"
    with pytest.raises(AssertionError, match="not bit-exact"):
        assert_exact(quiet, pos)
    assert exact_verdict((quiet,), (pos,)) == "mismatch 1/1"


def test_one_exact_rule_integer_codes_compare_every_byte():
    # E4M3's NaN is the byte 0x7F: encoded outputs are integers, so a different NaN byte is a mismatch.
    got, want = torch.tensor([0x7F, 0xFF], dtype=torch.uint8), torch.tensor([0x7F, 0x7F], dtype=torch.uint8)
    with pytest.raises(AssertionError, match="1 of 2 differ"):
        assert_exact(got, want)
    assert exact_verdict((got,), (want,)) == "mismatch 1/2"
