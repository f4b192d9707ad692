"""The tolerance policy of every suite, in one table (DESIGN.md, "Tolerance policy").

Exact ops (format encode/decode, packing, geometry, hashing) compare bit patterns: rtol = atol = 0, NaN
positions equal (NaN payloads may differ: GPUs canonicalise NaN on conversion), signed zero checked.
Lossy ops (GEMM, attention, MoE, SSD) get per-dtype max/RMS relative-error bounds against the
precision-mirroring reference and an SQNR floor against the ideal one; their rows join this module with the
first lossy op, so no suite carries its own tolerance knobs.
"""

from __future__ import annotations

import torch

_INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
MAX_REPORTED = 8


def _describe(mismatch: torch.Tensor, got: torch.Tensor, want: torch.Tensor) -> str:
    where = mismatch.nonzero()[:MAX_REPORTED].tolist()
    rows = [f"  at {tuple(i)}: got {got[tuple(i)].item()!r}, want {want[tuple(i)].item()!r}" for i in where]
    return f"{int(mismatch.sum())} of {mismatch.numel()} differ; first:\n" + "\n".join(rows)


def assert_exact(got: torch.Tensor, want: torch.Tensor, what: str = "output") -> None:
    """Bit-exact equality (float: same bits, signed zeros included; NaN positions equal)."""
    got, want = got.detach().cpu(), want.detach().cpu()
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    if got.is_floating_point():
        nan_got, nan_want = got.isnan(), want.isnan()
        assert torch.equal(nan_got, nan_want), f"{what}: NaN positions differ: " + _describe(
            nan_got != nan_want, got, want)
        view = _INT_VIEW[got.element_size()]
        bits_got, bits_want = got.view(view), want.view(view)
        mismatch = (bits_got != bits_want) & ~nan_want
    else:
        mismatch = got != want
    if mismatch.any():
        raise AssertionError(f"{what}: not bit-exact: " + _describe(mismatch, got, want))
