"""A bench row's correctness verdict against the op's baseline, by the rules of `kernels.tolerances`.

Verdicts: "exact" / "close (max_rel ...)" / "differs as expected (...)" (checked and right: the last for a peer
that is not expected to be bit-equal, with its measured error), "mismatch ..." and "error: ..." (checked and
wrong; they fail a run), "baseline" (the output others are held to), "unchecked: ..." (nothing to compare
with: never counted as checked) and "skipped: ...".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from kernels.tolerances import exact_mismatches, exact_verdict, lossy_metrics, lossy_verdict


def as_tensors(out: Any) -> tuple[torch.Tensor, ...]:
    if isinstance(out, torch.Tensor):
        return (out,)
    if isinstance(out, list | tuple) and all(isinstance(t, torch.Tensor) for t in out):
        return tuple(out)
    raise TypeError(f"an implementation must return a tensor or a tuple of tensors, got {type(out).__name__}")


def compare_exact(out: Any, baseline: Any) -> str:
    """The check of exact ops: every output bit-exact to the baseline's (kernels.tolerances.exact)."""
    return exact_verdict(as_tensors(out), as_tensors(baseline))


def lossy_check(family: str) -> Callable[[Any, Any], str]:
    """The check of a lossy op: max/RMS relative error against the precision-mirroring baseline, bounded by
    the family's row of the tolerance table (the numbers the parity suites use)."""
    return lambda out, baseline: lossy_verdict(family, as_tensors(out), as_tensors(baseline))


def expected_difference(why: str, max_rel: float) -> Callable[[Any, Any], str]:
    """The check of a peer that is not expected to be bit-equal to the baseline (it rounds elsewhere, `why`): its
    measured difference is recorded, "differs as expected (why): 301/768 elements, max_rel 3.9e-3", and it is a
    mismatch only beyond `max_rel` of the baseline's peak (a real bug, not rounding)."""

    def check(out: Any, baseline: Any) -> str:
        outs, refs = as_tensors(out), as_tensors(baseline)
        if (verdict := exact_verdict(outs, refs)) == "exact" or verdict.startswith("mismatch:"):
            return verdict
        differing = sum(int(exact_mismatches(o, r).sum()) for o, r in zip(outs, refs, strict=True))
        total = sum(r.numel() for r in refs)
        worst = max(lossy_metrics(o, r, r).max_rel for o, r in zip(outs, refs, strict=True))
        text = f"{differing}/{total} elements, max_rel {worst:.2g}"
        return f"mismatch: {text} (bound {max_rel:g})" if worst > max_rel else f"differs as expected ({why}): {text}"

    return check


def is_failure(verdict: str) -> bool:
    """Mismatches and errors fail a run."""
    return verdict.startswith(("mismatch", "error"))


def is_checked(verdict: str) -> bool:
    """A row whose output was compared with a baseline (and is right or wrong), as opposed to the baseline
    itself, a skip, or an output nothing could be compared with."""
    return verdict.startswith(("exact", "close", "differs as expected", "mismatch"))
