"""E2M1, E8M0 and nibble packing against ml_dtypes and the named byte values of the spec."""

from __future__ import annotations

import numpy as np
import torch

from kernels.tolerances import assert_exact
from reference.formats.e2m1 import E2M1_MAGNITUDES, decode_e2m1, encode_e2m1
from reference.formats.e8m0 import decode_e8m0
from reference.formats.nibbles import pack_nibbles, unpack_nibbles
from suites import oracles
from suites.quant.mxfp4_cases import all_bf16_patterns


def test_e2m1_decode_all_codes_matches_ml_dtypes():
    codes = torch.arange(16, dtype=torch.uint8)
    assert_exact(decode_e2m1(codes), torch.from_numpy(oracles.e2m1_values(codes.numpy())))
    assert decode_e2m1(torch.tensor([8], dtype=torch.uint8)).signbit().item(), "0x8 is -0.0"


def test_e2m1_encode_every_finite_bf16_matches_ml_dtypes():
    x = all_bf16_patterns().flatten().float()
    x = x[torch.isfinite(x)]
    assert_exact(encode_e2m1(x), torch.from_numpy(oracles.e2m1_codes(x.numpy())), "E2M1 codes")


def test_e2m1_named_values():
    values = torch.tensor([0.0, -0.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, 7.0, 1e30, -1e-30])
    want = torch.tensor([0x0, 0x8, 0x0, 0x2, 0x2, 0x4, 0x4, 0x6, 0x6, 0x7, 0x7, 0x7, 0x8], dtype=torch.uint8)
    assert_exact(encode_e2m1(values), want)
    assert list(E2M1_MAGNITUDES) == [float(v) for v in oracles.e2m1_values(np.arange(8))]


def test_e8m0_decode_all_bytes_matches_ml_dtypes():
    b = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    assert_exact(decode_e8m0(b), torch.from_numpy(oracles.e8m0_values(b.numpy())))
    assert decode_e8m0(torch.tensor([0], dtype=torch.uint8)).item() == 2.0**-127
    assert decode_e8m0(torch.tensor([0xFF], dtype=torch.uint8)).isnan().item()


def test_nibble_order_low_first():
    codes = torch.tensor([0x1, 0x0, 0x6, 0x8], dtype=torch.uint8)  # [0.5, 0.0, 4.0, -0.0]
    assert_exact(pack_nibbles(codes), torch.tensor([0x01, 0x86], dtype=torch.uint8))
    assert_exact(unpack_nibbles(pack_nibbles(codes)), codes)
