"""Every metric blackbox exports: `blackbox_` prefix, base units, closed label sets.

Metrics live on a registry the caller owns (one per Service), never the global one, so
tests and several services in one process do not share counts.
"""

from __future__ import annotations

import collections
from bisect import bisect_left
from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info

from blackbox.errors import DeadLetterReason
from blackbox.version import version

# From 0.1 ms: firing at the due instant is measured below a millisecond, late outliers to
# a minute.
LATENESS_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0015, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip


class Metrics:
    """The service's counters and histograms on one registry."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.intake_records = Counter(
            "blackbox_intake_records",
            "Intake records handled, by outcome (scheduled, updated, cancelled, ...).",
            ["outcome"],
            registry=self.registry,
        )
        self.dead_letters = Counter(
            "blackbox_dead_letters",
            "Records sent to the dead-letter topic, by reason.",
            ["reason"],
            registry=self.registry,
        )
        self.retries_scheduled = Counter(
            "blackbox_retries_scheduled",
            "Consumers' retries newly scheduled for another attempt, by the topic they go to.",
            ["topic"],
            registry=self.registry,
        )
        self.retries_exhausted = Counter(
            "blackbox_retries_exhausted",
            "Consumers' retries past their last attempt, newly scheduled to their "
            "dead-letter topic, by that topic.",
            ["topic"],
            registry=self.registry,
        )
        self.delivered = Counter(
            "blackbox_delivered",
            "Messages acknowledged by their target topic.",
            registry=self.registry,
        )
        self.delivery_failures = Counter(
            "blackbox_delivery_failures",
            "Deliveries the broker did not acknowledge, by kind (transient or lasting).",
            ["kind"],
            registry=self.registry,
        )
        self.lateness = Histogram(
            "blackbox_lateness_seconds",
            "Delivery acknowledgement time minus due time.",
            buckets=LATENESS_BUCKETS,
            registry=self.registry,
        )
        self.send_lateness = Histogram(
            "blackbox_send_lateness_seconds",
            "Time a due message was handed to the producer minus its due time: the "
            "scheduler's own part of the lateness, before the broker's.",
            buckets=LATENESS_BUCKETS,
            registry=self.registry,
        )
        self.dependency_errors = Counter(
            "blackbox_dependency_errors",
            "Failed calls to Redis or Kafka that were backed off and retried, by dependency.",
            ["dependency"],
            registry=self.registry,
        )
        self.series_passed = Counter(
            "blackbox_series_passed",
            "Claims of a series that passed over occurrences: missed (by its policy) or paused.",
            registry=self.registry,
        )
        self.events_dropped = Counter(
            "blackbox_events_dropped",
            "Answers that never reached the events topic (refused, or pending at stop); logged.",
            registry=self.registry,
        )
        self.store_records = Counter(
            "blackbox_store_records",
            "Records written to the store topic: a schedule's version, or a tombstone.",
            ["kind"],
            registry=self.registry,
        )
        self.store_reads = Counter(
            "blackbox_store_reads",
            "Store records index mode read back by place: from this process's cache, or "
            "from the store topic.",
            ["source"],
            registry=self.registry,
        )
        self.store_missing = Counter(
            "blackbox_store_records_missing",
            "Schedules whose store record was not where Redis's reference said when they "
            "fell due (index mode): dead-lettered as store_record_missing.",
            registry=self.registry,
        )
        self.store_failures = Counter(
            "blackbox_store_write_failures",
            "Tombstones and versions firing wrote to the store topic that it refused; "
            "logged (a rebuild passes over what the target topics show delivered).",
            registry=self.registry,
        )
        self.redis_used_memory = Gauge(
            "blackbox_redis_used_memory_bytes",
            "Memory Redis uses (INFO used_memory), read by the readiness probe.",
            registry=self.registry,
        )
        self.redis_maxmemory = Gauge(
            "blackbox_redis_maxmemory_bytes",
            "Redis's maxmemory: past it intake waits while firing drains; 0 means no limit.",
            registry=self.registry,
        )
        self.redis_full = Gauge(
            "blackbox_redis_full",
            "1 while Redis refuses intake's writes for memory (over maxmemory): intake waits, "
            "firing drains it.",
            registry=self.registry,
        )
        self.pending = Gauge(
            "blackbox_pending_messages",
            "Schedules in Redis, by state (due: in the set by due time; in_flight: leased).",
            ["state"],
            registry=self.registry,
        )
        self.owned_shards = Gauge(
            "blackbox_owned_shards",
            "Shards this firing process fires (its share among the live firers); 0: more "
            "firers than shards, and this one only sweeps (raise BLACKBOX_SHARDS).",
            registry=self.registry,
        )
        self.redis_gaps = Counter(
            "blackbox_redis_gaps",
            "Intake partitions found behind what their group committed, by kind (lag: a "
            "failover's, read again; lost data: flushed, Redis came back without its clock; "
            "restored, its clock went back beyond BLACKBOX_REDIS_MAX_LAG; far_behind, a gap "
            "over BLACKBOX_REREAD_LIMIT; no_watermark, no trace of committed offsets; "
            "aged_out, a gap whose first records Kafka no longer holds; deleted_unread, "
            "committed offsets below what Kafka holds).",
            ["kind"],
            registry=self.registry,
        )
        self.trace_headers_dropped = Counter(
            "blackbox_trace_headers_dropped",
            "Trace context headers of intake records dropped as malformed or repeated, by "
            "header (traceparent, tracestate, baggage); the request is taken without them.",
            ["header"],
            registry=self.registry,
        )
        self.reread_records = Counter(
            "blackbox_intake_reread_records",
            "Intake records read again because Redis held less than the group committed "
            "(a failover's lag, a restart's margin): at most, the gaps' sizes.",
            registry=self.registry,
        )
        self.firing_held_for_lost_data = Gauge(
            "blackbox_firing_held_for_lost_data",
            "1 while this process's firing claims nothing because Redis lost data (flushed, "
            "restarted empty, an older snapshot restored: firing_held in the log), else 0.",
            registry=self.registry,
        )
        self.redeliveries_passed_over = Counter(
            "blackbox_redeliveries_passed_over",
            "Deliveries claimed again after Redis changed under firing (a failover lost their "
            "acks) that the target topics show delivered: settled, not produced again.",
            registry=self.registry,
        )
        self.given_up_records = Counter(
            "blackbox_intake_given_up_records",
            "Intake records whose schedules Redis lost and the operator chose to give up "
            "(BLACKBOX_REDIS_LOSS=skip), or that Kafka no longer held to be read again.",
            registry=self.registry,
        )
        self.stopped_partitions = Gauge(
            "blackbox_intake_stopped_partitions",
            "Intake partitions not read because Redis lost their data (BLACKBOX_REDIS_LOSS="
            "stop): rebuild Redis from Kafka, or choose reread or skip.",
            registry=self.registry,
        )
        self.role = Info(
            "blackbox_role",
            "The role this process runs (all, intake or dispatch), as the label of a 1.",
            registry=self.registry,
        )
        self.build_info = Gauge(
            "blackbox_build_info",
            "The release this process runs (its version, as `blackbox --version` prints "
            "it), as the label of a 1: a fleet mid-upgrade shows both.",
            ["version"],
            registry=self.registry,
        )
        self.build_info.labels(version=version()).set(1)
        for reason in DeadLetterReason:
            self.dead_letters.labels(reason=reason.value)
        for kind in ("lag", "flushed", "restored", "far_behind", "no_watermark", "aged_out",
                     "deleted_unread"):  # fmt: skip
            self.redis_gaps.labels(kind=kind)

    def value(self, name: str, labels: dict[str, str] | None = None) -> float:
        """A sample's current value (0 when never set), for tests and the admin page."""
        return self.registry.get_sample_value(name, labels or {}) or 0.0


def observe_all(histogram: Histogram, amounts: Sequence[float]) -> None:
    """Observe each of `amounts`, as `histogram.observe` would one by one, taking one lock
    per bucket touched and one for the sum instead of two per amount (firing observes two
    histograms per message). Reaches into prometheus_client's Histogram (its bounds,
    buckets and sum): tests/unit/test_metrics.py pins the result to `observe`'s."""
    if not amounts:
        return
    bounds = histogram._upper_bounds
    histogram._sum.inc(sum(amounts))
    for index, count in collections.Counter(bisect_left(bounds, a) for a in amounts).items():
        histogram._buckets[index].inc(count)
