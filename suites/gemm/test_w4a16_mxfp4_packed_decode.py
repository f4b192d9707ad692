"""The packed MXFP4 decode of the W4A16 and MoE kernels on a GPU (`kernels.w4a16_mxfp4_gemm._PACKED_DECODE_ASM`),
checked on every tier: its PTX text runs in a numpy interpreter of that instruction subset
(suites/ptx_subset.py) over every 16-bit code element (every pair of code bytes) and every E8M0 scale the
kernel's contract admits, and each output register must hold, bit for bit, the weights the reference
decodes (`reference.quant.mxfp4.dequantize_mxfp4`). The scale operand comes from `_scale_bf16`, run here as a
Triton kernel over all 256 scale bytes. On the GPU the kernels' own suites compare the packed path with the
reference through whole GEMMs; this one pins the decoder's bits where no GPU runs.

Negative controls: the same check on copies of the PTX with one planted bug each (a magnitude bit masked off, the
two low-nibble outputs swapped, the scale multiply dropped) must report mismatches.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from kernels._packed_ptx import packed_ptx_runs_on
from kernels.platform import Platform
from kernels.w4a16_mxfp4_gemm import _PACKED_DECODE_ASM, _scale_bf16, packed_decode
from reference.quant.mxfp4 import dequantize_mxfp4
from suites import ptx_subset

ASM = _PACKED_DECODE_ASM.value
CONTRACT_SCALES = [s for s in range(256) if s not in (253, 254)]  # the kernel's contract (its module doc)
PLANTED = {
    "magnitude_mask": ("and.b32 $1, t, 0x81C081C0;", "and.b32 $1, t, 0x81C08180;"),
    "swapped_outputs": (
        "and.b32 $0, t, 0x81C081C0;\nshl.b32 t, s1, 6;\nand.b32 $1,",
        "and.b32 $1, t, 0x81C081C0;\nshl.b32 t, s1, 6;\nand.b32 $0,",
    ),
    "scale_dropped": ("mul.rn.bf16x2 $2, $2, $5;", "mul.rn.bf16x2 $2, $2, bias;"),
}


def bf16_bits(t: torch.Tensor) -> np.ndarray:
    return t.contiguous().view(torch.int16).numpy().astype(np.uint16).astype(np.uint32)


def reference_scales() -> np.ndarray:
    """bf16 bits of 2**(s - 127) for every byte s (255: NaN), from the reference's own decode of code 2 (1.0)."""
    codes = torch.full((256, 16), 0x22, dtype=torch.uint8)  # every element 1.0
    scales = torch.arange(256, dtype=torch.uint8)[:, None]
    return bf16_bits(dequantize_mxfp4(codes, scales, dtype=torch.bfloat16)[:, 0])


def lane_inputs() -> list[tuple[np.ndarray, np.ndarray]]:
    """(code element, scale byte) per lane for the two halves of the input register: element 0 runs over every
    16-bit value, element 1 over a permutation of them."""
    lanes = np.arange(65536, dtype=np.uint32)
    return [(lanes, scale_draw(lanes)), ((lanes * 40503 + 12345) % 65536, scale_draw(lanes * 7 + 3))]


def scale_draw(lanes: np.ndarray) -> np.ndarray:
    """A contract scale byte per lane, mixed from all of the lane's bits: every nibble position of a code
    element meets every scale with every code value (`test_every_code_meets_every_scale`)."""
    mixed = lanes ^ (lanes >> 5) ^ (lanes >> 11)
    return np.asarray(CONTRACT_SCALES, dtype=np.uint32)[mixed % len(CONTRACT_SCALES)]


def test_every_code_meets_every_scale():
    for element, scale in lane_inputs():
        for nibble in range(4):
            pairs = set(zip(((element >> (4 * nibble)) & 15).tolist(), scale.tolist(), strict=True))
            assert len(pairs) == 16 * len(CONTRACT_SCALES)


def decode_mismatches(asm: str) -> int:
    """Lanes where `asm`'s four outputs differ from the reference (NaN matches NaN)."""
    (e0, s0), (e1, s1) = lane_inputs()
    scale_bits = reference_scales()
    out = ptx_subset.run(asm, {4: e0 | (e1 << 16), 5: scale_bits[s0] | (scale_bits[s1] << 16)})
    want = []
    for element, scale in ((e0, s0), (e1, s1)):
        codes = np.zeros((65536, 16), dtype=np.uint8)
        codes[:, 0], codes[:, 1] = element & 0xFF, element >> 8
        decoded = dequantize_mxfp4(torch.from_numpy(codes), torch.from_numpy(scale.astype(np.uint8)[:, None]))
        want.append(bf16_bits(decoded[:, :4]))
    # register $0: low nibbles of byte 0 of both elements; $1: low of byte 1; $2: high of byte 0; $3: high of 1
    bad = np.zeros(65536, dtype=bool)
    for register, column in ((0, 0), (1, 2), (2, 1), (3, 3)):
        for half, expected in ((0, want[0][:, column]), (1, want[1][:, column])):
            got = (out[register] >> (16 * half)) & 0xFFFF
            both_nan = ((got & 0x7FFF) > 0x7F80) & ((expected & 0x7FFF) > 0x7F80)
            bad |= (got != expected) & ~both_nan
    return int(bad.sum())


def test_packed_decode_equals_the_reference_on_every_code_pair_and_scale():
    assert decode_mismatches(ASM) == 0


@pytest.mark.parametrize("bug", sorted(PLANTED))
def test_negative_control_planted_decode_bug_is_caught(bug):
    old, new = PLANTED[bug]
    assert old in ASM, f"the planted bug {bug} no longer applies to the PTX text: update it"
    assert decode_mismatches(ASM.replace(old, new, 1)) > 0


@triton.jit
def _scale_kernel(scales_ptr, out_ptr):
    i = tl.arange(0, 256)
    tl.store(out_ptr + i, _scale_bf16(tl.load(scales_ptr + i).to(tl.uint16)))


def test_scale_operand_equals_the_reference_on_every_byte(device):
    scales = torch.arange(256, dtype=torch.uint8, device=device)
    out = torch.empty(256, dtype=torch.bfloat16, device=device)
    _scale_kernel[(1,)](scales, out)
    got, want = bf16_bits(out.cpu()), reference_scales()
    nan = (want & 0x7FFF) > 0x7F80
    assert np.array_equal(got[~nan], want[~nan])
    assert ((got[nan] & 0x7FFF) > 0x7F80).all()  # byte 255: NaN


@pytest.mark.parametrize(
    ("platform", "runs"),
    [
        (Platform("cuda", "NVIDIA H200", 1, (9, 0), "sm_90", "hopper"), True),
        (Platform("cuda", "NVIDIA B200", 1, (10, 0), "sm_100", "blackwell"), True),
        (Platform("cuda", "NVIDIA L40S", 1, (8, 9), "sm_89", "ada"), False),
        (Platform("cuda", "NVIDIA A100", 1, (8, 0), "sm_80", "ampere"), False),
        (Platform("rocm", "AMD Instinct MI300X", 1, (9, 4), "gfx942", "cdna3"), False),
        (Platform("cpu", "Test CPU", 1, None, "x86_64", "cpu"), False),
    ],
)
def test_packed_decode_only_where_its_ptx_assembles(platform, runs):
    """mul.rn.bf16x2 needs sm_90 (ptxas refuses it for sm_80 and sm_89); ROCm runs no PTX, whatever its pair."""
    assert packed_ptx_runs_on(platform) is runs


def test_interpreter_and_cpu_take_the_fp32_decode():
    assert packed_decode(torch.device("cpu")) is False
