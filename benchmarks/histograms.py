"""The service's lateness histograms, read from its /metrics by a benchmark."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

# One histogram read at one instant: cumulative counts by upper bound (le, seconds), and
# the sum of what was observed (seconds).
Reading = tuple[dict[float, float], float]
NOTHING: Reading = ({}, 0.0)
Histograms = dict[str, Reading]
HISTOGRAMS = {"send": "blackbox_send_lateness_seconds", "ack": "blackbox_lateness_seconds"}


def scrape(port: int) -> Histograms:
    """The service's lateness histograms now: `send` (handed to the producer) and `ack`."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    found: Histograms = {}
    for name, family in HISTOGRAMS.items():
        buckets, total = {}, 0.0
        for sample in families[family].samples:
            if sample.name.endswith("_bucket"):
                buckets[float(sample.labels["le"])] = sample.value
            elif sample.name.endswith("_sum"):
                total = sample.value
        found[name] = (buckets, total)
    return found


def between(now: Reading, before: Reading = NOTHING) -> dict[str, float | None]:
    """What was observed between two readings: count, mean (ms), and the bucket bounds (ms)
    under which half and 99% fell (None past the last bound)."""
    counts = {le: n - before[0].get(le, 0.0) for le, n in now[0].items()}
    total = counts.get(float("inf"), 0.0)
    if total == 0:
        return {"count": 0, "mean": None, "p50_under": None, "p99_under": None}
    return {"count": int(total), "mean": round(1000 * (now[1] - before[1]) / total, 2),
            "p50_under": _bound(counts, 0.5 * total),
            "p99_under": _bound(counts, 0.99 * total)}  # fmt: skip


def _bound(counts: dict[float, float], reached: float) -> float | None:
    """The lowest bucket bound (ms) with at least `reached` observations at or under it."""
    bound = min(le for le, n in counts.items() if n >= reached)
    return None if bound == float("inf") else 1000 * bound
