"""Negative controls: bugs planted in the MXFP4 kernel that the suite's checks must catch.

Each fault is compiled into the real kernel through a constexpr (`kernels.mxfp4.FAULTS`), and each check
below is the same function the parity suite runs. If a check stops failing on its fault, the suite has lost
the power to find that class of bug.
"""

from __future__ import annotations

import pytest

from suites.quant import fp4_checks
from suites.quant import mxfp4_cases as cases
from suites.quant.test_mxfp4 import check_amax_mantissas, check_named_cases, check_quantize

kernel = pytest.importorskip("kernels.mxfp4")


def faulty(fault: str):
    def quantize(x, *, scale_mode="floor"):
        return kernel.launch_quantize(x, scale_mode, fault=fault)

    return quantize


def near_midpoint_check(device, quantize):
    for mode in ("floor", "rceil"):
        check_quantize(cases.near_midpoints(), mode, device, quantize)


def bf16_sweep_check(device, quantize):
    check_quantize(cases.all_bf16_patterns(0), "floor", device, quantize)


CONTROLS = [
    # (fault, check that must catch it, what the failure proves)
    ("drop_sticky", near_midpoint_check, "fp32 0.25+ulp probes expose a converter without a sticky bit"),
    ("swap_nibbles", check_named_cases, "named expected bytes pin the nibble order"),
    ("swap_nibbles", bf16_sweep_check, "any mixed block exposes swapped nibbles"),
    ("rceil_at_1_5", check_amax_mantissas, "amax mantissa 1.5 sits exactly on the rceil threshold"),
]


@pytest.mark.parametrize(("fault", "check", "why"), CONTROLS, ids=fp4_checks.control_ids(CONTROLS))
def test_suite_catches_planted_bug(fault, check, why, device):
    fp4_checks.assert_control_caught(check, device, faulty(fault))


def test_drop_sticky_is_invisible_to_bf16_data(device):
    """The sticky-bit bug hides from bf16 inputs (<= 8 significant bits): why the fp32 probes exist."""
    bf16_sweep_check(device, faulty("drop_sticky"))


@pytest.mark.parametrize("check", [near_midpoint_check, check_named_cases, check_amax_mantissas, bf16_sweep_check])
def test_checks_pass_without_a_fault(check, device):
    check(device, faulty("none"))
