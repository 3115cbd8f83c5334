"""The intake's guard against a record that kills the process, so that one record can never
become a loop of crashes across the consumer group, and no record is ever set aside for a
death it did not cause.

Records are handled inside handlers (a bad record is dead-lettered, an unexpected error in
handling one is dead-lettered as `unreadable`), but a crash in native code, or a thread
that dies, leaves the offset uncommitted: every replica given the partition would read the
record again and die again. So, before handling a poll, intake notes in Redis, for each
partition in it, the offsets it is about to handle ("first last attempts"), and
`NOTE_AHEAD` offsets past them: the polls that follow within that range need no note of
their own for NOTE_REFRESH_SECONDS (a note lost meanwhile, with a Redis that failed over
or to a former owner's late revoke, is written again within that), so a steady stream of
small polls writes about one note per `NOTE_AHEAD` records or per NOTE_REFRESH_SECONDS,
whichever comes first. A clean stop or a revoke deletes the notes (a revoke only the
note it wrote: one served late leaves the next owner's); a note found when a partition is
assigned means its last owner died while handling offsets within it: they are suspect
(those its owner never reached are handled alone too, slower, never charged a death).

A death is charged to a record only when that record was handled alone. A poll of many
records notes them uncharged (attempts 0): which of them killed is unknown. The new owner
then handles each suspect record alone (one record in the poll, whatever the partitions:
any other record in the same poll could be the killer), noting it with one attempt more
before and clearing the charge once its handling ended; records not suspect are handled
together, in polls without a suspect record. So `attempts` counts only deaths while that
record was the only one in hand. A record charged `CRASH_LIMIT` deaths is not handled
again: it is dead-lettered as `unreadable`, its headers kept (unless setting it aside died
too: reading them may be what kills) and intake moves on.

Costs one Redis call per poll that leaves the range noted, and one more per suspect record.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import redis
import structlog
from confluent_kafka import Message

log = structlog.get_logger("blackbox.intake.crashguard")
# Deaths while handling one record alone before it is set aside unread: more than one, as a
# pod may also be killed for reasons of its own (out of memory, a node drained).
CRASH_LIMIT = 3
# Offsets noted past a poll's last: a poll within the range noted before writes nothing (at
# 1,000 requests a second, polls of about 20 records wrote a note each: 10 µs of CPU per
# message). A death makes the next owner handle at most this many more records alone.
NOTE_AHEAD = 256
# How long a note stands for the polls within its range before it is written again.
NOTE_REFRESH_SECONDS = 1.0
# Deletes a partition's note only while it is the one this owner wrote.
_DELETE_IF_OURS = (
    "if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then "
    "return redis.call('HDEL', KEYS[1], ARGV[1]) end return 0"
)

Partition = tuple[str, int]
Where = tuple[str, int, int]  # topic, partition, offset


@dataclass(frozen=True, slots=True)
class Suspect:
    """Offsets of a partition whose handling died: from `offset` (charged `attempts` deaths
    while handled alone) to `last`."""

    offset: int
    last: int
    attempts: int

    def encode(self) -> str:
        return f"{self.offset} {self.last} {self.attempts}"

    @classmethod
    def decode(cls, text: bytes | str) -> Suspect | None:
        """The note, or None for one that does not parse (written by something else)."""
        parts = (text.decode() if isinstance(text, bytes) else text).split()
        if len(parts) != 3 or not all(p.lstrip("-").isdigit() for p in parts):
            return None
        offset, last, attempts = (int(p) for p in parts)
        return cls(offset, last, attempts)

    def holds(self, offset: int) -> bool:
        """Whether the record at `offset` is suspect (read past the offsets handled before)."""
        return self.offset <= offset <= self.last

    def at(self, offset: int) -> Suspect:
        """The suspect from `offset` on: records past the one charged are not charged."""
        return Suspect(offset, self.last, self.attempts if offset == self.offset else 0)

    def after(self, offset: int) -> Suspect | None:
        """What stays suspect once the record at `offset` was handled to its end."""
        return None if offset >= self.last else Suspect(offset + 1, self.last, 0)

    @property
    def poisoned(self) -> bool:
        """Charged `CRASH_LIMIT` deaths alone: set aside, never handled again."""
        return self.attempts >= CRASH_LIMIT

    @property
    def headers_readable(self) -> bool:
        """A poisoned record's headers are read unless setting it aside died before."""
        return self.attempts == CRASH_LIMIT


def _field(partition: Partition) -> str:
    return f"{partition[0]}:{partition[1]}"


def _partition(message: Message) -> Partition:
    return (message.topic() or "", message.partition() or 0)


def _firsts(records: Sequence[Message]) -> dict[Partition, Message]:
    """The first record of each partition in the poll, in the poll's order."""
    firsts: dict[Partition, Message] = {}
    for message in records:
        firsts.setdefault(_partition(message), message)
    return firsts


def _is_suspect(message: Message, suspects: Mapping[Partition, Suspect]) -> bool:
    suspect = suspects.get(_partition(message))
    return suspect is not None and suspect.holds(message.offset() or 0)


def split(
    records: Sequence[Message], suspects: Mapping[Partition, Suspect]
) -> tuple[list[Message], list[Message]]:
    """The records to handle now, and those to read again later. A suspect record first of
    its partition in the poll is handled alone; else every record before its partition's
    first suspect one is handled (partitions keep their order: nothing is taken past a
    record read again)."""
    for first in _firsts(records).values():
        if _is_suspect(first, suspects):
            return [first], [m for m in records if m is not first]
    now: list[Message] = []
    later: list[Message] = []
    closed: set[Partition] = set()
    for message in records:
        partition = _partition(message)
        if partition in closed or _is_suspect(message, suspects):
            closed.add(partition)
            later.append(message)
        else:
            now.append(message)
    return now, later


def _spans(records: Sequence[Message]) -> dict[Partition, tuple[int, int]]:
    """The first and last offset of each partition in the records."""
    spans: dict[Partition, tuple[int, int]] = {}
    for message in records:
        partition, offset = _partition(message), message.offset() or 0
        first, _ = spans.get(partition, (offset, offset))
        spans[partition] = (first, offset)
    return spans


class CrashGuard:
    """The notes of one intake consumer, in one Redis hash shared by the group."""

    def __init__(
        self,
        client: redis.Redis | redis.RedisCluster,
        key: str,
        ahead: int = NOTE_AHEAD,
        refresh_seconds: float = NOTE_REFRESH_SECONDS,
    ) -> None:
        self.client = client
        self.key = key
        self.ahead = ahead
        self.refresh_seconds = refresh_seconds
        self._unchecked: set[Partition] = set()  # assigned, notes not read yet
        self._suspects: dict[Partition, Suspect] = {}
        self._owned: set[Partition] = set()
        # Partition -> the note this owner wrote of it, uncharged, and when (monotonic s).
        self._noted: dict[Partition, tuple[Suspect, float]] = {}

    def assigned(self, partitions: Iterable[Partition]) -> None:
        """New partitions: their notes are read before their first poll is handled."""
        for partition in partitions:
            self._unchecked.add(partition)
            self._owned.add(partition)
            self._suspects.pop(partition, None)
            self._noted.pop(partition, None)

    def revoked(self, partitions: Iterable[Partition]) -> None:
        """Partitions given away cleanly: their notes go, unless they still hold a suspect
        (its crash count must reach the next owner)."""
        gone = [p for p in partitions if p in self._owned]
        written: dict[Partition, Suspect] = {}
        for partition in gone:
            self._owned.discard(partition)
            self._unchecked.discard(partition)
            noted = self._noted.pop(partition, None)
            if noted is not None:
                written[partition] = noted[0]
        plain = [p for p in gone if self._suspects.pop(p, None) is None]
        self._delete([p for p in plain if p not in written])
        try:  # a revoke served late must not delete the note of the partition's next owner
            for partition, note in written.items():
                self.client.eval(_DELETE_IF_OURS, 1, self.key, _field(partition), note.encode())
        except redis.RedisError as e:
            log.info("crash_notes_not_deleted", error=str(e))

    def moved(self, partitions: Iterable[Partition]) -> None:
        """The consumer was moved on these partitions (a gap read again, a rewind): their
        next poll is noted, whatever this owner noted before."""
        for partition in partitions:
            self._noted.pop(partition, None)

    def interrupted(self, records: Sequence[Message]) -> None:
        """Handling these records ended in a caught failure (Redis or the broker away), not
        a death: their notes go back to what they said before, so an outage that outlasts a
        few restarts is never taken for a record that kills. Best effort: with Redis away
        the notes stay, and only make the next owner careful. (Notes not read yet stay.)"""
        partitions = {_partition(m) for m in records} - self._unchecked
        for partition in partitions:  # noted again by the next poll, whatever happens here
            self._noted.pop(partition, None)
        restored = {_field(p): s.encode() for p, s in self._suspects.items() if p in partitions}
        cleared = [_field(p) for p in partitions if p not in self._suspects]
        try:
            if restored:
                self.client.hset(self.key, mapping=restored)  # type: ignore[arg-type]
            if cleared:
                self.client.hdel(self.key, *cleared)
        except redis.RedisError as e:
            log.info("crash_notes_not_restored", error=str(e))

    def stopped(self) -> None:
        """A clean stop: every note without a suspect goes."""
        self.revoked(list(self._owned))

    def died(self) -> None:
        """The intake died: its notes stay for the next owners (closing the consumer
        revokes its partitions, which must not delete them)."""
        self._owned.clear()
        self._noted.clear()

    def careful(self, records: Sequence[Message]) -> tuple[list[Message], list[Message]]:
        """The records to handle now, and those to read again later (see `split`): a record
        whose last owner died handling it is handled alone. Raises redis.RedisError when the
        notes of new partitions cannot be read."""
        self._read_notes({_partition(m) for m in records} & self._unchecked)
        for partition, first in _firsts(records).items():
            suspect = self._suspects.get(partition)
            if suspect is not None and (first.offset() or 0) > suspect.last:
                del self._suspects[partition]  # read past it: the next note replaces its own
        return split(records, self._suspects)

    def note(self, records: Sequence[Message]) -> dict[Where, bool]:
        """Note the offsets about to be handled, before handling them. Return the records
        charged `CRASH_LIMIT` deaths, which must not be handled, each with whether its
        headers may be read. Only a suspect record noted alone is charged one attempt."""
        alone = len(records) == 1
        notes: dict[str, str] = {}
        noted: dict[Partition, Suspect] = {}
        poisoned: dict[Where, bool] = {}
        now = time.monotonic()
        for partition, (first, last) in _spans(records).items():
            suspect = self._suspects.get(partition)
            if suspect is None:
                if self._stands(partition, first, last, now):
                    continue
                noted[partition] = Suspect(first, last + self.ahead, 0)
                notes[_field(partition)] = noted[partition].encode()
                continue
            self._noted.pop(partition, None)
            if not suspect.holds(first):  # re-reads of what the last owner handled: note kept
                continue
            suspect = self._suspects[partition] = suspect.at(first)
            if suspect.poisoned:
                poisoned[(*partition, first)] = suspect.headers_readable
            charged = Suspect(first, suspect.last, suspect.attempts + (1 if alone else 0))
            notes[_field(partition)] = charged.encode()
        if notes:
            self.client.hset(self.key, mapping=notes)  # type: ignore[arg-type]
        for partition, note in noted.items():  # once written: a failed write is noted again
            self._noted[partition] = (note, now)
        return poisoned

    def _stands(self, partition: Partition, first: int, last: int, now: float) -> bool:
        """Whether this owner's note of `partition` holds offsets `first` to `last` and was
        written within refresh_seconds."""
        noted = self._noted.get(partition)
        if noted is None:
            return False
        note, at = noted
        return note.offset <= first and last <= note.last and now - at < self.refresh_seconds

    def ended(self, records: Sequence[Message]) -> None:
        """Handling these records ended: a suspect record among them is cleared (the rest of
        its offsets stay suspect, uncharged), so a later death is never charged to it. Best
        effort: with Redis away its note stays until the partition is noted again."""
        for message in records:
            partition, offset = _partition(message), message.offset() or 0
            suspect = self._suspects.get(partition)
            if suspect is None or not suspect.holds(offset):
                continue
            rest = suspect.after(offset)
            try:
                if rest is None:
                    del self._suspects[partition]
                    self.client.hdel(self.key, _field(partition))
                else:
                    self._suspects[partition] = rest
                    self.client.hset(self.key, _field(partition), rest.encode())
            except redis.RedisError as e:
                log.info("crash_note_not_cleared", error=str(e))

    def _read_notes(self, partitions: set[Partition]) -> None:
        if not partitions:
            return
        ordered = sorted(partitions)
        values = self.client.hmget(self.key, [_field(p) for p in ordered])
        for partition, value in zip(ordered, values, strict=True):
            suspect = None if value is None else Suspect.decode(value)
            if suspect is not None:
                self._suspects[partition] = suspect
                log.warning("intake_crash_found", topic=partition[0], partition=partition[1],
                            offset=suspect.offset, last=suspect.last,
                            attempts=suspect.attempts)  # fmt: skip
        self._unchecked -= partitions

    def _delete(self, partitions: Sequence[Partition]) -> None:
        if not partitions:
            return
        try:
            self.client.hdel(self.key, *(_field(p) for p in partitions))
        except redis.RedisError as e:  # a note left behind only makes the next owner careful
            log.info("crash_notes_not_deleted", error=str(e))
