"""Deliveries: what blackbox already delivered, read back from the target topics.

Every record blackbox produces carries `blackbox-id`, and `blackbox-version` for a caller's
id (the intake record of that version); a series occurrence carries `blackbox-occurrence-ms`.
A rebuild of a lost Redis (intake/rebuild.py) reads them so that nothing delivered before is
written back: a one-off version delivered is done, and a series goes on after the latest
occurrence delivered, its count the occurrences delivered.

The target topics are trusted: a producer that can write a `blackbox-id` header to them can
make a rebuild pass over a schedule. Keep their write access to blackbox.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import structlog
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

from blackbox.kafka.clients import read_headers

log = structlog.get_logger("blackbox.kafka.deliveries")

ID, VERSION, OCCURRENCE = "blackbox-id", "blackbox-version", "blackbox-occurrence-ms"
POLL_SECONDS = 1.0
METADATA_TIMEOUT = 10.0


@dataclass(slots=True)
class Delivered:
    """The occurrences of one version delivered (one-offs: a single None)."""

    occurrences: set[int | None] = field(default_factory=set)

    @property
    def latest(self) -> int | None:
        found = [o for o in self.occurrences if o is not None]
        return max(found) if found else None


Versions = dict[tuple[str, str], Delivered]  # (blackbox-id, version) -> what was delivered


def key_of(headers: Iterable[tuple[str, Any]]) -> tuple[tuple[str, str], int | None] | None:
    """(id, version) and the occurrence a delivered record's headers name; None for a
    record blackbox did not produce. The version of an id without one is the id itself."""
    found: dict[str, bytes] = {}
    for name, value in headers:
        if name in (ID, VERSION, OCCURRENCE) and isinstance(value, bytes):
            found.setdefault(name, value)
    if ID not in found:
        return None
    blackbox_id = found[ID].decode("utf-8", "replace")
    version = found[VERSION].decode("utf-8", "replace") if VERSION in found else blackbox_id
    occurrence = found.get(OCCURRENCE)
    return (blackbox_id, version), int(occurrence) if occurrence and occurrence.isdigit() else None


def read(config: Mapping[str, Any], topics: Iterable[str]) -> Versions:
    """Every version delivered to `topics`, read from their start to their end now."""
    delivered: Versions = {}
    consumer = Consumer({**config, "group.id": "blackbox-deliveries",
                         "enable.auto.commit": False, "enable.partition.eof": True})  # fmt: skip
    try:
        ends = _assign_all(consumer, sorted(set(topics)))
        while ends:
            message = consumer.poll(POLL_SECONDS)
            if message is None:
                continue
            if message.error() is not None:
                _at_end(message, ends)
                continue
            _take(read_headers(message) or [], delivered)
            if (message.offset() or 0) + 1 >= ends.get(_where(message), 0):
                ends.pop(_where(message), None)
    finally:
        consumer.close()
    log.info("deliveries_read", topics=sorted(set(topics)), versions=len(delivered))
    return delivered


def _take(headers: Iterable[tuple[str, Any]], delivered: Versions) -> None:
    found = key_of(headers)
    if found is not None:
        key, occurrence = found
        delivered.setdefault(key, Delivered()).occurrences.add(occurrence)


def _assign_all(consumer: Consumer, topics: list[str]) -> dict[tuple[str, int], int]:
    """Assign every partition of `topics` from its start; the end offset of each one that
    holds records."""
    ends: dict[tuple[str, int], int] = {}
    partitions = []
    for topic in topics:
        metadata = consumer.list_topics(topic, timeout=METADATA_TIMEOUT).topics.get(topic)
        if metadata is None or metadata.error is not None:
            log.warning("deliveries_topic_unreadable", topic=topic)
            continue
        for number in metadata.partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, number),
                                                       timeout=METADATA_TIMEOUT)  # fmt: skip
            if high > low:
                ends[(topic, number)] = high
                partitions.append(TopicPartition(topic, number, OFFSET_BEGINNING))
    if partitions:
        consumer.assign(partitions)
    return ends


def _at_end(message: Any, ends: dict[tuple[str, int], int]) -> None:
    """A partition read to its end is done; another error is raised."""
    error = message.error()
    if error.code() == KafkaError._PARTITION_EOF:
        ends.pop(_where(message), None)
        return
    raise KafkaException(error)


def _where(message: Any) -> tuple[str, int]:
    return message.topic() or "", message.partition() or 0
