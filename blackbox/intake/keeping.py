"""Keeping: the intake's writes to the store topic, ahead of Redis and after it.

Ahead (before a part of a poll is applied in Redis, waiting for the broker): the version
each request asks for, as intake.lua will write it, or a tombstone for a cancel. After
(before the poll's offsets are committed): where Redis did something else than asked (a
request read again, an `if_absent` create of an id pending or ended, a move of a series or
of an id not pending), what Redis now holds. See kafka/storetopic.py.
"""

from __future__ import annotations

import dataclasses
import struct
import threading
from collections.abc import Collection, Iterable, Sequence

from blackbox import reference
from blackbox.kafka.outbox import Record
from blackbox.kafka.storereader import Place
from blackbox.kafka.storetopic import CANCELLED, FIRED, StoreTopic, tombstone
from blackbox.reference import is_reference
from blackbox.schedule import Schedule, caller_from_prefix
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


def unsure_moves(writes: Sequence[Write]) -> set[int]:
    """The moves (by index) that follow an `if_absent` create of their id in `writes`:
    whether that create applies (its id not pending) is known only once Redis ran it, so
    which version they move is unknown ahead."""
    unsure: set[str] = set()
    found: set[int] = set()
    for index, write in enumerate(writes):
        if isinstance(write, Schedule):
            (unsure.add if write.if_absent else unsure.discard)(write.id)
        elif isinstance(write, Cancellation):
            unsure.discard(write.id)
        elif isinstance(write, Move) and write.id in unsure:
            found.add(index)
    return found


class Keeping:
    """Writes one intake's requests to the store topic (module docstring).

    `indexing` (index mode): Redis keeps a reference to each one-off version's store
    record in place of its encoding (storage/reference.py): `ahead` answers the writes
    carrying it, and `after` points Redis at what it wrote again. Either way, where Redis
    holds a reference (index mode now or before) it is read back through `store.reader`,
    and a reference whose record is written again is replaced: by the new reference, or
    in inline mode by the encoding (compaction drops the record it named)."""

    def __init__(self, topic: StoreTopic, store: RedisStore, *, indexing: bool = False) -> None:
        self.topic = topic
        self.store = store
        self.indexing = indexing

    def ahead(self, writes: Sequence[Write], stop: threading.Event) -> list[Write]:
        """Write what `writes` will leave in Redis, in order, and wait for the broker
        (StoreUnavailable if it does not acknowledge them all). Returns `writes`, each one
        whose Redis copy changes carrying it (`stored`, see the class)."""
        records, sources, referenced = self.ahead_records(writes)
        places = self._write(records, stop)
        kept = list(writes)
        # A move after an `if_absent` create of its id carries no reference: Redis moves
        # what it holds (the create applied or not), and `after` writes that again.
        unsure = unsure_moves(writes) if places is not None else set()
        for n, (record, source) in enumerate(zip(records, sources, strict=True)):
            if source is None or source in unsure or record.value is None:
                continue
            if is_series(record.value):
                continue
            write = writes[source]
            if not isinstance(write, Schedule | Move):
                continue
            if places is not None:
                stored = reference.of(record.value, *places[n], caller_from_prefix(record.value))
            elif isinstance(write, Move) and source in referenced:
                stored = record.value
            else:
                continue
            kept[source] = dataclasses.replace(write, stored=stored)
        return kept

    def ahead_records(
        self, writes: Sequence[Write]
    ) -> tuple[list[Record], list[int | None], set[int]]:
        """The store records of `writes`, in order; which write each one is (None for a
        cancel's tombstone); and the moves of what Redis holds as a reference. A move or a
        pause starts from what an earlier request of the same poll wrote, else from what
        Redis holds."""
        latest: dict[str, bytes | None] = {}
        held_ids = [w.id for w in writes if isinstance(w, Move | Holding)]
        raws = self.store.payloads(held_ids)
        references = {i for i, raw in zip(held_ids, raws, strict=True) if is_reference(raw)}
        for schedule_id, stored in zip(held_ids, self._resolved(held_ids, raws), strict=True):
            latest.setdefault(schedule_id, stored)
        records: list[Record] = []
        sources: list[int | None] = []
        referenced: set[int] = set()
        for index, write in enumerate(writes):
            raw: bytes | None
            if isinstance(write, Schedule):
                raw = write.encode()
            elif isinstance(write, Cancellation):
                latest[write.id] = None
                references.discard(write.id)
                records.append(tombstone(write.id, self.topic.topic, CANCELLED))
                sources.append(None)
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
                if isinstance(write, Move) and write.id in references:
                    referenced.add(index)
            latest[write.id] = raw
            references.discard(write.id)
            records.append(self._record(write.id, raw))
            sources.append(index if isinstance(write, Schedule | Move) else None)
        return records, sources, referenced

    def after(self, applied: Iterable[tuple[Write, Applied | None]], stop: threading.Event) -> None:
        """Write what Redis holds of each id whose request did not do what was written
        ahead (StoreUnavailable if the broker does not acknowledge them)."""
        applied = list(applied)
        stale_ids = {w.id for w, code in applied if code not in _AS_WRITTEN[type(w)]}
        if self.indexing:  # the moves `ahead` left without a reference (unsure_moves)
            writes = [w for w, _ in applied]
            stale_ids |= {writes[n].id for n in unsure_moves(writes)}
        # An id whose last request was a cancel is not pending, whatever still flies: a
        # version being delivered is tombstoned by firing once acknowledged.
        last = {w.id: w for w, _ in applied}
        cancelled = {i for i in stale_ids if isinstance(last[i], Cancellation)}
        self.restate(sorted(stale_ids), stop, cancelled)

    def restate(
        self,
        stale: Sequence[str],
        stop: threading.Event,
        cancelled: Collection[str] = (),
        *,
        recheck: bool = True,
    ) -> None:
        """Write what Redis holds of each id (a tombstone for one not pending, or in
        `cancelled`), and wait (StoreUnavailable); in index mode, point Redis at each
        version written again. With `recheck`, an id whose version was written while
        Redis changed it is written again (see `_changed`)."""
        if not stale:
            return
        held = [None if i in cancelled else raw
                for i, raw in zip(stale, self.store.payloads(stale), strict=True)]  # fmt: skip
        payloads = self._resolved(stale, held)
        # A reference whose record is missing stays as it is: firing dead-letters it.
        kept = [(i, h, raw) for i, h, raw in zip(stale, held, payloads, strict=True)
                if h is None or raw is not None]  # fmt: skip
        ended = [i for i, h, _ in kept if h is None]
        how = dict(zip(ended, self.store.ended_markers(ended), strict=True))
        records = [
            self._record(i, raw) if raw is not None else tombstone(i, self.topic.topic,
                                                                   _ENDED.get(how[i] or b""))
            for i, _, raw in kept
        ]  # fmt: skip
        places = self._write(records, stop)
        written = {i: was for i, was, raw in kept if was is not None and raw is not None}
        moves = []
        for n, (schedule_id, was, raw) in enumerate(kept):
            if was is None or raw is None or not is_reference(was):
                continue
            now = raw if places is None else reference.of(raw, *places[n], caller_from_prefix(raw))
            moves.append((schedule_id, was, now))
            written[schedule_id] = now
        if moves:
            self.store.repoint(moves)
        if recheck and written:
            self.restate(self._changed(written), stop, recheck=False)

    def _changed(self, written: dict[str, bytes]) -> list[str]:
        """The ids of versions just written that Redis no longer holds as it did (or as it
        was pointed at them): fired, ended or stored anew while the version was on its way,
        firing's tombstone (written behind its ack) or intake's next version may have
        landed before it. Written again, what Redis holds now lands after both."""
        ids = sorted(written)
        now = self.store.payloads(ids)
        return [i for i, raw in zip(ids, now, strict=True) if raw != written[i]]

    def _write(self, records: Sequence[Record], stop: threading.Event) -> list[Place] | None:
        """Write `records` and wait; in index mode, where each landed (kept in the
        reader's cache too)."""
        if not self.indexing:
            self.topic.write(records, stop)
            return None
        places = self.topic.write_placed(records, stop)
        if self.store.reader is not None:
            for record, place in zip(records, places, strict=True):
                if record.value is not None and record.key is not None:
                    self.store.reader.remember(record.key, record.value, place)
        return places

    def _resolved(self, ids: Sequence[str], held: Sequence[bytes | None]) -> list[bytes | None]:
        """`held` (what Redis holds of each id) with each reference read back."""
        reader = self.store.reader
        return list(held) if reader is None else reader.resolve(ids, held)

    def _record(self, schedule_id: str, raw: bytes | None) -> Record:
        return Record(self.topic.topic, raw, schedule_id.encode("utf-8"))
