"""The intake's guard against a record that kills the process, so that one record can never
become a loop of crashes across the consumer group.

Records are handled inside handlers (a bad record is dead-lettered, an unexpected error in
handling one is dead-lettered as `unreadable`), but a crash in native code, or a thread
that dies, leaves the offset uncommitted: every replica given the partition would read the
record again and die again. So, before handling a poll, intake notes in Redis, for each
partition in it, the offsets it is about to handle and how many attempts at the first one
began ("first last attempts"). A clean stop or a revoke deletes the notes; a note found
when a partition is assigned means its last owner died while handling those offsets.

The new owner then takes the noted offsets one record at a time, noting each before
handling it. A record whose handling began `CRASH_LIMIT` times without ending is not
handled again: it is dead-lettered as `unreadable` (its value and key, not its headers)
and intake moves on. Costs one Redis call per poll.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import redis
import structlog
from confluent_kafka import Message

log = structlog.get_logger("blackbox.intake.crashguard")
# Attempts at one record that died before it is dead-lettered unread: the first crash may
# come from anything in its poll, the next ones from the record taken alone.
CRASH_LIMIT = 3

Partition = tuple[str, int]


@dataclass(frozen=True, slots=True)
class Suspect:
    """Offsets of a partition whose handling died: from `offset` (begun `attempts` times
    without ending) to `last`."""

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


def _field(partition: Partition) -> str:
    return f"{partition[0]}:{partition[1]}"


def _partition(message: Message) -> Partition:
    return (message.topic() or "", message.partition() or 0)


class CrashGuard:
    """The notes of one intake consumer, in one Redis hash shared by the group."""

    def __init__(self, client: redis.Redis | redis.RedisCluster, key: str) -> None:
        self.client = client
        self.key = key
        self._unchecked: set[Partition] = set()  # assigned, notes not read yet
        self._suspects: dict[Partition, Suspect] = {}
        self._owned: set[Partition] = set()

    def assigned(self, partitions: Iterable[Partition]) -> None:
        """New partitions: their notes are read before their first poll is handled."""
        for partition in partitions:
            self._unchecked.add(partition)
            self._owned.add(partition)
            self._suspects.pop(partition, None)

    def revoked(self, partitions: Iterable[Partition]) -> None:
        """Partitions given away cleanly: their notes go, unless they still hold a suspect
        (its crash count must reach the next owner)."""
        gone = [p for p in partitions if p in self._owned]
        for partition in gone:
            self._owned.discard(partition)
            self._unchecked.discard(partition)
        self._delete([p for p in gone if self._suspects.pop(p, None) is None])

    def interrupted(self, records: Sequence[Message]) -> None:
        """Handling these records ended in a caught failure (Redis or the broker away), not
        a death: their notes go back to what they said before, so an outage that outlasts a
        few restarts is never taken for a record that kills. Best effort: with Redis away
        the notes stay, and only make the next owner careful."""
        partitions = {_partition(m) for m in records}
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

    def careful(self, records: Sequence[Message]) -> tuple[list[Message], list[Message]]:
        """The records to handle now, and those to read again later. Of a partition whose
        last owner died, the records before the one it died on are handled as usual (the
        owner had handled them), and each record from there to the end of the noted
        offsets is handled alone. Raises redis.RedisError when the notes of new partitions
        cannot be read."""
        self._read_notes({_partition(m) for m in records} & self._unchecked)
        now: list[Message] = []
        later: list[Message] = []
        taken: set[Partition] = set()
        closed: set[Partition] = set()
        for message in records:
            partition = _partition(message)
            if partition in closed:
                later.append(message)
                continue
            suspect = self._suspect_at(partition, message.offset() or 0)
            if suspect is not None and (message.offset() or 0) >= suspect.offset:
                closed.add(partition)
                if partition in taken:  # never in one poll with the records before it
                    later.append(message)
                    continue
            taken.add(partition)
            now.append(message)
        return now, later

    def _suspect_at(self, partition: Partition, offset: int) -> Suspect | None:
        """The partition's suspect, forgotten once intake reads past its noted offsets."""
        suspect = self._suspects.get(partition)
        if suspect is not None and offset > suspect.last:
            del self._suspects[partition]
            return None
        return suspect

    def note(self, records: Sequence[Message]) -> set[tuple[str, int, int]]:
        """Note the offsets about to be handled, before handling them; return the records
        (topic, partition, offset) that died `CRASH_LIMIT` times and must not be handled."""
        spans: dict[Partition, tuple[int, int]] = {}
        for message in records:
            partition, offset = _partition(message), message.offset() or 0
            first, _ = spans.get(partition, (offset, offset))
            spans[partition] = (first, offset)
        notes: dict[str, str] = {}
        poisoned: set[tuple[str, int, int]] = set()
        for partition, (first, last) in spans.items():
            suspect = self._suspects.get(partition)
            if suspect is None:
                notes[_field(partition)] = Suspect(first, last, 1).encode()
                continue
            if first < suspect.offset:  # re-reads of what the last owner handled: note kept
                continue
            before = suspect.attempts if first == suspect.offset else 0
            if before >= CRASH_LIMIT:
                poisoned.add((*partition, first))
            self._suspects[partition] = Suspect(first, suspect.last, before)
            notes[_field(partition)] = Suspect(first, suspect.last, before + 1).encode()
        if notes:
            self.client.hset(self.key, mapping=notes)  # type: ignore[arg-type]
        return poisoned

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
