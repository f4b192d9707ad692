"""The server's step-batched histogram (runner.server.metrics.BatchHistogram) renders exactly what
prometheus_client's own Histogram does for the same values, bucket edges included."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from runner.server.metrics import ITL_BUCKETS, BatchHistogram

EDGES = st.sampled_from(ITL_BUCKETS)  # values on a bucket's bound must land in that bucket ("le")
VALUES = st.lists(st.one_of(EDGES, st.floats(0, 20, allow_nan=False)), max_size=40)


def _samples(registry: CollectorRegistry) -> list[str]:
    text = generate_latest(registry).decode()
    return [line for line in text.splitlines() if not line.startswith("#") and "_created" not in line]


@given(steps=st.lists(VALUES, max_size=5))
def test_batch_histogram_renders_as_prometheus_client(steps):
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    batch = BatchHistogram("itl", "gaps", ITL_BUCKETS)
    ours.register(batch)
    reference = Histogram("itl", "gaps", buckets=ITL_BUCKETS, registry=theirs)
    for values in steps:
        batch.observe_many(values)
        for v in values:
            reference.observe(v)
    assert _samples(ours) == _samples(theirs)
