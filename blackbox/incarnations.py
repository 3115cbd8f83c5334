"""Which incarnation of an intake topic records come from.

Kafka gives every topic an id. A topic deleted and created again under the same name gets a
new id and starts its offsets over, below the watermark Redis keeps for the old one: taken
for re-reads, its records would be skipped. So the watermark and the ids derived from
records name the incarnation (a short tag of the topic id), and intake looks the id up
again whenever a partition's offsets may have restarted: at each assignment, and when a
partition's offsets go back without intake having rewound them itself.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

from confluent_kafka import Message

# Characters of the topic id kept in the tag: 48 bits tell two incarnations of one name
# apart, and the tag is part of every id derived from an intake record.
TAG_LENGTH = 8
_NO_ID = "AAAAAAAAAAAAAAAAAAAAAA"  # the zero Uuid: a broker that gives topics no id

Lookup = Callable[[Sequence[str]], Mapping[str, str]]


def tag_of(topic_id: str | None) -> str:
    """The tag naming one incarnation; empty where the broker gives no topic id."""
    if not topic_id or topic_id == _NO_ID:
        return ""
    return topic_id[:TAG_LENGTH]


class Incarnations:
    """The tag of each intake topic's current incarnation, and where each partition's
    offsets are expected to go on."""

    def __init__(self, lookup: Lookup) -> None:
        self._lookup = lookup  # topic names -> topic ids; raises KafkaException if it can't
        self._tags: dict[str, str] = {}
        self._next: dict[tuple[str, int], int] = {}

    def forget(self, partitions: Iterable[tuple[str, int]]) -> None:
        """Partitions newly assigned: their topic's id is looked up again, and their first
        offset is whatever the group committed."""
        for topic, partition in partitions:
            self._tags.pop(topic, None)
            self._next.pop((topic, partition), None)

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
                self._tags.pop(key[0], None)
                if index > 0:
                    return index
            self._next[key] = offset + 1
        return len(records)

    def tags(self, topics: Iterable[str]) -> dict[str, str]:
        """The current tag of each topic, looked up where not known."""
        unknown = sorted({t for t in topics if t not in self._tags})
        if unknown:
            found = self._lookup(unknown)
            self._tags.update({t: tag_of(found.get(t)) for t in unknown})
        return {t: self._tags[t] for t in topics}
