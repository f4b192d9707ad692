"""Run one op's sweep: inputs per case, every selected impl checked against the baseline, then timed.

Per case, the impls run baselines first (in the op's preference order), so the first baseline that runs
provides the output the others are compared with. If the selection holds no baseline, the first one that
can run the case is called once, untimed, for correctness only. Every selected (impl, case) yields a row:
timed, or with the reason it was not ("skipped: ...", "error: ..."). Out-of-memory is a skip; memory is
returned to the device after every case, because the sweep grows to 1 GiB inputs plus outputs.
"""

from __future__ import annotations

import dataclasses
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from bench.device import out_of_memory_errors, release_memory, synchronize
from bench.environment import Environment, timestamp
from bench.formatting import num, times
from bench.registry import Case, Impl, OpBench, Unavailable
from bench.roofs import Roofs
from bench.rows import Row, make_row, repro_command
from bench.timing import Timing, bench


@dataclasses.dataclass
class RunConfig:
    sweep: str  # "small" | "full"
    impls: Sequence[str] | None = None  # None: all of the op's impls
    cases: Sequence[str] | None = None  # case labels; None: the whole sweep
    deadline: float | None = None  # time.monotonic() after which remaining measurements are skipped
    warmup_ms: float | None = None  # None: bench.timing's defaults for the device
    rep_ms: float | None = None


class Progress:
    """Numbered, flushed progress lines: the GPU run's output is read only at the end, through a tail."""

    def __init__(self, total: int, stream: Any = None) -> None:
        self.total, self.done, self.stream = total, 0, stream or sys.stdout

    def line(self, text: str, counted: bool = True) -> None:
        self.done += counted
        prefix = f"[{self.done}/{self.total}]" if counted else "[--]"
        print(f"{prefix} {text}", file=self.stream, flush=True)


def selected_impls(op: OpBench, names: Sequence[str] | None) -> list[Impl]:
    wanted = [impl for impl in op.impls if impl.name in names] if names else list(op.impls)
    baselines = [op.impl(name) for name in op.baselines if op.impl(name) in wanted]
    return baselines + [impl for impl in wanted if impl not in baselines]


def count_measurements(op: OpBench, config: RunConfig) -> int:
    return len(op.cases(config.sweep, config.cases)) * len(selected_impls(op, config.impls))


@dataclasses.dataclass
class _Outcome:
    verdict: str
    timing: Timing | None = None
    output: Any = None
    first_call_s: float = 0.0


# Compilation failures repeat at every size and each attempt costs a full compile (tens of seconds on a GPU),
# so after one the impl is skipped for the rest of the op's sweep.
COMPILE_ERRORS = ("BackendCompilerFailed", "InductorError", "CompilationError", "CppCompileError")


def _short(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0][:200] if text else ''}".rstrip(": ")


def _attempt(
    op: OpBench,
    impl: Impl,
    case: Case,
    inputs: Any,
    env: Environment,
    config: RunConfig,
    baseline: tuple[str, Any] | None,
    timed: bool,
    broken: dict[str, str],
) -> _Outcome:
    reason = impl.skip_reason(case, env.backend) or broken.get(impl.name)
    if reason:
        return _Outcome(f"skipped: {reason}")
    if config.deadline is not None and time.monotonic() > config.deadline:
        return _Outcome("skipped: time budget exhausted")
    try:
        fn = impl.factory(inputs)
        start = time.perf_counter()
        output = fn()  # first call: correctness, and compilation/autotuning kept out of the timing
        synchronize(env.torch_device)
        outcome = _Outcome("baseline", output=output, first_call_s=time.perf_counter() - start)
        if baseline is not None:
            name, expected = baseline
            outcome.output = None
            outcome.verdict = (impl.check or op.check)(output, expected)
            if name != op.baselines[0]:
                outcome.verdict += f" (vs {name})"
        elif impl.name not in op.baselines:
            outcome.verdict, outcome.output = "unchecked: no baseline ran", None
        del output
        if timed:
            outcome.timing = bench(
                fn, env.torch_device, warmup_ms=config.warmup_ms, rep_ms=config.rep_ms, cuda_graph=op.cuda_graph
            )
            if outcome.timing.note:
                outcome.verdict += f" [{outcome.timing.note}]"
        return outcome
    except Unavailable as err:
        return _Outcome(f"skipped: {err}")
    except out_of_memory_errors() as err:
        verdict = f"skipped: out of memory ({_short(err)})"
    except Exception as err:
        # The tail of the traceback, each line cut short: compiler errors can carry whole generated sources,
        # and the GPU log is read through a 12,000-character tail.
        tail = [line[:300] for line in traceback.format_exc().splitlines()[-6:]]
        print("\n".join(tail), file=sys.stderr, flush=True)
        if type(err).__name__ in COMPILE_ERRORS:
            broken[impl.name] = f"compilation failed at {case.label} (error in that row)"
        return _Outcome(f"error: {_short(err)}")
    # Out of memory: released here, after the except block dropped the traceback whose frames held tensors.
    release_memory(env.torch_device)
    return _Outcome(verdict)


def _progress_text(op: OpBench, impl: str, case: Case, row: Row, first_call_s: float) -> str:
    text = f"{op.name} {impl} {case.label}  "
    if row["p50"] is None:
        return text + row["correctness"]
    if op.roof == "memcpy":
        text += f"{num(row['gbps'])} GB/s ({times(row['fraction_of_roof'])} memcpy)"
    else:
        text += f"{num(row['tflops'])} TFLOP/s ({times(row['fraction_of_roof'])} gemm)"
    text += f"  p50 {row['p50']:.4g} ms  n={row['n_samples']}  {row['correctness']}"
    return text + (f"  (first call {first_call_s:.1f} s)" if first_call_s >= 1.0 else "")


def run_op(
    op: OpBench,
    env: Environment,
    roofs: Roofs,
    config: RunConfig,
    progress: Progress,
    on_row: Callable[[Row], None] = lambda row: None,
) -> list[Row]:
    rows: list[Row] = []
    impls = selected_impls(op, config.impls)
    roof = roofs[op.roof]
    broken: dict[str, str] = {}  # impl -> reason it is skipped from now on
    for case in op.cases(config.sweep, config.cases):
        inputs, baseline = None, None
        try:
            inputs = op.make_inputs(case, env.torch_device)
        except out_of_memory_errors() as err:
            inputs_error = f"skipped: out of memory building inputs ({_short(err)})"
        except Exception as err:
            inputs_error = f"error: building inputs: {_short(err)}"
        else:
            inputs_error = None
        if inputs_error is None and not any(impl.name in op.baselines for impl in impls):
            for name in op.baselines:  # correctness-only baseline, untimed and not reported as a row
                outcome = _attempt(op, op.impl(name), case, inputs, env, config, None, False, broken)
                text = f"{op.name} {name} {case.label}  correctness-only run: {outcome.verdict}"
                progress.line(text, counted=False)
                if outcome.output is not None:
                    baseline = (name, outcome.output)
                    break
        for impl in impls:
            if inputs_error is not None:
                outcome = _Outcome(inputs_error)
            else:
                outcome = _attempt(op, impl, case, inputs, env, config, baseline, True, broken)
            if baseline is None and outcome.output is not None:
                baseline = (impl.name, outcome.output)
            row = make_row(
                op=op.name,
                impl=impl.name,
                dtype=op.dtype,
                shape=case.shape,
                x_name=op.x_name,
                x_value=case.x_value,
                nbytes=op.bytes_model(case),
                flops=op.flops_model(case),
                roof_name=roof.name,
                roof_value=roof.value,
                correctness=outcome.verdict,
                environment=env.row_fields(),
                timestamp=timestamp(),
                timing=outcome.timing,
                repro_cmd=repro_command(op.name, config.sweep, impl.name, case.label),
            )
            rows.append(row)
            on_row(row)
            progress.line(_progress_text(op, impl.name, case, row, outcome.first_call_s))
            del outcome
        del inputs, baseline
        release_memory(env.torch_device)
    return rows
