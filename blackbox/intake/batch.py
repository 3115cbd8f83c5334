"""Batch: the records of one intake poll on their way, parsed part by part: the requests
not yet sent to Redis and those sent, the dead letters with the answer to each, and the
offsets to commit once every record was handled."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from confluent_kafka import Message, TopicPartition

from blackbox.envelope import Header
from blackbox.intake.identity import Proof
from blackbox.kafka.deadletter import DeadLetter
from blackbox.kafka.events import Coordinates, Event
from blackbox.schedule import Schedule
from blackbox.storage.applying import Applied, IntakeSlice, Write


@dataclass(slots=True)
class Batch:
    """The records of one poll, parsed part by part: the requests not yet sent to Redis (by
    partition) and those sent (in order), dead letters with the refusal answering each
    (the first `landed` acknowledged by the dead-letter topic), last offsets."""

    tags: dict[str, str] = field(default_factory=dict)  # topic -> its incarnation's tag
    unsent: dict[tuple[str, int], list[tuple[int, Write]]] = field(default_factory=dict)
    sent: list[tuple[Coordinates, Write]] = field(default_factory=list)
    last_offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    dead: list[DeadLetter] = field(default_factory=list)
    refusals: list[Event] = field(default_factory=list)
    landed: int = 0
    # Records whose handling died CRASH_LIMIT times alone (topic, partition, offset): not
    # parsed; each with whether its headers may be read (crashguard.py).
    poisoned: dict[tuple[str, int, int], bool] = field(default_factory=dict)
    # Signed records parsed since their nonces were last checked against replays.
    signed: list[Signed] = field(default_factory=list)
    # New schedules of callers under a quota, parsed since it was last checked (quotas.py).
    counted: list[Counted] = field(default_factory=list)
    # Per caller under a quota: its pending count read in this poll, plus what it admitted.
    quota_tally: dict[str, int] = field(default_factory=dict)
    # Per partition: shards of requests refused after parsing, whose marks move past them.
    passed: dict[tuple[str, int], set[int]] = field(default_factory=dict)

    def take_signed(self) -> list[Signed]:
        signed, self.signed = self.signed, []
        return signed

    def take_counted(self) -> list[Counted]:
        counted, self.counted = self.counted, []
        return counted

    def unsend(self, where: tuple[str, int, int]) -> None:
        """Take back the parsed request of one record (not yet sent to Redis): refused, it
        is not counted against its caller's quota either."""
        items = self.unsent[where[:2]]
        items[:] = [(offset, write) for offset, write in items if offset != where[2]]
        self.counted = [c for c in self.counted if c.where != where]

    def saw(self, topic: str, partition: int, offset: int) -> None:
        self.unsent.setdefault((topic, partition), [])
        self.last_offsets[(topic, partition)] = offset

    def refuse(self, letter: DeadLetter, refusal: Event) -> None:
        self.dead.append(letter)
        self.refusals.append(refusal)

    def unlanded(self) -> list[DeadLetter]:
        """The dead letters the dead-letter topic has not acknowledged yet."""
        return self.dead[self.landed :]

    def all_landed(self) -> None:
        self.landed = len(self.dead)

    def take_slices(self) -> list[IntakeSlice]:
        """The requests parsed since the last call, by partition, each slice moving its
        partition's watermark past every record parsed so far (refused ones too)."""
        slices = [
            IntakeSlice(
                topic,
                partition,
                self.last_offsets[(topic, partition)],
                items,
                self.tags[topic],
                frozenset(self.passed.pop((topic, partition), ())),
            )
            for (topic, partition), items in self.unsent.items()
        ]
        self.sent += [
            (Coordinates(part.topic, part.partition, offset), write)
            for part in slices
            for offset, write in part.items
        ]
        self.unsent = {}
        return slices

    def next_offsets(self) -> list[TopicPartition]:
        """Per partition, the offset to commit: one past the last record handled."""
        return [TopicPartition(t, p, last + 1) for (t, p), last in self.last_offsets.items()]

    def applied(
        self, codes: Sequence[Applied | None]
    ) -> Iterator[tuple[Coordinates, Write, Applied | None]]:
        """Each request with where it came from and what applying it did."""
        for (coordinates, write), code in zip(self.sent, codes, strict=True):
            yield coordinates, write, code


@dataclass(frozen=True, slots=True)
class Signed:
    """A signed record whose request is parsed; its nonce is checked before it is sent."""

    proof: Proof
    origin: str
    message: Message
    where: tuple[str, int, int]
    headers: list[Header]


@dataclass(frozen=True, slots=True)
class Counted:
    """A new schedule of a caller under a quota, parsed; the quota is checked before it
    is sent (quotas.py)."""

    write: Schedule
    message: Message
    where: tuple[str, int, int]
    headers: list[Header] | None
