"""The most recent dead letters, read back from the dead-letter topic itself.

The topic is the record of every dead letter, from every replica, across restarts; reading
its last few records per partition costs the broker a fetch, and Redis nothing. Answers
are kept for a couple of seconds, so a page refreshing often does not fetch each time.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass

from confluent_kafka import Consumer, Message, TopicPartition
from pydantic import BaseModel

from blackbox.api.views import preview
from blackbox.kafka.clients import read_headers
from blackbox.kafka.deadletter import DETAIL_HEADER, REASON_HEADER

PER_PARTITION = 20
CACHE_SECONDS = 2.0
READ_SECONDS = 3.0


@dataclass(frozen=True, slots=True)
class DeadLetterView:
    """One dead letter: why, where it sits, and the start of its value."""

    reason: str
    detail: str
    at_ms: int
    partition: int
    offset: int
    blackbox_id: str | None
    target_topic: str | None
    preview: str


class DeadLetters(BaseModel):
    items: list[DeadLetterView]


class DeadLetterTail:
    """Reads the last PER_PARTITION records of each partition of the dead-letter topic."""

    def __init__(self, config: Mapping[str, str], topic: str) -> None:
        self.topic = topic
        self._config = {
            **config,
            "group.id": f"blackbox-dlq-tail-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
        }
        self._consumer: Consumer | None = None
        self._lock = threading.Lock()
        self._cached: tuple[float, list[DeadLetterView]] | None = None

    def recent(self, limit: int) -> list[DeadLetterView]:
        """Newest first, at most `limit`."""
        with self._lock:
            if self._cached is None or time.monotonic() - self._cached[0] > CACHE_SECONDS:
                self._cached = (time.monotonic(), self._read())
            return self._cached[1][:limit]

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()

    def _read(self) -> list[DeadLetterView]:
        consumer = self._consumer = self._consumer or Consumer(self._config)
        metadata = consumer.list_topics(self.topic, timeout=READ_SECONDS).topics.get(self.topic)
        if metadata is None or metadata.error is not None:
            return []
        ends, starts = {}, []
        for partition in metadata.partitions:
            low, high = consumer.get_watermark_offsets(
                TopicPartition(self.topic, partition), timeout=READ_SECONDS
            )
            if high > low:
                ends[partition] = high
                starts.append(TopicPartition(self.topic, partition, max(low, high - PER_PARTITION)))
        consumer.assign(starts)
        return sorted(self._until(consumer, ends), key=lambda v: v.at_ms, reverse=True)

    def _until(self, consumer: Consumer, ends: dict[int, int]) -> list[DeadLetterView]:
        """Read each partition up to its end (or the deadline)."""
        read: list[DeadLetterView] = []
        deadline = time.monotonic() + READ_SECONDS
        while ends and time.monotonic() < deadline:
            for message in consumer.consume(100, timeout=0.2):
                if message.error() is not None:
                    continue
                read.append(_view(message))
                if (message.offset() or 0) + 1 >= ends.get(message.partition() or 0, 0):
                    ends.pop(message.partition() or 0, None)
        return read


def _view(message: Message) -> DeadLetterView:
    headers: dict[str, bytes] = {}
    for name, value in read_headers(message) or []:
        if value is not None:
            headers[name] = value

    def text(name: str) -> str | None:
        value = headers.get(name)
        return None if value is None else value.decode("utf-8", "replace")

    return DeadLetterView(
        reason=text(REASON_HEADER) or "unknown", detail=text(DETAIL_HEADER) or "",
        at_ms=message.timestamp()[1], partition=message.partition() or 0,
        offset=message.offset() or 0, blackbox_id=text("blackbox-id"),
        target_topic=text("blackbox-target-topic"),
        preview=preview(message.value() or b""),
    )  # fmt: skip
