"""The bit-exact rule of exact ops (format codecs, packing, geometry, hashing, stores), one rule for the suites'
asserts and the bench's verdicts.

Floats compare bit patterns (so -0.0 and +0.0 differ), except that two NaNs are equal whatever their payload
and sign: NaN positions must agree, payloads need not, because GPUs canonicalise NaN payloads on conversion
and no format here gives a payload meaning. Integer tensors (encoded bytes, codes, indices) compare values, so
a format's own NaN encoding (E4M3's 0x7F, E8M0's 0xFF) is still checked byte for byte.
"""

from __future__ import annotations

import torch

_INT_OF_WIDTH = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
MAX_REPORTED = 8  # differing elements listed in an assertion message


def exact_mismatches(got: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """Boolean mask of the elements where `got` breaks the bit-exact rule against `want` (same shape and dtype)."""
    got, want = got.detach().cpu(), want.detach().cpu()
    if not got.is_floating_point():
        return got != want
    view = _INT_OF_WIDTH[got.element_size()]
    nan_got, nan_want = got.isnan(), want.isnan()
    return (nan_got != nan_want) | ((got.view(view) != want.view(view)) & ~(nan_got & nan_want))


def _describe(mismatch: torch.Tensor, got: torch.Tensor, want: torch.Tensor) -> str:
    where = mismatch.nonzero()[:MAX_REPORTED].tolist()
    rows = [f"  at {tuple(i)}: got {got[tuple(i)].item()!r}, want {want[tuple(i)].item()!r}" for i in where]
    return f"{int(mismatch.sum())} of {mismatch.numel()} differ; first:\n" + "\n".join(rows)


def assert_exact(got: torch.Tensor, want: torch.Tensor, what: str = "output") -> None:
    """Raise AssertionError, listing the first differing elements, unless `got` is bit-exact to `want`."""
    got, want = got.detach().cpu(), want.detach().cpu()
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    mismatch = exact_mismatches(got, want)
    if mismatch.any():
        raise AssertionError(f"{what}: not bit-exact: " + _describe(mismatch, got, want))


def exact_verdict(outs: tuple[torch.Tensor, ...], refs: tuple[torch.Tensor, ...]) -> str:
    """The bench's verdict over an op's outputs: "exact", "mismatch 12/4096" (differing / compared elements),
    or "mismatch: <what differs>" when the number of outputs, a shape or a dtype disagrees."""
    if len(outs) != len(refs):
        return f"mismatch: {len(outs)} outputs vs {len(refs)}"
    differing = compared = 0
    for i, (o, r) in enumerate(zip(outs, refs, strict=True)):
        if o.shape != r.shape or o.dtype != r.dtype:
            return f"mismatch: output {i} is {o.dtype} {list(o.shape)}, baseline {r.dtype} {list(r.shape)}"
        differing += int(exact_mismatches(o, r).sum())
        compared += r.numel()
    return "exact" if differing == 0 else f"mismatch {differing}/{compared}"
