"""The rules that apply the tolerance table to a lossy output, for the suites' asserts and the bench's verdicts.

Definitions (normalised by the reference's scale, so outputs near zero do not blow up):
- max_rel = max|got - mirror| / max|mirror|
- rms_rel = rms(got - mirror) / rms(mirror)
- sqnr_db = 10 log10(sum ideal^2 / sum (got - ideal)^2), the ideal being fp64 on the unquantized operands.
NaN and each signed infinity must sit where the mirror has them (those are exact facts, not rounding); the
metrics are taken over the entries finite in the mirror.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from kernels.tolerances.table import AGREEMENT, LOSSY, LossyBound


@dataclasses.dataclass(frozen=True)
class LossyMetrics:
    max_rel: float
    rms_rel: float
    sqnr_db: float

    def __str__(self) -> str:
        return f"max_rel {self.max_rel:.3g}, rms_rel {self.rms_rel:.3g}, SQNR {self.sqnr_db:.1f} dB"


def _f64(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu", torch.float64)


def sqnr_db(got: torch.Tensor, ideal: torch.Tensor) -> float:
    got, ideal = _f64(got), _f64(ideal)
    noise = float(((got - ideal) ** 2).sum())
    signal = float((ideal**2).sum())
    if noise == 0.0:
        return math.inf
    return 10.0 * math.log10(signal / noise) if signal > 0 else -math.inf


def lossy_metrics(got: torch.Tensor, mirror: torch.Tensor, ideal: torch.Tensor) -> LossyMetrics:
    got64, mirror64 = _f64(got), _f64(mirror)
    diff = got64 - mirror64
    peak = float(mirror64.abs().max()) if mirror64.numel() else 0.0
    rms = float(mirror64.pow(2).mean().sqrt()) if mirror64.numel() else 0.0
    max_err = float(diff.abs().max()) if diff.numel() else 0.0
    rms_err = float(diff.pow(2).mean().sqrt()) if diff.numel() else 0.0
    return LossyMetrics(
        max_rel=max_err / peak if peak > 0 else (0.0 if max_err == 0 else math.inf),
        rms_rel=rms_err / rms if rms > 0 else (0.0 if rms_err == 0 else math.inf),
        sqnr_db=sqnr_db(got, ideal),
    )


def lossy_bound(family: str, dtype: torch.dtype) -> LossyBound:
    try:
        return LOSSY[(family, dtype)]
    except KeyError:
        raise KeyError(f"no tolerance row for ({family!r}, {dtype}); add one to kernels/tolerances/table.py") from None


def nonfinite_agreement(got: torch.Tensor, mirror: torch.Tensor) -> tuple[str | None, torch.Tensor]:
    """(what differs or None, the mask of entries finite in the mirror to measure)."""
    got, mirror = got.detach().cpu(), mirror.detach().cpu()
    for name, test in (("NaN", torch.isnan), ("+Inf", torch.isposinf), ("-Inf", torch.isneginf)):
        differ = test(got) != test(mirror)
        if differ.any():
            return f"{name} positions differ at {int(differ.sum())} of {differ.numel()}", differ
    return None, torch.isfinite(mirror)


def _exceeded(metrics: LossyMetrics, bound: LossyBound, with_sqnr: bool) -> list[str]:
    problems = []
    if not metrics.max_rel <= bound.max_rel:
        problems.append(f"max_rel {metrics.max_rel:.3g} > {bound.max_rel:g}")
    if not metrics.rms_rel <= bound.rms_rel:
        problems.append(f"rms_rel {metrics.rms_rel:.3g} > {bound.rms_rel:g}")
    if with_sqnr and not metrics.sqnr_db >= bound.sqnr_db:
        problems.append(f"SQNR {metrics.sqnr_db:.1f} dB < {bound.sqnr_db:g} dB")
    return problems


def tolerance_verdict(metrics: LossyMetrics, bound: LossyBound) -> str:
    """`ok` or `OUT OF TOLERANCE` against every number of the row, with the metrics (the launch sweeps' line)."""
    return f"{'OUT OF TOLERANCE' if _exceeded(metrics, bound, True) else 'ok'} [{metrics}]"


def assert_lossy(
    family: str, got: torch.Tensor, mirror: torch.Tensor, ideal: torch.Tensor, what: str = "output"
) -> LossyMetrics:
    """Check `got` against both references with the family's row; returns the metrics for reporting."""
    assert got.shape == mirror.shape == ideal.shape, (
        f"{what}: shapes got {tuple(got.shape)}, mirror {tuple(mirror.shape)}, ideal {tuple(ideal.shape)}"
    )
    problem, finite = nonfinite_agreement(got, mirror)
    assert problem is None, f"{what}: {problem}"
    bound = lossy_bound(family, got.dtype)
    metrics = lossy_metrics(got.detach().cpu()[finite], mirror.detach().cpu()[finite], ideal.detach().cpu()[finite])
    problems = _exceeded(metrics, bound, True)
    assert not problems, f"{what} ({family}, {got.dtype}): " + "; ".join(problems) + f" [{metrics}]"
    return metrics


def lossy_verdict(family: str, outs: tuple[torch.Tensor, ...], refs: tuple[torch.Tensor, ...]) -> str:
    """The bench's verdict of a lossy op against its mirror-reference baseline (no ideal in a bench run, so no
    SQNR): "close (max_rel ...)" inside the family's row, else "mismatch: ..."."""
    if len(outs) != len(refs):
        return f"mismatch: {len(outs)} outputs vs {len(refs)}"
    worst = []
    for i, (o, r) in enumerate(zip(outs, refs, strict=True)):
        if o.shape != r.shape or o.dtype != r.dtype:
            return f"mismatch: output {i} is {o.dtype} {list(o.shape)}, baseline {r.dtype} {list(r.shape)}"
        problem, finite = nonfinite_agreement(o, r)
        if problem is not None:
            return f"mismatch: {problem}"
        o, r = o.detach().cpu()[finite], r.detach().cpu()[finite]
        metrics = lossy_metrics(o, r, r)
        if problems := _exceeded(metrics, lossy_bound(family, o.dtype), False):
            return "mismatch: " + "; ".join(problems)
        worst.append(metrics.max_rel)
    return f"close (max_rel {max(worst):.2g})"


def assert_agree(family: str, got: torch.Tensor, want: torch.Tensor, what: str = "output") -> None:
    """`got` and `want` (same dtype and shape) within the family's AGREEMENT row:
    max |got - want| <= max_rel * max(max|want|, 1)."""
    assert got.dtype == want.dtype and got.shape == want.shape, (
        f"{what}: got {got.dtype} {tuple(got.shape)}, want {want.dtype} {tuple(want.shape)}"
    )
    bound = AGREEMENT[(family, got.dtype)]
    scale = max(float(want.abs().max()) if want.numel() else 0.0, 1.0)
    err = float((got - want).abs().max()) if want.numel() else 0.0
    assert err <= bound.max_rel * scale, (
        f"{what} ({family}, {got.dtype}): max |diff| {err:.3g} > {bound.max_rel:g} x {scale:.3g}"
    )
