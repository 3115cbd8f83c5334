"""Keeping: the intake's writes to the store topic, ahead of Redis and after it.

Ahead (before a part of a poll is applied in Redis, waiting for the broker): the version
each request asks for, as intake.lua will write it, or a tombstone for a cancel. After
(before the poll's offsets are committed): where Redis did something else than asked (a
request read again, an `if_absent` create of an id pending or ended, a move of a series or
of an id not pending), what Redis now holds. See kafka/storetopic.py.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Iterable, Sequence

from blackbox.kafka.outbox import Record
from blackbox.kafka.storetopic import CANCELLED, FIRED, StoreTopic, tombstone
from blackbox.schedule import Schedule
from blackbox.storage.applying import Applied, Cancellation, Holding, Move, Write
from blackbox.storage.store import RedisStore

# How an id ended, by its marker in Redis (intake.lua): what its tombstone tells.
_ENDED = {b"f": FIRED, b"c": CANCELLED}
_DUE = struct.Struct(">q")  # a stored encoding's due time, bytes 1 to 9
_FLAGS_AT, _SERIES, _PAUSED = 9, 32, 64
# What applying each kind of request answers when Redis holds what the store was told.
_AS_WRITTEN: dict[type, frozenset[Applied]] = {
    Schedule: frozenset({Applied.SCHEDULED, Applied.UPDATED}),
    # A cancel of an id that had ended already (or never was) leaves its marker as it was
    # (none, or "f"): its tombstone must tell that, not "cancelled" (rebuild's markers).
    Cancellation: frozenset({Applied.CANCELLED}),
    Move: frozenset({Applied.UPDATED}),
    Holding: frozenset({Applied.PAUSED, Applied.RESUMED}),
}


def is_series(raw: bytes) -> bool:
    """Whether a stored encoding is a series' (as pending.lua's is_series reads it)."""
    return raw[:1] == b"\x02" and len(raw) > _FLAGS_AT and bool(raw[_FLAGS_AT] & _SERIES)


def moved(raw: bytes, due_ms: int) -> bytes | None:
    """A stored encoding moved to `due_ms` as intake.lua moves it; None for a series (a
    move leaves it as it is)."""
    if is_series(raw):
        return None
    return raw[:1] + _DUE.pack(due_ms) + raw[_FLAGS_AT:]


def held(raw: bytes, paused: bool) -> bytes | None:
    """A series' stored encoding paused or resumed as intake.lua does it; None for a
    one-off schedule (nothing changes)."""
    if not is_series(raw):
        return None
    flags = raw[_FLAGS_AT] | _PAUSED if paused else raw[_FLAGS_AT] & ~_PAUSED
    return raw[:_FLAGS_AT] + bytes([flags]) + raw[_FLAGS_AT + 1 :]


class Keeping:
    """Writes one intake's requests to the store topic (module docstring)."""

    def __init__(self, topic: StoreTopic, store: RedisStore) -> None:
        self.topic = topic
        self.store = store

    def ahead(self, writes: Sequence[Write], stop: threading.Event) -> None:
        """Write what `writes` will leave in Redis, in order, and wait for the broker
        (StoreUnavailable if it does not acknowledge them all)."""
        self.topic.write(self.ahead_records(writes), stop)

    def ahead_records(self, writes: Sequence[Write]) -> list[Record]:
        """The store records of `writes`, in order: a move or a pause starts from what an
        earlier request of the same poll wrote, else from what Redis holds."""
        latest: dict[str, bytes | None] = {}
        held_ids = [w.id for w in writes if isinstance(w, Move | Holding)]
        for schedule_id, stored in zip(held_ids, self.store.payloads(held_ids), strict=True):
            latest.setdefault(schedule_id, stored)
        records = []
        for write in writes:
            raw: bytes | None
            if isinstance(write, Schedule):
                raw = write.encode()
            elif isinstance(write, Cancellation):
                latest[write.id] = None
                records.append(tombstone(write.id, self.topic.topic, CANCELLED))
                continue
            else:
                before = latest.get(write.id)
                if before is None:  # nothing pending: Redis answers how it ended
                    continue
                raw = (
                    moved(before, write.due_ms)
                    if isinstance(write, Move)
                    else held(before, write.paused)
                )
                if raw is None:  # nothing changes
                    continue
            latest[write.id] = raw
            records.append(self._record(write.id, raw))
        return records

    def after(self, applied: Iterable[tuple[Write, Applied | None]], stop: threading.Event) -> None:
        """Write what Redis holds of each id whose request did not do what was written
        ahead (StoreUnavailable if the broker does not acknowledge them)."""
        applied = list(applied)
        stale = sorted({w.id for w, code in applied if code not in _AS_WRITTEN[type(w)]})
        if not stale:
            return
        # An id whose last request was a cancel is not pending, whatever still flies: a
        # version being delivered is tombstoned by firing once acknowledged.
        last = {w.id: w for w, _ in applied}
        payloads = [None if isinstance(last[i], Cancellation) else raw
                    for i, raw in zip(stale, self.store.payloads(stale), strict=True)]  # fmt: skip
        ended = [i for i, raw in zip(stale, payloads, strict=True) if raw is None]
        how = dict(zip(ended, self.store.ended_markers(ended), strict=True))
        records = [
            self._record(i, raw) if raw is not None else tombstone(i, self.topic.topic,
                                                                   _ENDED.get(how[i] or b""))
            for i, raw in zip(stale, payloads, strict=True)
        ]  # fmt: skip
        self.topic.write(records, stop)

    def _record(self, schedule_id: str, raw: bytes | None) -> Record:
        return Record(self.topic.topic, raw, schedule_id.encode("utf-8"))
