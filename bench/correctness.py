"""Correctness of one implementation's output against the baseline's, as a short verdict string.

`compare_exact` is the check of exact ops (DESIGN.md tolerance policy: bit-exact, NaN positions equal,
signed zero checked): every output tensor is compared bit for bit (floats through an integer view of the
same width), so -0.0 vs +0.0 and NaN payloads count as mismatches. Verdicts: "exact",
"mismatch 12/4096" (differing elements / elements compared), or "mismatch: <what differs>" when shapes,
dtypes or the number of outputs disagree.
"""

from __future__ import annotations

from typing import Any

import torch

_INT_OF_WIDTH = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def as_tensors(out: Any) -> tuple[torch.Tensor, ...]:
    if isinstance(out, torch.Tensor):
        return (out,)
    if isinstance(out, list | tuple) and all(isinstance(t, torch.Tensor) for t in out):
        return tuple(out)
    raise TypeError(f"an implementation must return a tensor or a tuple of tensors, got {type(out).__name__}")


def _bits(t: torch.Tensor) -> torch.Tensor:
    if t.dtype.is_floating_point or t.dtype.is_complex:
        return t.view(_INT_OF_WIDTH[t.element_size()])
    return t


def compare_exact(out: Any, baseline: Any) -> str:
    outs, refs = as_tensors(out), as_tensors(baseline)
    if len(outs) != len(refs):
        return f"mismatch: {len(outs)} outputs vs {len(refs)}"
    differing = compared = 0
    for i, (o, r) in enumerate(zip(outs, refs, strict=True)):
        if o.shape != r.shape or o.dtype != r.dtype:
            return f"mismatch: output {i} is {o.dtype} {list(o.shape)}, baseline {r.dtype} {list(r.shape)}"
        differing += int((_bits(o) != _bits(r.to(o.device))).sum())
        compared += r.numel()
    return "exact" if differing == 0 else f"mismatch {differing}/{compared}"


def is_failure(verdict: str) -> bool:
    """Mismatches and errors fail a run; "exact", "baseline", "unchecked..." and skips do not."""
    return verdict.startswith(("mismatch", "error"))


def lossy_check(family: str):
    """The check of a lossy op: max/RMS relative error against the precision-mirroring baseline, bounded by
    the family's row of the suites' tolerance table (the same numbers the parity suites use)."""

    def check(out: Any, baseline: Any) -> str:
        try:
            from suites.tolerances import lossy_bound, lossy_metrics, nonfinite_agreement
        except ImportError as err:  # an installed wheel without the repository's suites
            return f"unchecked (suites.tolerances not importable: {err})"
        outs, refs = as_tensors(out), as_tensors(baseline)
        if len(outs) != len(refs):
            return f"mismatch: {len(outs)} outputs vs {len(refs)}"
        worst = []
        for i, (o, r) in enumerate(zip(outs, refs, strict=True)):
            if o.shape != r.shape or o.dtype != r.dtype:
                return f"mismatch: output {i} is {o.dtype} {list(o.shape)}, baseline {r.dtype} {list(r.shape)}"
            bound = lossy_bound(family, o.dtype)
            problem, finite = nonfinite_agreement(o, r)
            if problem is not None:
                return f"mismatch: {problem}"
            o, r = o.detach().cpu()[finite], r.detach().cpu()[finite]
            metrics = lossy_metrics(o, r, r)
            if not (metrics.max_rel <= bound.max_rel and metrics.rms_rel <= bound.rms_rel):
                return (
                    f"mismatch: max_rel {metrics.max_rel:.3g} (bound {bound.max_rel:g}), "
                    f"rms_rel {metrics.rms_rel:.3g} (bound {bound.rms_rel:g})"
                )
            worst.append(metrics.max_rel)
        return f"close (max_rel {max(worst):.2g})"

    return check
