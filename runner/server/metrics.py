"""/metrics: a Prometheus registry of the server's own (not the process-global default one, so two servers in
one process never clash).

Gauges read at scrape time from the engine thread's last snapshot (runner.engine.messages.CoreLoad):
requests running / waiting, KV blocks usable / free / in use, the prefix cache's hit rate over prompt tokens
(and its two counters), and the requests the server holds (live: submitted, not yet released by their
handler). Histograms: time to first token (from the request's arrival at the handler to the engine step that
produced its first token) and inter-token latency (between a request's consecutive tokens; k tokens arriving in
one step count k gaps of (now - last) / k). Counters: finished requests by reason, prompt and generated tokens.
The process collector adds process_resident_memory_bytes (the load test's memory check reads it).
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

if TYPE_CHECKING:
    from runner.engine.messages import CoreLoad

PREFIX = "touchstone"
TTFT_BUCKETS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 60, 120)
ITL_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10)


class _EngineCollector:
    def __init__(self, load: Callable[[], CoreLoad], live: Callable[[], int]) -> None:
        self.load, self.live = load, live

    def collect(self):
        s = self.load()
        for name, doc, value in (
            ("num_requests_running", "requests the scheduler is running", s.running),
            ("num_requests_waiting", "requests waiting to be scheduled", s.waiting),
            ("kv_blocks_usable", "KV-cache blocks (the null block excluded)", s.blocks_usable),
            ("kv_blocks_free", "KV-cache blocks in the free queue (cached ones nobody holds included)", s.blocks_free),
            ("kv_blocks_in_use", "KV-cache blocks held by requests", s.blocks_usable - s.blocks_free),
            (
                "prefix_cache_hit_rate",
                "prompt tokens found in the prefix cache / prompt tokens looked up",
                s.prefix_hit_tokens / s.prefix_queried_tokens if s.prefix_queried_tokens else 0.0,
            ),
            ("server_live_requests", "requests the server holds (submitted, not yet released)", self.live()),
        ):
            yield GaugeMetricFamily(f"{PREFIX}_{name}", doc, value=value)
        yield CounterMetricFamily(
            f"{PREFIX}_prefix_cache_queried_tokens",
            "prompt tokens looked up in the prefix cache",
            value=s.prefix_queried_tokens,
        )
        yield CounterMetricFamily(
            f"{PREFIX}_prefix_cache_hit_tokens", "prompt tokens found in the prefix cache", value=s.prefix_hit_tokens
        )
        for name, doc, value in (
            ("engine_steps", "engine steps", s.steps),
            ("engine_decode_steps", "engine steps of decodes only (a CUDA graph's)", s.decode_steps),
            ("engine_batched_tokens", "tokens the engine steps computed", s.batched_tokens),
            ("engine_step_seconds", "wall seconds the engine core spent stepping", s.step_s),
        ):
            yield CounterMetricFamily(f"{PREFIX}_{name}", doc, value=value)


class BatchHistogram:
    """A Prometheus histogram observed a step's values at a time (one numpy call, where prometheus_client's
    Histogram takes a locked Python call a value: ~1 s of the server's thread for 131,072 tokens under cProfile)."""

    def __init__(self, name: str, doc: str, buckets: tuple[float, ...]) -> None:
        self.name, self.doc, self.bounds = name, doc, np.asarray(buckets, dtype=np.float64)
        self.counts = np.zeros(len(buckets) + 1, dtype=np.int64)  # the last: above every bound (+Inf)
        self.total = 0.0

    def observe_many(self, values: list[float]) -> None:
        if values:
            v = np.asarray(values, dtype=np.float64)
            # Prometheus buckets are "le": a value lands in the first bucket whose bound is >= it
            self.counts += np.bincount(np.searchsorted(self.bounds, v, side="left"), minlength=len(self.counts))
            self.total = functools.reduce(operator.add, values, self.total)  # in order, as observe() would

    def collect(self):
        cumulative = np.cumsum(self.counts).tolist()
        buckets = [(repr(float(b)), c) for b, c in zip(self.bounds.tolist(), cumulative, strict=False)]
        yield HistogramMetricFamily(
            self.name, self.doc, buckets=[*buckets, ("+Inf", cumulative[-1])], sum_value=self.total
        )


class Metrics:
    def __init__(self, load: Callable[[], CoreLoad], live: Callable[[], int]) -> None:
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)
        self.ttft = Histogram(
            f"{PREFIX}_time_to_first_token_seconds",
            "arrival to the first generated token",
            buckets=TTFT_BUCKETS,
            registry=self.registry,
        )
        self.itl = BatchHistogram(
            f"{PREFIX}_inter_token_latency_seconds", "gap between a request's consecutive tokens", ITL_BUCKETS
        )
        self.registry.register(self.itl)
        self.finished = Counter(
            f"{PREFIX}_requests_finished", "finished requests by reason", ["finish_reason"], registry=self.registry
        )
        self.prompt_tokens = Counter(
            f"{PREFIX}_prompt_tokens", "prompt tokens of accepted requests", registry=self.registry
        )
        self.generation_tokens = Counter(f"{PREFIX}_generation_tokens", "generated tokens", registry=self.registry)
        self.registry.register(_EngineCollector(load, live))

    def render(self) -> bytes:
        return generate_latest(self.registry)


def parse(text: str) -> dict[str, float]:
    """{sample name (labels appended as name{k="v"}): value} from the text format (tests, the bench), read with
    prometheus_client's own parser."""
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sample.labels.items())
            out[sample.name + (f"{{{labels}}}" if labels else "")] = sample.value
    return out
