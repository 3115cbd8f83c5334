"""Rechecks: after Redis changed under firing, what the target topics show delivered lately
is not delivered again.

A failover to an asynchronous replica loses the primary's newest writes, among them the
acks of what fired during the lag: the promoted replica holds those schedules due again,
and intake's re-read of its gap writes back those it lacked (gaps.py). Kafka holds the
deliveries themselves, each with its `blackbox-id` and version (kafka/deliveries.py). So
when firing meets another Redis behind a node (its run id changed: a failover, or a
restart that may have lost its last second), its shards open a window: for
BLACKBOX_REDIS_MAX_LAG after, each schedule claimed there that was due before the window
opened is looked up among what its target topic shows delivered since the longest lag
before it (each topic read once per window, from the offset of that time: the cost follows
the lag's span, not the topic's size). One found is settled as delivered, unproduced.

An intake that reads a gap again leaves a recheck mark in the shards' clocks (clocks.py),
from the time Redis lost data until the re-read can be over: each claim reads it back, and
a shard's first claim that meets a new one opens a window over its span. So the operator's
BLACKBOX_REDIS_LOSS=reread after a flush or a restore, and a failover's re-read, deliver
nothing that Kafka shows delivered, whichever process fires.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog
from confluent_kafka import KafkaException

from blackbox.kafka import deliveries, readback
from blackbox.kafka.deliveries import Deliveries
from blackbox.schedule import Schedule

log = structlog.get_logger("blackbox.firing.rechecks")

# Reads what `topics` show delivered since an epoch ms (deliveries.read_since).
Reader = Callable[[Mapping[str, Any], Iterable[str], int], Deliveries]


@dataclass(slots=True)
class Window:
    """One shard's recheck after Redis changed at `opened_ms`: schedules due by then are
    looked up among what their topics show delivered since `since_ms`, until `until_ms`."""

    since_ms: int
    opened_ms: int
    until_ms: int
    found: Deliveries = field(default_factory=Deliveries)
    read: set[str] = field(default_factory=set)  # the topics read so far


class Rechecks:
    """The windows open per shard, and what their topics showed delivered."""

    def __init__(
        self, kafka: Mapping[str, Any], max_lag_ms: int, read: Reader = deliveries.read_since
    ) -> None:
        self.kafka = kafka
        self.max_lag_ms = max_lag_ms
        self._read = read
        self.windows: dict[int, Window] = {}

    def open(
        self, shards: Iterable[int], now_ms: int, since_ms: int | None = None,
        until_ms: int | None = None,
    ) -> None:  # fmt: skip
        """Redis changed behind `shards` at `now_ms`: recheck what falls due there by then
        against what was delivered since `since_ms` (default: the longest lag before), until
        `until_ms` (default: the longest lag after)."""
        since = now_ms - self.max_lag_ms if since_ms is None else since_ms
        until = now_ms + self.max_lag_ms if until_ms is None else until_ms
        window = Window(since, now_ms, until)
        for open_window in self.windows.values():  # one change met shard by shard: read once
            if open_window.since_ms == since:
                window = open_window
                window.opened_ms = max(window.opened_ms, now_ms)
                window.until_ms = max(window.until_ms, until)
        for shard in shards:
            self.windows[shard] = window

    def delivered(self, shard: int, schedules: Sequence[Schedule], now_ms: int) -> set[int]:
        """The indexes of `schedules` (claimed in `shard`) that Kafka shows delivered."""
        window = self.windows.get(shard)
        if window is None:
            return set()
        if now_ms > window.until_ms:
            del self.windows[shard]
            return set()
        due = [(n, s) for n, s in enumerate(schedules) if s.due_ms <= window.opened_ms]
        unread = {s.topic for _, s in due} - window.read
        if unread:
            window.read |= unread
            try:
                window.found.merge(self._read(self.kafka, unread, window.since_ms))
            except (readback.Unreadable, KafkaException) as e:  # delivered: at least once
                log.warning("recheck_failed", topics=sorted(unread), error=str(e),
                            why="what the topics show cannot be read: delivered again")  # fmt: skip
        found = {n for n, s in due if _shown(window.found, s)}
        if found:
            log.warning("redelivery_passed_over", shard=shard, count=len(found),
                        why="delivered before Redis changed: a failover lost its ack")  # fmt: skip
        return found


def _shown(found: Deliveries, schedule: Schedule) -> bool:
    """Whether `found` holds `schedule`'s version (and, for a series, this occurrence)."""
    version = schedule.origin or schedule.id
    delivered = found.versions.get((schedule.topic, schedule.id, version))
    if delivered is None:
        return False
    occurrence = None if schedule.series is None else schedule.series.occurrence_ms
    return occurrence in delivered.occurrences
