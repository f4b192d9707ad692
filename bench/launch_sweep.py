"""What the launch sweeps share: the command line and its GPU gate, the timer (bench.timing's, the registry's
one path), the same-run memcpy roof (bench.roofs'), and the per-config line, which is printed and recorded.

Every measurement a sweep prints is also a row of <out>/<backend>-<device>/launch_sweeps/<sweep>.csv (the
file is rewritten after each row, so a sweep cut short keeps what it measured): the config, its time, its
rates (GB/s, TFLOP/s) and ratios to roofs and peers, the check's verdict, and the environment. The measurement
behind every launch-table constant is data that can be re-plotted. GPU only; the sweep scripts themselves say
which kernel and shapes they launch.
"""

from __future__ import annotations

import argparse
import math
import pathlib
import sys
from collections.abc import Callable

import pandas as pd
import torch

from bench import tables
from bench.environment import collect, timestamp
from bench.roofs import measure_memcpy
from bench.timing import bench
from kernels.tolerances import LossyBound, lossy_metrics, tolerance_verdict

UNITS = {"gbps": "GB/s", "tflops": "TFLOP/s"}


class Recorder:
    """The rows of one sweep run, written to its CSV after every row."""

    def __init__(self, sweep: str, out: pathlib.Path, command: str) -> None:
        self.env = collect()
        self.path = out / f"{self.env.backend}-{self.env.slug}" / "launch_sweeps" / f"{sweep}.csv"
        self.sweep, self.command, self.rows = sweep, command, []

    def add(self, config: str, values: dict[str, object]) -> None:
        fields = self.env.row_fields() | {"timestamp": timestamp(), "command": self.command}
        self.rows.append({"sweep": self.sweep, "config": config.strip(), **values, **fields})
        frame = pd.DataFrame(self.rows)
        first = [c for c in ("sweep", "config", "time_us", *UNITS, "bytes") if c in frame.columns]
        ratios = [c for c in frame.columns if c.startswith("x_")]
        verdict = [c for c in ("verdict",) if c in frame.columns]
        middle = [c for c in frame.columns if c not in (*first, *ratios, *verdict, *fields)]
        tables.write(self.path, frame[[*first, *ratios, *middle, *verdict, *fields]])


_recorder: Recorder | None = None


def parser(doc: str) -> argparse.ArgumentParser:
    """The sweep's command line, described by the first line of its module docstring `doc`."""
    cli = argparse.ArgumentParser(description=doc.splitlines()[0])
    cli.add_argument("--out", type=pathlib.Path, default=pathlib.Path("reports"), help="reports root")
    return cli


def dims(form: str, counts: tuple[int, ...]) -> Callable[[str], list[tuple[int, ...]]]:
    """An argparse type for a comma-separated list of "x"-joined positive integers, `counts` of them an item
    ("8192x8192x8192,4096x2112x7168"); a bad item is refused at parse time, naming `form`."""

    def parse(text: str) -> list[tuple[int, ...]]:
        items = []
        for item in text.split(","):
            try:
                values = tuple(int(v) for v in item.split("x"))
            except ValueError:
                values = ()
            if len(values) not in counts or min(values) < 1:
                raise argparse.ArgumentTypeError(f"{form} with positive integers, got {item!r}")
            items.append(values)
        return items

    return parse


def gpu_args(cli: argparse.ArgumentParser, argv: list[str] | None, sweep: str) -> argparse.Namespace:
    """Parse `argv`; exit, naming the `sweep`, where there is no GPU (the interpreter says nothing of launches);
    start recording the sweep's rows."""
    global _recorder
    args = cli.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit(f"{sweep} needs a GPU")
    main = getattr(sys.modules.get("__main__"), "__spec__", None)
    command = " ".join([f"python -m {main.name if main else sweep}", *(sys.argv[1:] if argv is None else argv)])
    _recorder = Recorder(sweep, args.out, command)
    print(f"{sweep}: recording to {_recorder.path}", flush=True)
    return args


def record(config: str, **values: object) -> None:
    """Record one measurement of `config` (its caller prints it)."""
    if _recorder is not None:
        _recorder.add(config, values)


def note(config: str, text: str, **values: object) -> None:
    """A measurement that is not a config of the kernel (a peer, a roof): printed as `text`, recorded."""
    print(text, flush=True)
    record(config, **values)


def time_ms(fn: Callable[[], object], cuda_graph: bool = False) -> float:
    """p50 milliseconds of `fn` after one untimed call (which compiles the kernel for this shape), through
    bench.timing (cold L2; `cuda_graph`: one launch captured and replayed, no host dispatch in the time)."""
    fn()
    return bench(fn, "cuda", cuda_graph=cuda_graph).p50


def timed_or_none(fn: Callable[[], object], config: str, cuda_graph: bool = False) -> float | None:
    """time_ms(fn), or None after a FAILED line (recorded) for `config` where the launch raises (out of shared
    memory etc.)."""
    try:
        return time_ms(fn, cuda_graph)
    except Exception as err:  # a config the GPU cannot run: report, go on
        failed(config, err)
        return None


def checked_ms(
    fn: Callable[[], torch.Tensor], want: torch.Tensor, bound: LossyBound, config: str
) -> tuple[float, str] | None:
    """(ms, verdict): fn()'s output checked against `want` (as mirror and ideal) within the lossy `bound`
    (kernels.tolerances' verdict), then fn timed as a CUDA-graph replay (time_ms); None after a FAILED line for
    `config` where fn raises (a config that does not compile or fit is a line, not the end of the sweep)."""
    try:
        verdict = tolerance_verdict(lossy_metrics(fn(), want, want), bound)
        return time_ms(fn, cuda_graph=True), verdict
    except Exception as err:  # a config the GPU cannot run: report, go on
        failed(config, err)
        return None


def best(label: str, results: list[tuple[float, object]], ratios: Callable[[float], dict[str, float]]) -> None:
    """The sweep's BEST line for `label`: the fastest of `results` ((ms, config) pairs), with ratios(ms)."""
    if results:
        ms, config = min(results)
        shown = ", ".join(f"{value:.3f}x {name}" for name, value in ratios(ms).items())
        print(f"BEST {label}: {config} {ms * 1e3:.1f} us, {shown}", flush=True)


def failed(config: str, err: BaseException) -> None:
    text = f"{type(err).__name__}: {str(err).splitlines()[0][:160] if str(err) else ''}"
    print(f"{config}  FAILED: {text}", flush=True)
    record(config, verdict=f"FAILED: {text}")


def memcpy_gbps(nbytes: int, label: str = "") -> float:
    """GB/s (read + write) of a device-to-device copy of `nbytes` (bench.roofs.measure_memcpy), printed and
    recorded; the roof every config is held to."""
    roof = measure_memcpy("cuda", nbytes)
    note(
        "memcpy roof",
        f"memcpy {nbytes / 2**30:.2f} GiB: {roof.value:.0f} GB/s{f' ({label})' if label else ''}",
        gbps=roof.value,
        bytes=roof.bytes,
        verdict=label,
    )
    return roof.value


def line(config: str, ms: float, ratios: dict[str, float], verdict: str, **rates: float) -> None:
    """One line per config: time, its rates (gbps=, tflops=), each ratio as `0.950x name`, the check's verdict;
    the same as a row."""
    shown = "".join(f"{value:.3f}x {name}  " for name, value in ratios.items())
    rate = "  ".join(f"{value:5.0f} {UNITS[name]}" for name, value in rates.items() if not math.isnan(value))
    print(f"{config}  {ms * 1e3:8.1f} us  {rate}  {shown}{verdict}", flush=True)
    record(config, time_us=ms * 1e3, **rates, **{f"x_{name}": value for name, value in ratios.items()}, verdict=verdict)


def report(config: str, ms: float, moved: int, memcpy: float, exact: bool, **roofs: float) -> None:
    """line() of a bandwidth op: GB/s of the `moved` bytes, the ratio to each other roof's GB/s (e.g. memset=)
    and to memcpy, and the bit-exact check."""
    gbps = moved / ms / 1e6
    ratios = {name: gbps / roof for name, roof in roofs.items()} | {"memcpy": gbps / memcpy}
    line(config, ms, ratios, "exact" if exact else "MISMATCH", gbps=gbps)
