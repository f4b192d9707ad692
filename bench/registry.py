"""Benchmark definitions: one `OpBench` per op, gathered in `REGISTRY` by `discover()`.

An `OpBench` declares everything the runner and the report need and nothing about how to time:
- the size sweeps ("small" for CPU, "full" for GPUs), each a list of `Case`s (label, x value, shape);
- `make_inputs(case, torch_device)`, which builds the inputs once per case;
- the implementations side by side, each an `Impl` whose factory turns the inputs into a zero-argument
  callable; an impl that cannot run a case (wrong device, too large, module missing) says why through
  `skip_reason` or by raising `Unavailable`, and the runner records the reason instead of dropping it;
- the bytes model (compulsory bytes read + written) and the FLOPs model of one call;
- the roof the op is measured against ("memcpy" for bandwidth-bound ops, "gemm" for compute-bound ones);
- `baselines`: the impls whose output is the reference for correctness, in order of preference (the first
  one that ran for a case is used), and `check(out, baseline_out) -> str` (bit-exact by default);
- `compare_to` (the impl every other impl is divided by in the report) and `headline` comparisons
  (pairs (impl, other), where other is an impl name or the roof name).

Definitions live in one module per op family under bench/<area>/; `discover()` imports them. A family may
also register accuracy tables (`AccuracyReport`, written by bench/accuracy.py next to the timing reports).
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Sequence
from typing import Any

from bench.correctness import compare_exact

ROOFS = ("memcpy", "gemm")
SWEEPS = ("small", "full")
# One module per op family; each calls `register(...)` at import time.
# The order is the run order: the many DeepSeek-V3 block-FP8 shapes go last, so that a bench cut short by a
# time budget has measured the other families.
FAMILY_MODULES = (
    "bench.quant.mxfp4",
    "bench.quant.fp8",
    "bench.quant.nvfp4",
    "bench.gemm.w4a16_mxfp4",
    "bench.gemm.w4a16_nvfp4",
    "bench.kv.zeroer",
    "bench.mamba.state_update",
    "bench.mamba.conv1d_update",
    "bench.norm.rms_norm",
    "bench.activation.silu_and_mul",
    "bench.rotary.rope",
    "bench.attention.paged_decode",
    "bench.attention.paged_prefill",
    "bench.moe.fused_moe",
    "bench.moe.block_fp8_moe",
    "bench.moe.mxfp4_moe",
    "bench.gemm.block_fp8",
)


class Unavailable(Exception):  # a verdict rather than a failure: the impl is recorded as skipped
    """Raised by an impl factory that cannot run here (module missing, unsupported device, ...)."""


@dataclasses.dataclass(frozen=True)
class Case:
    """One point of a size sweep: `x_value` is the plotted size, `label` names it in reports and the CLI."""

    label: str
    x_value: float
    shape: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Impl:
    """A named implementation. `factory(inputs)` returns the zero-argument callable that is timed."""

    name: str
    factory: Callable[[Any], Callable[[], Any]]
    # (case, backend) -> reason this impl does not run the case there, or None. backend: cuda|rocm|xpu|cpu.
    skip_reason: Callable[[Case, str], str | None] = lambda case, backend: None
    # A gated impl's mismatch or error fails the run; an ungated one (a peer we measure but do not own,
    # such as torch.compile of the reference) is recorded in the report and does not.
    gated: bool = True
    # This impl's own check against the baseline, where it differs from the op's (a peer that rounds elsewhere
    # and is not expected to be bit-equal: bench.correctness.expected_difference).
    check: Callable[[Any, Any], str] | None = None


@dataclasses.dataclass(frozen=True)
class OpBench:
    name: str
    area: str
    dtype: str
    x_name: str
    sweeps: dict[str, list[Case]]
    make_inputs: Callable[[Case, str], Any]
    impls: tuple[Impl, ...]
    bytes_model: Callable[[Case], int]
    flops_model: Callable[[Case], int]
    roof: str
    baselines: tuple[str, ...]
    compare_to: str
    headline: tuple[tuple[str, str], ...] = ()
    check: Callable[[Any, Any], str] = compare_exact
    # Time every impl as a CUDA-graph replay (bench.timing.graphed says why); decode-sized GEMMs use it.
    cuda_graph: bool = False

    def __post_init__(self) -> None:
        names = [impl.name for impl in self.impls]
        if len(set(names)) != len(names):
            raise ValueError(f"{self.name}: duplicate impl names {names}")
        if self.roof not in ROOFS:
            raise ValueError(f"{self.name}: roof must be one of {ROOFS}, got {self.roof!r}")
        if set(self.sweeps) != set(SWEEPS):
            raise ValueError(f"{self.name}: sweeps must be given for {SWEEPS}, got {sorted(self.sweeps)}")
        unknown = {*self.baselines, self.compare_to} - set(names)
        unknown |= {name for pair in self.headline for name in pair} - set(names) - {self.roof}
        if unknown:
            raise ValueError(f"{self.name}: unknown impls {sorted(unknown)} (have {names})")

    def impl(self, name: str) -> Impl:
        for impl in self.impls:
            if impl.name == name:
                return impl
        raise KeyError(f"{self.name} has no impl {name!r}; have {[i.name for i in self.impls]}")

    def cases(self, sweep: str, labels: Sequence[str] | None = None) -> list[Case]:
        cases = self.sweeps[sweep]
        if labels:
            missing = set(labels) - {case.label for case in cases}
            if missing:
                raise KeyError(f"{self.name}: no cases {sorted(missing)} in the {sweep!r} sweep")
            cases = [case for case in cases if case.label in labels]
        return cases


REGISTRY: dict[str, OpBench] = {}


def register(op: OpBench) -> OpBench:
    if op.name in REGISTRY and REGISTRY[op.name] is not op:
        raise ValueError(f"benchmark {op.name!r} is registered twice")
    REGISTRY[op.name] = op
    return op


def discover() -> dict[str, OpBench]:
    """Import every op family module (idempotent) and return the registry."""
    for module in FAMILY_MODULES:
        importlib.import_module(module)
    return REGISTRY


@dataclasses.dataclass(frozen=True)
class AccuracyReport:
    """A table computed alongside the timings of `ops`: `rows()` returns dicts with the same keys (columns)."""

    name: str
    title: str
    ops: tuple[str, ...]
    rows: Callable[[], list[dict[str, Any]]]
    note: str = ""


ACCURACY_REPORTS: dict[str, AccuracyReport] = {}


def register_accuracy(report: AccuracyReport) -> AccuracyReport:
    if report.name in ACCURACY_REPORTS and ACCURACY_REPORTS[report.name] is not report:
        raise ValueError(f"accuracy report {report.name!r} is registered twice")
    ACCURACY_REPORTS[report.name] = report
    return report
