"""Letters: what the dead-letter topic says ended or was refused, read back for a rebuild.

Two kinds of dead letters sit there (kafka/deadletter.py). A refused intake record carries
its coordinates (`blackbox-dlq-topic`, `-partition`, `-offset`, added after the record's own
headers, so the last of each name is blackbox's): the rebuild does not take it either,
whatever it would judge of it today (a signature's age). A schedule that could not be
delivered carries its `blackbox-id` and no coordinates: that id ended when the letter was
written, so a version accepted before then is not written back. A topic whose retention
removed letters is read as it is, with a warning (`blackbox create-topics` keeps it as long
as the intake topic).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import structlog
from confluent_kafka import Message

from blackbox.kafka import readback
from blackbox.kafka.clients import read_headers
from blackbox.kafka.deliveries import BadHeader, due_time

log = structlog.get_logger("blackbox.kafka.letters")

TOPIC, PARTITION, OFFSET = "blackbox-dlq-topic", "blackbox-dlq-partition", "blackbox-dlq-offset"
ID = "blackbox-id"


@dataclass(slots=True)
class Letters:
    """The dead-letter topic read to its end."""

    refused: set[tuple[str, int, int]] = field(default_factory=set)  # intake coordinates
    failed: dict[str, int] = field(default_factory=dict)  # schedule id -> latest letter ms
    skipped: int = 0  # letters whose coordinates are no numbers

    def ended_after(self, schedule_id: str, accepted_ms: int) -> bool:
        """Whether `schedule_id` was dead-lettered at or after `accepted_ms`."""
        failed = self.failed.get(schedule_id)
        return failed is not None and failed >= accepted_ms


def read(config: Mapping[str, Any], topic: str) -> Letters:
    """Every letter of `topic` up to its end now; readback.Unreadable if it cannot be read."""
    found = Letters()
    extents = readback.extents_of(config, [topic])
    aged = sorted(p for (_, p), extent in extents.items() if extent.low > 0)
    if aged:
        log.warning("dead_letters_aged_out", topic=topic, partitions=aged,
                    why="retention removed letters: records refused or schedules failed then "
                    "may be taken or written back again",
                    action="keep the dead-letter topic as long as the intake topic "
                    "(blackbox create-topics)")  # fmt: skip
    for message, _ in readback.records(config, extents):
        _take(message, found)
    log.info("dead_letters_read", topic=topic, refused=len(found.refused),
             failed=len(found.failed), skipped=found.skipped)  # fmt: skip
    return found


def _take(message: Message, found: Letters) -> None:
    headers = _last_of(read_headers(message) or [])
    if OFFSET in headers:
        try:
            found.refused.add(coordinates(headers))
        except (BadHeader, KeyError) as e:
            found.skipped += 1
            log.warning("dead_letter_skipped", offset=message.offset(), error=repr(e))
        return
    if ID in headers:
        schedule_id = headers[ID].decode("utf-8", "replace")
        _, stamp = message.timestamp()
        found.failed[schedule_id] = max(found.failed.get(schedule_id, 0), stamp)


def coordinates(headers: Mapping[str, bytes]) -> tuple[str, int, int]:
    """The intake record a refusal's letter names."""
    topic = headers[TOPIC].decode("utf-8", "replace")
    return topic, due_time(headers[PARTITION]), due_time(headers[OFFSET])


def _last_of(headers: Iterable[tuple[str, Any]]) -> dict[str, bytes]:
    found: dict[str, bytes] = {}
    for name, value in headers:
        if name in (TOPIC, PARTITION, OFFSET, ID) and isinstance(value, bytes):
            found[name] = value
    return found
