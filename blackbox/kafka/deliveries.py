"""Deliveries: what blackbox already delivered, read back from the target topics.

Every record blackbox produces carries `blackbox-id`, and `blackbox-version` for a caller's
id (the intake record of that version); a series occurrence carries `blackbox-occurrence-ms`.
A rebuild of a lost Redis (intake/rebuild.py) reads them so that nothing delivered before is
written back: a one-off version delivered is done, and a series goes on after the latest
occurrence delivered, its count the occurrences delivered.

A delivery counts only for a schedule of the topic it sits on (keys are (topic, id,
version)), and blackbox's own headers come after the sender's, so the last of each name is
read: a caller cannot hide another caller's schedule by writing its id to a topic of its
own, or among the headers of what it schedules. Whoever can write to a target topic can
still pass over that topic's schedules: keep write access to blackbox.

A target topic whose retention removed records no longer shows what was delivered before
its oldest kept record: `kept_from_ms` says from when on it does (per topic).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import structlog
from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, Message

from blackbox.clock import now_ms
from blackbox.kafka import readback
from blackbox.kafka.clients import read_headers

log = structlog.get_logger("blackbox.kafka.deliveries")

ID, VERSION, OCCURRENCE = "blackbox-id", "blackbox-version", "blackbox-occurrence-ms"
MAX_MS = 2**63 - 1  # a due time as a payload encodes it: 64 bits, signed
MAX_DIGITS = 19


class BadHeader(ValueError):
    """A blackbox header no record blackbox produced carries (forged or corrupt)."""


@dataclass(slots=True)
class Delivered:
    """The occurrences of one version delivered (one-offs: a single None)."""

    occurrences: set[int | None] = field(default_factory=set)
    delivered_ms: int = 0  # the latest delivered record's timestamp

    def add(self, occurrence: int | None, stamp: int) -> None:
        self.occurrences.add(occurrence)
        self.delivered_ms = max(self.delivered_ms, stamp)

    @property
    def latest(self) -> int | None:
        found = [o for o in self.occurrences if o is not None]
        return max(found) if found else None


Key = tuple[str, str, str]  # (target topic, blackbox-id, version)
Versions = dict[Key, Delivered]


@dataclass(slots=True)
class Deliveries:
    """What the target topics read so far show delivered."""

    versions: Versions = field(default_factory=dict)
    kept_from_ms: dict[str, int] = field(default_factory=dict)  # topic -> oldest kept, ms
    skipped: int = 0  # records whose blackbox headers are out of bounds

    def merge(self, other: Deliveries) -> None:
        self.versions.update(other.versions)
        self.kept_from_ms.update(other.kept_from_ms)
        self.skipped += other.skipped


def key_of(topic: str, headers: Iterable[tuple[str, Any]]) -> tuple[Key, int | None] | None:
    """(topic, id, version) and the occurrence a delivered record's headers name (the last
    of each name); None for a record blackbox did not produce; BadHeader for an occurrence
    that is no due time. The version of an id without one is the id itself."""
    found: dict[str, bytes] = {}
    for name, value in headers:
        if name in (ID, VERSION, OCCURRENCE) and isinstance(value, bytes):
            found[name] = value
    if ID not in found:
        return None
    blackbox_id = found[ID].decode("utf-8", "replace")
    version = found[VERSION].decode("utf-8", "replace") if VERSION in found else blackbox_id
    occurrence = found.get(OCCURRENCE)
    return (topic, blackbox_id, version), None if occurrence is None else due_time(occurrence)


def due_time(text: bytes) -> int:
    """An epoch-ms header value: ASCII digits within 64 bits, else BadHeader."""
    if not (text.isdigit() and len(text) <= MAX_DIGITS) or int(text) > MAX_MS:
        raise BadHeader(f"not a due time: {text[:40]!r}")
    return int(text)


def read(config: Mapping[str, Any], topics: Iterable[str]) -> Deliveries:
    """Every version delivered to `topics`, read from their start to their end now;
    readback.Unreadable for a topic the broker will not let us read."""
    found, started = Deliveries(), now_ms()
    bounds = readback.extents_of(config, topics)
    first: set[tuple[str, int]] = set()
    for message, extent in readback.records(config, bounds):
        _take(message, found)
        where = (message.topic() or "", message.partition() or 0)
        if extent.low > 0 and where not in first:
            first.add(where)
            _note_oldest(message, found, started)
    for (topic, _), extent in bounds.items():
        if 0 < extent.low == extent.high:  # retention emptied it: nothing can be told
            found.kept_from_ms[topic] = started
    log.info("deliveries_read", topics=sorted(set(topics)), versions=len(found.versions),
             kept_from_ms=found.kept_from_ms, skipped=found.skipped)  # fmt: skip
    return found


def read_since(config: Mapping[str, Any], topics: Iterable[str], since_ms: int) -> Deliveries:
    """Every version delivered to `topics` from `since_ms` (by record time) to their end
    now: what a window after a failover looks up (firing/rechecks.py); readback.Unreadable
    for a topic the broker will not let us read."""
    found = Deliveries()
    bounds = readback.extents_since(config, topics, since_ms)
    for message, _ in readback.records(config, bounds):
        _take(message, found)
    log.info("deliveries_read", topics=sorted(set(topics)), since_ms=since_ms,
             versions=len(found.versions), skipped=found.skipped)  # fmt: skip
    return found


def _take(message: Message, found: Deliveries) -> None:
    topic = message.topic() or ""
    try:
        keyed = key_of(topic, read_headers(message) or [])
    except BadHeader as e:
        found.skipped += 1
        log.warning("delivery_record_skipped", topic=topic, partition=message.partition(),
                    offset=message.offset(), error=str(e))  # fmt: skip
        return
    if keyed is not None:
        key, occurrence = keyed
        _, stamp = message.timestamp()
        found.versions.setdefault(key, Delivered()).add(occurrence, max(stamp, 0))


def _note_oldest(message: Message, found: Deliveries, started: int) -> None:
    """A partition's first record kept after retention removed some: what was delivered to
    the topic before its time cannot be told (the latest such time over its partitions)."""
    kind, stamp = message.timestamp()
    kept = started if kind == TIMESTAMP_NOT_AVAILABLE else stamp
    topic = message.topic() or ""
    found.kept_from_ms[topic] = max(found.kept_from_ms.get(topic, 0), kept)
