"""Run one registered bench op on the CPU with fake roofs and tiny timing windows, for suites that check a
bench definition end to end (its impls, skips and correctness verdicts) without a GPU."""

from __future__ import annotations

import io

from bench.environment import collect
from bench.registry import discover
from bench.roofs import Roof, Roofs
from bench.runner import Progress, RunConfig, run_op
from bench.timing import Timing
from kernels.platform import Platform


def cpu_verdicts(op_name: str, case: str, impls: list[str] | None = None) -> dict[str, str]:
    """{impl: correctness verdict} of one small-sweep case of `op_name`, run on the CPU."""
    timing = Timing(0.9, 1.0, 1.1, 10)
    roofs = Roofs(
        Roof("memcpy", "copy", "uint8", (1,), 2, 0, timing), Roof("gemm", "mm", "bf16", (1, 1, 1), 6, 2, timing)
    )
    config = RunConfig(sweep="small", impls=impls, cases=[case], warmup_ms=1.0, rep_ms=2.0)
    env = collect(Platform("cpu", "Test CPU", 1, None, "x86_64", "cpu"))
    op = discover()[op_name]
    rows = run_op(op, env, roofs, config, Progress(len(impls or op.impls), io.StringIO()))
    return {row["impl"]: row["correctness"] for row in rows}
