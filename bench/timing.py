"""Time a zero-argument callable: p20/p50/p80 in milliseconds and the number of samples behind them. The one
timing path of the registry's benches and the launch sweeps, and the one quantile function of every report.

GPU (CUDA, ROCm, XPU): `triton.testing.do_bench`, which times every repetition with device events and
flushes L2 with a 256 MB buffer before each one (cold L2; H200 L2 is 50 MB); the flush here reads that buffer
where do_bench's own zeroes it (`clean_flush` says why). It is called with return_mode="all" so that the sample
count is known; the quantiles are then the same linear interpolation do_bench applies when asked for
quantiles=[0.2, 0.5, 0.8]. A CUDA-graph timing (`cuda_graph=True`) captures one call into a graph
and times its replays the same way; `triton.testing.do_bench_cudagraph` does not fit here: it replays many
calls back to back with no L2 flush between them (a decode GEMM's 34 MiB of weights would stay in the 50 MB
L2 and time faster than HBM allows) and returns 10 samples.
CPU: a perf_counter loop with the same shape (estimate, warm up for a time, repeat for a time). Caches are
not flushed: the CPU path exists to exercise the harness, not to judge kernels.

The callable is assumed to have been called once already (the runner calls it for correctness first, which
also pays for compilation and autotuning).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
import warnings
from collections.abc import Callable, Sequence

import numpy as np

from bench.device import synchronize

QUANTILES = (0.2, 0.5, 0.8)
# Warm-up and measurement windows (ms). 25/100 are do_bench's own defaults. The largest MXFP4 case (1 GiB
# in, 1.36 GB moved) takes 0.35 ms on the H200 (reports/cuda-h200/mxfp4_quantize.md) and do_bench counts its
# 256 MB L2 flush (~0.1 ms) inside the window, so 100 ms gives ~240 samples per case, enough for stable
# p20/p80. Wall time per measurement is ~warmup + rep + the estimate calls (~0.15 s), so ~30 measurements per
# MXFP4 sweep cost seconds, not minutes, of a 10-minute slot.
GPU_WARMUP_MS = 25.0
GPU_REP_MS = 100.0
# CPU: the eager MXFP4 reference takes ~0.9 s per call at 8 MiB (measured on the 2-core VM), so the window
# is usually smaller than one call; MIN_SAMPLES then decides the count and the cost (~7 calls per case).
CPU_WARMUP_MS = 25.0
CPU_REP_MS = 100.0
# Fewest samples behind p20/p80 (also enforced on GPU by widening rep for slow calls such as the eager
# reference), and a cap so a sub-microsecond CPU callable does not loop for 10^5 iterations.
MIN_SAMPLES = 5
MAX_SAMPLES = 10_000


@dataclasses.dataclass(frozen=True)
class Timing:
    p20: float
    p50: float
    p80: float
    n_samples: int
    note: str = ""  # how the timing departs from what was asked (e.g. a CUDA graph that could not be captured)


def quantiles(values: Sequence[float], qs: Sequence[float]) -> list[float]:
    """Linear interpolation between closest ranks (numpy's default, and do_bench's); NaN for no values."""
    if not len(values):
        return [math.nan] * len(qs)
    return [float(v) for v in np.quantile(np.asarray(values, dtype=np.float64), qs)]


def summarize(times_ms: Sequence[float]) -> Timing:
    if not times_ms:
        raise ValueError("no samples")
    p20, p50, p80 = quantiles(times_ms, QUANTILES)
    return Timing(p20, p50, p80, len(times_ms))


def _one_call_ms(fn: Callable[[], object], torch_device: str) -> float:
    synchronize(torch_device)
    start = time.perf_counter()
    fn()
    synchronize(torch_device)
    return (time.perf_counter() - start) * 1e3


def clean_flush(cache: object) -> None:
    """L2 flushed by reading do_bench's 256 MB buffer: the timed call finds none of its data in L2, and only
    clean lines. Why not do_bench's own flush (`zero_flush`): it leaves L2 full of dirty lines, and the timed call
    pays their write-back to HBM as its reads evict them, which a decode step does not (the kernels before a GEMV
    mostly read weights). H200, p50 of CUDA-graph replays, zeroed against read (`python -m bench.read_floor` now
    prints both): a lone read of 37.7 MB took 17.1 against 13.7 us, of 53.0 MB 21.4 against 16.4 us, of 185 MB
    53.1 against 44.3 us (4.18 TB/s after the read; the H200 reports' 1 GiB memcpy roof is 4.22); a 1 GiB copy
    795 against 791 us (an A/B at f186571 that timed `bench.read_floor`'s kernel under each flush)."""
    cache.sum()


def zero_flush(cache: object) -> None:
    """do_bench's own L2 flush: the buffer zeroed."""
    cache.zero_()


FLUSHES = {"read": clean_flush, "zero": zero_flush}


@contextlib.contextmanager
def _flushing(flush: str):
    """do_bench's L2 flush replaced by FLUSHES[flush] for the duration: the active driver's `clear_cache`, the one
    hook do_bench flushes through."""
    from unittest import mock

    import triton

    try:
        driver = triton.runtime.driver.active
    except RuntimeError:  # no GPU driver: do_bench cannot run here either (the harness's tests fake it)
        yield
        return
    with mock.patch.object(driver, "clear_cache", FLUSHES[flush]):
        yield


def bench_gpu(
    fn: Callable[[], object], torch_device: str, warmup_ms: float, rep_ms: float, flush: str = "read"
) -> Timing:
    from triton.testing import do_bench  # GPU only; importing triton on CPU-only hosts is not needed

    estimate = _one_call_ms(fn, torch_device)
    rep = max(rep_ms, MIN_SAMPLES * estimate * 1.2)
    with _flushing(flush):
        times = do_bench(fn, warmup=warmup_ms, rep=rep, return_mode="all")
    synchronize(torch_device)
    return summarize(times)


def bench_cpu(fn: Callable[[], object], warmup_ms: float, rep_ms: float) -> Timing:
    estimate = max(_one_call_ms(fn, "cpu"), 1e-6)
    for _ in range(max(1, int(warmup_ms / estimate))):
        fn()
    n_repeat = min(MAX_SAMPLES, max(MIN_SAMPLES, int(rep_ms / estimate)))
    times = []
    for _ in range(n_repeat):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return summarize(times)


def graphed(fn: Callable[[], object], torch_device: str) -> Callable[[], object]:
    """`fn` captured once into a CUDA graph; the returned callable replays it.

    Why: a decode-sized GEMM runs for ~10-50 us while a Python-level op call costs ~30-100 us of host time
    (custom-op dispatch, argument checks, Triton's launcher; measured on the H200 host: a custom op that
    clones 16 floats takes 29 us per call). do_bench's 256 MB flush hides only ~70 us of it, so without a
    graph such rows time the host. Engines replay decode steps from CUDA graphs; so does this, for every
    impl of an op that asks for it (`OpBench.cuda_graph`). Capture runs on a side stream after one eager
    call (the runner's correctness call), as torch.cuda.graph requires.
    """
    import torch

    if not torch_device.startswith("cuda"):
        return fn
    graph = torch.cuda.CUDAGraph()
    # A capture that records no kernel (work on the host or on another stream) would replay as nothing and time
    # as impossibly fast: refuse it. torch only warns of it, also while a failed capture unwinds (then the
    # capture's own error is what the caller reports).
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.cuda.graph(graph):
            fn()
    if any("CUDA Graph is empty" in str(w.message) for w in caught):
        raise RuntimeError("the CUDA graph captured no GPU work")
    for w in caught:  # anything else is passed on as it came
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return graph.replay


def bench(
    fn: Callable[[], object],
    torch_device: str,
    *,
    warmup_ms: float | None = None,
    rep_ms: float | None = None,
    cuda_graph: bool = False,
    flush: str = "read",
) -> Timing:
    """Time `fn` on `torch_device` ('cuda' for CUDA and ROCm, 'xpu', 'cpu'); `cuda_graph` times a replay; `flush`:
    how L2 is flushed before each repetition on a GPU (FLUSHES)."""
    if torch_device == "cpu":
        return bench_cpu(fn, warmup_ms or CPU_WARMUP_MS, rep_ms or CPU_REP_MS)
    note = ""
    if cuda_graph:
        try:
            fn = graphed(fn, torch_device)
        except Exception as err:  # not capturable (a host sync, an unsupported op): time it eagerly, say so
            synchronize(torch_device)
            note = f"timed without a CUDA graph ({type(err).__name__}: {str(err).splitlines()[0][:120]})"
    timing = bench_gpu(fn, torch_device, warmup_ms or GPU_WARMUP_MS, rep_ms or GPU_REP_MS, flush)
    return dataclasses.replace(timing, note=note)
