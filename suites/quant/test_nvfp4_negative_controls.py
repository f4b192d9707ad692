"""Negative controls: bugs planted in the NVFP4 kernel that the suite's checks must catch.

Each fault is compiled into the real kernel through a constexpr (`kernels.nvfp4.FAULTS`), and each check
below is the same function the parity suite runs. If a check stops failing on its fault, the suite has
lost the power to find that class of bug.
"""

from __future__ import annotations

import pytest

from reference.quant.nvfp4_global_scale import EncodeScale
from suites.quant import fp4_checks, mxfp4_cases
from suites.quant import nvfp4_cases as cases
from suites.quant.test_nvfp4 import check_named_cases, check_quantize

kernel = pytest.importorskip("kernels.nvfp4")


def faulty(fault: str):
    def quantize(x, global_scale):
        return kernel.launch_quantize(x, global_scale.to_encode().value, fault=fault)

    return quantize


def near_midpoint_check(device, quantize):
    check_quantize(cases.near_midpoints(), EncodeScale(1.0), device, quantize)


def double_rounding_check(device, quantize):
    check_quantize(cases.double_rounding_blocks(), EncodeScale(1.0), device, quantize)


def bf16_sweep_check(device, quantize):
    check_quantize(mxfp4_cases.all_bf16_patterns(0).view(-1, 64), EncodeScale(1.0), device, quantize)


CONTROLS = [
    # (fault, check that must catch it, what the failure proves)
    ("drop_sticky", near_midpoint_check, "fp32 0.25+ulp probes expose a converter without a sticky bit"),
    ("swap_nibbles", check_named_cases, "named expected bytes pin the nibble order"),
    ("swap_nibbles", bf16_sweep_check, "any mixed block exposes swapped nibbles"),
    ("fused_product", double_rounding_check, "products rounding onto a midpoint pin the two roundings"),
    ("fused_product", check_named_cases, "the named double-rounding block pins them too"),
]


@pytest.mark.parametrize(("fault", "check", "why"), CONTROLS, ids=fp4_checks.control_ids(CONTROLS))
def test_suite_catches_planted_bug(fault, check, why, device):
    fp4_checks.assert_control_caught(check, device, faulty(fault))


def test_fused_product_is_invisible_to_power_of_two_block_scales(device):
    """With exact products (r a power of two) one rounding equals two: why the double-rounding probes exist."""
    near_midpoint_check(device, faulty("fused_product"))


@pytest.mark.parametrize("check", [near_midpoint_check, double_rounding_check, check_named_cases, bf16_sweep_check])
def test_checks_pass_without_a_fault(check, device):
    check(device, faulty("none"))
