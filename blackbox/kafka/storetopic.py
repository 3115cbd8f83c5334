"""The store topic: each pending schedule's latest version, on a compacted topic keyed by
its id, and a tombstone once it ends (fired, cancelled, dead-lettered, a series completed).

Kafka then keeps what is pending, not every request ever sent: a rebuild reads the store
(intake/rebuild.py) and the intake topic need keep only the window a re-read can need.

The store is written ahead of Redis, so it is never behind it: intake sends a batch's
versions (and the tombstones of its cancels) and waits for the broker's acknowledgement
before applying the batch in Redis, and where Redis then did something else than asked
(an `if_absent` create of a pending id, a re-read, a move of a series) it writes what
Redis holds. Firing writes a tombstone after the target topic acknowledged a delivery and
Redis forgot the id, or a series' next occurrence once it is stored: a crash in between
leaves a version the target topic shows delivered, which a rebuild passes over. Every
version of an id is written by the intake's producer, then by firing's: both keep it on
one partition (the key's), in the order Redis saw it.

The value is the schedule's stored encoding (schedule.py), byte for byte what Redis holds.
A tombstone says how its schedule ended in its `blackbox-ended` header (`fired`, which
dead-lettered counts as, or `cancelled`), so a rebuild gives a caller's id its ended
marker back while the tombstone is kept (`delete.retention.ms`, a day by default).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import structlog

from blackbox.errors import BlackboxError
from blackbox.kafka import readback
from blackbox.kafka.outbox import Outbox, Record, Reports
from blackbox.metrics import Metrics
from blackbox.schedule import Schedule

log = structlog.get_logger("blackbox.kafka.storetopic")


# The key of the record saying the store holds every schedule pending when it was written
# and every version since (intake/filling.py): no schedule id starts with a NUL.
FILLED_KEY = b"\x00blackbox/filled"
ENDED_HEADER = "blackbox-ended"
FIRED, CANCELLED = b"fired", b"cancelled"


class StoreUnavailable(BlackboxError):
    """The store topic did not acknowledge a batch's versions: the batch must be retried."""


def version(schedule: Schedule, topic: str) -> Record:
    """The store record of a schedule's version: its id as the key, its encoding."""
    return Record(topic, schedule.encode(), schedule.id.encode("utf-8"))


def tombstone(schedule_id: str, topic: str, how: bytes | None = None) -> Record:
    """The store record of an ended schedule: its id, no value, and how it ended (`FIRED`,
    `CANCELLED`, or None: not told)."""
    headers = [(ENDED_HEADER, how)] if how is not None else []
    return Record(topic, None, schedule_id.encode("utf-8"), headers)


def schedule_of(key: bytes | None, value: bytes | None) -> Schedule | None:
    """The schedule a store record holds; None for a tombstone. Raises CorruptSchedule
    for a value no release of blackbox wrote."""
    if key is None or value is None:
        return None
    return Schedule.decode(key.decode("utf-8"), value)


@dataclass(frozen=True, slots=True)
class Ended:
    """A schedule's tombstone in the store topic: when it was written, and whether a
    cancel ended it."""

    id: str
    written_ms: int
    cancelled: bool


@dataclass(frozen=True, slots=True)
class Kept:
    """A schedule's latest version in the store topic, and where it lies there."""

    id: str
    value: bytes
    partition: int
    offset: int
    written_ms: int  # the record's timestamp


@dataclass(frozen=True, slots=True)
class Contents:
    """What a store topic holds: each id's latest version, by partition and offset; the ids
    whose latest record is a tombstone telling how it ended; whether it was filled."""

    kept: list[Kept]
    ended: list[Ended]
    filled: bool


def filled_record(topic: str, namespace: str, at_ms: int) -> Record:
    """The record saying the store holds every schedule of `namespace` (FILLED_KEY)."""
    value = orjson.dumps({"namespace": namespace, "filled_ms": at_ms})
    return Record(topic, value, FILLED_KEY)


def read(config: Mapping[str, Any], topic: str) -> Contents:
    """The store topic read to its end."""
    latest: dict[bytes, Kept | Ended | None] = {}
    filled = False
    for message, _ in readback.records(config, readback.extents_of(config, [topic])):
        key, value = message.key(), message.value()
        if key == FILLED_KEY:
            filled = filled or value is not None
            continue
        if key is None:
            continue
        schedule_id, stamp = key.decode("utf-8", "replace"), message.timestamp()[1]
        if value is not None:
            latest[key] = Kept(schedule_id, value, message.partition() or 0,
                               message.offset() or 0, stamp)  # fmt: skip
            continue
        how = dict(message.headers() or []).get(ENDED_HEADER)
        known = how in (FIRED, CANCELLED)
        latest[key] = Ended(schedule_id, stamp, how == CANCELLED) if known else None
    kept = [k for k in latest.values() if isinstance(k, Kept)]
    ended = [e for e in latest.values() if isinstance(e, Ended)]
    return Contents(sorted(kept, key=lambda k: (k.partition, k.offset)), ended, filled)


class StoreTopic:
    """Writes versions and tombstones to the store topic through an outbox."""

    def __init__(self, topic: str, outbox: Outbox, metrics: Metrics) -> None:
        self.topic = topic
        self.outbox = outbox
        self.metrics = metrics
        self._unchecked: list[tuple[Reports, int]] = []
        self._lock = threading.Lock()

    def records(
        self, latest: Iterable[tuple[str, Schedule | None]], how: bytes | None = None
    ) -> list[Record]:
        """A version for each (id, schedule), a tombstone (ended `how`) where the schedule
        is None."""
        return [
            tombstone(schedule_id, self.topic, how) if s is None else version(s, self.topic)
            for schedule_id, s in latest
        ]

    def write(self, records: Sequence[Record], stop: threading.Event | None = None) -> None:
        """Send `records` and wait until the broker acknowledged each (StoreUnavailable)."""
        if not records:
            return
        errors = [e for e in self.outbox.send(records, stop) if e is not None]
        if errors:
            raise StoreUnavailable(
                f"the store topic {self.topic!r} did not acknowledge {len(errors)} of "
                f"{len(records)} records: {errors[0].str()}"
            )
        self._count(records)

    def write_placed(
        self, records: Sequence[Record], stop: threading.Event | None = None
    ) -> list[tuple[int, int]]:
        """As `write`, and where each record landed, (partition, offset), in order (an
        outbox reporting every record: index mode's references name the place)."""
        if not records:
            return []
        reports = self.outbox.place(records, stop)
        errors = [e for e in reports.errors if e is not None]
        if errors or any(p is None for p in reports.places):
            shown = errors[0].str() if errors else "no place reported"
            raise StoreUnavailable(
                f"the store topic {self.topic!r} did not acknowledge {len(errors) or 1} of "
                f"{len(records)} records: {shown}"
            )
        self._count(records)
        return [p for p in reports.places if p is not None]

    def write_behind(self, records: Sequence[Record]) -> None:
        """Send `records` without waiting; refusals are counted and logged later."""
        if not records:
            return
        reports = self.outbox.submit(records)
        with self._lock:
            self._unchecked.append((reports, len(records)))
            self._check(settled=lambda r: r.pending == 0)
        self._count(records)

    def settle(self, wait_seconds: float) -> None:
        """Wait for what was written behind, counting its refusals (at a stop)."""
        with self._lock:
            for reports, _ in self._unchecked:
                self.outbox.wait(reports, seconds=wait_seconds)
            self._check(settled=lambda _r: True)

    def _check(self, settled: Callable[[Reports], bool]) -> None:
        left = []
        for reports, size in self._unchecked:
            if not settled(reports):
                left.append((reports, size))
                continue
            failed = [e for e in reports.errors if e is not None]
            if failed:
                self.metrics.store_failures.inc(len(failed))
                log.error("store_write_failed", topic=self.topic, count=len(failed),
                          of=size, error=failed[0].str())  # fmt: skip
        self._unchecked = left

    def _count(self, records: Sequence[Record]) -> None:
        ended = sum(1 for r in records if r.value is None)
        if ended:
            self.metrics.store_records.labels(kind="tombstone").inc(ended)
        if len(records) > ended:
            self.metrics.store_records.labels(kind="version").inc(len(records) - ended)
