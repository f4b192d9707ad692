"""Checks the MXFP4 and NVFP4 parity suites share: the same property, told the block size, the NaN scale
byte and how to call the op (each suite passes its own quantize/dequantize, scale arguments bound).

Packed layout of both formats: two E2M1 codes a byte (element 2i in the low nibble), one scale byte a block.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import pytest
import torch

from kernels.tolerances import assert_exact
from suites.quant.mxfp4_cases import bits_of

Quantize = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
Dequantize = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def check_named_quantize_cases(named: Iterable, quantize_case: Callable) -> None:
    """Each case's block, in each of its dtypes, quantizes to its expected scale byte and codes;
    `quantize_case(case, dtype)` returns (codes, scales)."""
    for case in named:
        for dtype in case.dtypes:
            codes, scales = quantize_case(case, dtype)
            what = f"{case.name} [{dtype}] ({case.note})"
            assert_exact(scales, torch.tensor([case.scale], dtype=torch.uint8), f"scale of {what}")
            assert_exact(codes, case.expected_codes(), f"codes of {what}")


def one_code_block(case, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Codes and scales of one block whose element 0 holds `case.code` (the rest +0) under `case.scale`."""
    codes = torch.zeros(1, block // 2, dtype=torch.uint8)
    codes[0, 0] = case.code
    return codes, torch.tensor([[case.scale]], dtype=torch.uint8)


def assert_first_element(out: torch.Tensor, bits: int | None, what: str) -> None:
    """Element 0 of `out` has the bit pattern `bits`; `bits` None: the whole block is NaN."""
    out = out.cpu()
    if bits is None:
        assert out.isnan().all(), f"{what}: want NaN everywhere"
    else:
        first = bits_of(out[0, :1])
        assert_exact(first, torch.tensor([bits], dtype=first.dtype), what)


def check_nonfinite_poisons_only_its_block(
    x: torch.Tensor, column: int, value: float, quantize: Quantize, dequantize: Dequantize, block: int, nan_scale: int
) -> None:
    """`value` (NaN/Inf) at x[1, column] gives its block the NaN scale byte, zero codes and NaN output; every
    other block quantizes as without it and dequantizes finite."""
    poisoned = x.clone()
    poisoned[1, column] = value
    codes, scales = quantize(poisoned)
    clean_codes, clean_scales = quantize(x)
    b = column // block
    assert scales[1, b].item() == nan_scale
    assert int(codes[1, b * block // 2 : (b + 1) * block // 2].cpu().count_nonzero()) == 0
    keep = torch.ones(x.shape[0], x.shape[1] // block, dtype=torch.bool)
    keep[1, b] = False
    assert_exact(scales.cpu()[keep], clean_scales.cpu()[keep], "scales of neighbouring blocks")
    keep_codes = keep.repeat_interleave(block // 2, dim=1)
    assert_exact(codes.cpu()[keep_codes], clean_codes.cpu()[keep_codes], "codes of neighbouring blocks")
    out = dequantize(codes, scales).cpu()
    assert out[1, b * block : (b + 1) * block].isnan().all()
    assert not out[keep.repeat_interleave(block, dim=1)].isnan().any()


def check_shard_of_quantized(x: torch.Tensor, cut: int, width: int, quantize: Quantize, block: int) -> None:
    """Quantizing blocks cut..cut+width of every row (a strided view) gives that slice of the whole's bytes."""
    codes, scales = quantize(x)
    lo, hi = block * cut, block * (cut + width)
    shard_codes, shard_scales = quantize(x[:, lo:hi])
    assert_exact(shard_codes, codes[:, lo // 2 : hi // 2], "codes of the shard")
    assert_exact(shard_scales, scales[:, cut : cut + width], "scales of the shard")


def check_shard_of_dequantized(
    seed: int, cut: int, width: int, dequantize: Dequantize, block: int, device: str
) -> None:
    """Column slices of random codes/scales (strided rows, no copy) dequantize to that slice of the whole."""
    gen = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 256, (3, block // 2 * 12), generator=gen, dtype=torch.uint8).to(device)
    scales = torch.randint(0, 256, (3, 12), generator=gen, dtype=torch.uint8).to(device)
    whole = dequantize(codes, scales)
    half = block // 2
    shard = dequantize(codes[:, half * cut : half * (cut + width)], scales[:, cut : cut + width])
    assert_exact(shard, whole[:, block * cut : block * (cut + width)], "dequantized shard")


def check_sign_symmetry(x: torch.Tensor, quantize: Quantize, block: int, nan_scale: int) -> None:
    """-x has the same scale bytes and, outside NaN blocks, codes with both nibbles' sign bits flipped
    (signs of zeros are kept)."""
    codes, scales = quantize(x)
    neg_codes, neg_scales = quantize(-x)
    assert_exact(neg_scales, scales, "scales of -x")
    finite = (scales != nan_scale).repeat_interleave(block // 2, dim=-1)
    assert_exact(neg_codes[finite], codes[finite] ^ 0x88, "codes of -x")


def assert_control_caught(check: Callable, device: str, quantize: Callable) -> None:
    """A negative control: `check(device, quantize)` must fail on the planted fault, and by a bit-exact
    mismatch (assert_exact's message), not by some other assertion."""
    with pytest.raises(AssertionError, match="not bit-exact"):
        check(device, quantize)


def control_ids(controls: list[tuple]) -> list[str]:
    """Test ids for (fault, check, why) rows: fault-check."""
    return [f"{fault}-{check.__name__}" for fault, check, _ in controls]
