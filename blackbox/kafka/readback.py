"""Read-back: every record some topics held when the read began, read once, to that end.

Each partition is read from its log start offset to the high watermark taken at the start
(`Extent`): a partition retention emptied (low == high) ends at once, and one whose last
offsets hold no record (transaction markers, records deleted meanwhile) ends when the
consumer's position reaches its end. A topic that cannot be described (not authorized,
another error) raises `Unreadable`; one that does not exist holds nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import structlog
from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

from blackbox.errors import BlackboxError

log = structlog.get_logger("blackbox.kafka.readback")

POLL_SECONDS = 1.0
METADATA_TIMEOUT = 10.0
BATCH = 500


class Unreadable(BlackboxError):
    """A topic that could not be described or read (not authorized, or a broker error)."""


@dataclass(frozen=True, slots=True)
class Extent:
    """A partition's log start offset and high watermark when the read began."""

    low: int
    high: int


Where = tuple[str, int]


def extents_of(config: Mapping[str, Any], topics: Iterable[str]) -> dict[Where, Extent]:
    """Each partition of `topics` and its extent now (see `extents`)."""
    consumer = _consumer(config)
    try:
        return extents(consumer, topics)
    finally:
        consumer.close()


def extents_since(
    config: Mapping[str, Any], topics: Iterable[str], since_ms: int
) -> dict[Where, Extent]:
    """Each partition of `topics` from its first record written at or after `since_ms` (by
    record time) to its end now; one with none that recent holds nothing."""
    consumer = _consumer(config)
    try:
        bounds = extents(consumer, topics)
        asked = [TopicPartition(t, p, since_ms) for (t, p) in bounds]
        found = consumer.offsets_for_times(asked, timeout=METADATA_TIMEOUT) if asked else []
    finally:
        consumer.close()
    since: dict[Where, Extent] = {}
    for position in found:
        extent = bounds[(position.topic, position.partition)]
        low = extent.high if position.offset < 0 else max(extent.low, position.offset)
        since[(position.topic, position.partition)] = Extent(low, extent.high)
    return since


def records(
    config: Mapping[str, Any], bounds: Mapping[Where, Extent]
) -> Iterator[tuple[Message, Extent]]:
    """Every record of the partitions of `bounds` within their extents, with its extent."""
    left = {w: e for w, e in bounds.items() if e.high > e.low}
    if not left:
        return
    consumer = _consumer(config)
    try:
        consumer.assign([TopicPartition(t, p, e.low) for (t, p), e in left.items()])
        while left:
            taken = consumer.consume(BATCH, timeout=POLL_SECONDS)
            for message in taken:
                yield from _within(message, left)
            if not taken:
                _drop_passed(consumer, left)
    finally:
        consumer.close()


def _consumer(config: Mapping[str, Any]) -> Consumer:
    return Consumer({**config, "group.id": "blackbox-readback", "enable.auto.commit": False,
                     "enable.partition.eof": True, "auto.offset.reset": "earliest"})  # fmt: skip


def extents(consumer: Consumer, topics: Iterable[str]) -> dict[Where, Extent]:
    """Each partition's extent now; Unreadable for a topic the broker will not describe."""
    found: dict[Where, Extent] = {}
    for topic in sorted(set(topics)):
        metadata = consumer.list_topics(topic, timeout=METADATA_TIMEOUT).topics.get(topic)
        error = None if metadata is None else metadata.error
        if metadata is None or (error is not None and error.code() == _UNKNOWN):
            log.info("readback_topic_absent", topic=topic)
            continue
        if error is not None:
            raise Unreadable(f"topic {topic!r} cannot be read: {error.str()}")
        for number in metadata.partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, number),
                                                       timeout=METADATA_TIMEOUT)  # fmt: skip
            found[(topic, number)] = Extent(int(low), int(high))
    return found


_UNKNOWN = KafkaError.UNKNOWN_TOPIC_OR_PART


def _within(message: Message, left: dict[Where, Extent]) -> Iterator[tuple[Message, Extent]]:
    """`message` if it lies before its partition's end; a partition read to it is done."""
    where = (message.topic() or "", message.partition() or 0)
    error = message.error()
    if error is not None:
        if error.code() != KafkaError._PARTITION_EOF:
            raise Unreadable(f"topic {where[0]!r} cannot be read: {error.str()}")
        left.pop(where, None)
        return
    extent = left.get(where)
    offset = message.offset() or 0
    if extent is None or offset >= extent.high:
        return
    yield message, extent
    if offset + 1 >= extent.high:
        left.pop(where, None)


def _drop_passed(consumer: Consumer, left: dict[Where, Extent]) -> None:
    """The partitions whose position reached their end although no record said so."""
    positions = consumer.position([TopicPartition(t, p) for t, p in left])
    for position in positions:
        where = (position.topic, position.partition)
        if position.offset >= 0 and position.offset >= left[where].high:
            left.pop(where, None)
