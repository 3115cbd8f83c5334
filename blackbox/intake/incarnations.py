"""Which incarnation of an intake topic records come from.

Kafka gives every topic an id. A topic deleted and created again under the same name gets a
new id and starts its offsets over, below the watermark Redis keeps for the old one: taken
for re-reads, its records would be skipped. So the watermark and the ids derived from
records name the incarnation (a short tag of the topic id), and intake looks the id up
again whenever a partition's offsets may have restarted: at each assignment, and when a
partition's offsets go back without intake having rewound them itself.

A look-up does not always tell: a broker that gives topics no id names every incarnation
with the zero id. So offsets that go back under an unchanged id are a new incarnation all
the same, never re-reads: the topic takes a fresh tag, recorded in Redis by compare-and-set
(incarnation.lua) so that the replicas reading its other partitions agree on one tag, and
read there by every replica that looks the topic up. Offsets that go back for another
reason (a truncated log) then cost duplicates, never a skipped record.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol

from confluent_kafka import Message

from blackbox.storage import scripts
from blackbox.storage.connections import RedisClient
from blackbox.storage.keys import Layout

# Characters of the topic id kept in the tag: 48 bits tell two incarnations of one name
# apart, and the tag is part of every id derived from an intake record.
TAG_LENGTH = 8
_NO_ID = "AAAAAAAAAAAAAAAAAAAAAA"  # the zero Uuid: a broker that gives topics no id

Lookup = Callable[[Sequence[str]], Mapping[str, str]]


class Record(Protocol):
    """The tags chosen for topics whose offsets restarted under an unchanged id."""

    def current(self, topic: str, looked_up: str) -> str:
        """The tag in use for `topic` while the broker names it `looked_up`."""

    def renew(self, topic: str, looked_up: str, seen: str) -> str:
        """A fresh tag if the one in use is still `seen`; else the one in use."""


class LocalRecord:
    """A record kept in this process alone (one replica agrees with itself)."""

    def __init__(self) -> None:
        self._tags: dict[str, tuple[str, str]] = {}

    def current(self, topic: str, looked_up: str) -> str:
        recorded, tag = self._tags.get(topic, (looked_up, looked_up))
        return tag if recorded == looked_up else looked_up

    def renew(self, topic: str, looked_up: str, seen: str) -> str:
        if self.current(topic, looked_up) == seen:
            self._tags[topic] = (looked_up, fresh_tag())
        return self.current(topic, looked_up)


class RedisRecord:
    """The record in the namespace's Redis, shared by every replica (incarnation.lua)."""

    def __init__(self, client: RedisClient, layout: Layout) -> None:
        text = scripts.source("incarnation")
        self._script = client.register_script(text)
        self._client = client
        self._key = layout.incarnations

    def current(self, topic: str, looked_up: str) -> str:
        found = self._client.hget(self._key, topic)
        if found is None:
            return looked_up
        recorded, _, tag = _text(found).partition(" ")
        return tag if recorded == looked_up else looked_up

    def renew(self, topic: str, looked_up: str, seen: str) -> str:
        return _text(self._script(keys=[self._key], args=[topic, looked_up, seen, fresh_tag()]))


def _text(reply: bytes | str) -> str:
    return reply.decode() if isinstance(reply, bytes) else reply


def fresh_tag() -> str:
    """A tag no topic id gives: "~" and 7 random hex digits (28 bits)."""
    return "~" + secrets.token_hex(4)[: TAG_LENGTH - 1]


def tag_of(topic_id: str | None) -> str:
    """The tag naming one incarnation; empty where the broker gives no topic id."""
    if not topic_id or topic_id == _NO_ID:
        return ""
    return topic_id[:TAG_LENGTH]


class Incarnations:
    """The tag of each intake topic's current incarnation, and where each partition's
    offsets are expected to go on."""

    def __init__(self, lookup: Lookup, record: Record | None = None) -> None:
        self._lookup = lookup  # topic names -> topic ids; raises KafkaException if it can't
        self._record = record or LocalRecord()
        self._tags: dict[str, str] = {}
        self._next: dict[tuple[str, int], int] = {}
        # The tag each partition's last records were read under, once known.
        self._read_under: dict[tuple[str, int], str] = {}
        self._untagged: set[tuple[str, int]] = set()  # admitted, their tag not yet asked
        # Per topic: the tags its partitions were read under before their offsets restarted.
        self._restarted: dict[str, set[str]] = {}

    def forget(self, partitions: Iterable[tuple[str, int]]) -> None:
        """Partitions newly assigned: their topic's id is looked up again, and their first
        offset is whatever the group committed."""
        for topic, partition in partitions:
            self._tags.pop(topic, None)
            self._next.pop((topic, partition), None)
            self._read_under.pop((topic, partition), None)

    def rewound(self, topic: str, partition: int, offset: int) -> None:
        """Intake itself moved the partition back to `offset`."""
        self._next[(topic, partition)] = offset

    def admit(self, records: Sequence[Message]) -> int:
        """How many of `records` to handle now: all, or those before the first whose offset
        goes back (a restarted topic: intake reads the rest again after looking it up).
        A batch that opens with such a record has its topic's id looked up again."""
        for index, message in enumerate(records):
            key = (message.topic() or "", message.partition() or 0)
            offset = message.offset() or 0
            if offset < self._next.get(key, -1):
                self._restart(key)
                if index > 0:
                    return index
            self._next[key] = offset + 1
            self._untagged.add(key)
        return len(records)

    def _restart(self, key: tuple[str, int]) -> None:
        self._tags.pop(key[0], None)
        seen = self._read_under.pop(key, None)
        if seen is not None:
            self._restarted.setdefault(key[0], set()).add(seen)

    def tags(self, topics: Iterable[str]) -> dict[str, str]:
        """The current tag of each topic, looked up where not known."""
        unknown = sorted({t for t in topics if t not in self._tags})
        if unknown:
            found = self._lookup(unknown)
            self._tags.update({t: self._tag(t, tag_of(found.get(t))) for t in unknown})
        tags = {t: self._tags[t] for t in topics}
        for key in [k for k in self._untagged if k[0] in tags]:
            self._read_under[key] = tags[key[0]]
            self._untagged.discard(key)
        return tags

    def _tag(self, topic: str, looked_up: str) -> str:
        """The tag in use; a new one if a partition restarted under the tag in use (the
        topic id did not change, or the broker gives none)."""
        current = self._record.current(topic, looked_up)
        if current in self._restarted.get(topic, set()):
            current = self._record.renew(topic, looked_up, current)
        self._restarted.pop(topic, None)
        return current
