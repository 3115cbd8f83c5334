"""observe_all: many observations at once, exactly as one `observe` each (it reaches into
prometheus_client's Histogram, so an upstream change must fail here)."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Histogram

from blackbox.metrics import LATENESS_BUCKETS, observe_all

AMOUNTS = [0.0, 0.0005, 0.001, 0.0011, 0.02, 0.25, 0.25, 3.0, 59.9, 1e9, 0.001]


def _samples(histogram: Histogram) -> dict[tuple[str, str], float]:
    return {(s.name, s.labels.get("le", "")): s.value
            for metric in histogram.collect() for s in metric.samples
            if not s.name.endswith("_created")}  # fmt: skip


@pytest.mark.parametrize("amounts", [AMOUNTS, [], [0.004] * 1000])
def test_observe_all_counts_as_observe_does(amounts: list[float]) -> None:
    """Each amount lands in the same buckets, sum and count as with `observe` (bounds are
    inclusive: 0.001 belongs to le=0.001)."""
    one_by_one = Histogram("one", "one", buckets=LATENESS_BUCKETS, registry=CollectorRegistry())
    at_once = Histogram("one", "one", buckets=LATENESS_BUCKETS, registry=CollectorRegistry())
    for amount in amounts:
        one_by_one.observe(amount)
    observe_all(at_once, amounts)
    assert _samples(at_once) == _samples(one_by_one)
    assert _samples(at_once)[("one_count", "")] == len(amounts)
