"""Wait for blackbox's answer to one request, read from the events topic.

Mark the topic's end before sending, then wait: only events written after the mark count.
The reader assigns partitions itself (no consumer group), so it joins nothing and commits
nothing.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from typing import Any

import orjson
from confluent_kafka import Consumer, KafkaException, TopicPartition


class Answers:
    """The events topic from a mark onwards."""

    def __init__(self, config: Mapping[str, str], topic: str) -> None:
        self.topic = topic
        self.consumer = Consumer(
            {
                **config,
                "group.id": f"blackbox-answers-{uuid.uuid4().hex[:8]}",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
            }
        )

    def mark(self, timeout: float = 10.0) -> None:
        """Start reading at the current end of every partition of the events topic."""
        metadata = self.consumer.list_topics(self.topic, timeout=timeout).topics.get(self.topic)
        if metadata is None or metadata.error is not None:
            raise KafkaException(f"the events topic {self.topic!r} is not available")
        starts = []
        for partition in metadata.partitions:
            tp = TopicPartition(self.topic, partition)
            _, high = self.consumer.get_watermark_offsets(tp, timeout=timeout)
            starts.append(TopicPartition(self.topic, partition, high))
        self.consumer.assign(starts)

    def wait(
        self,
        caller: str | None,
        schedule_id: str,
        timeout: float,
        outcomes: frozenset[str] | None = None,
    ) -> dict[str, Any] | None:
        """The first event about the caller's `schedule_id` after the mark (with one of
        `outcomes`, when given); None at the deadline."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for message in self.consumer.consume(100, timeout=0.2):
                if message.error() is not None or message.value() is None:
                    continue
                event: object = orjson.loads(message.value() or b"null")
                if isinstance(event, dict) and _about(event, caller, schedule_id, outcomes):
                    return event
        return None

    def close(self) -> None:
        self.consumer.close()


def _about(
    event: dict[str, Any], caller: str | None, schedule_id: str, outcomes: frozenset[str] | None
) -> bool:
    if (event.get("caller"), event.get("id")) != (caller, schedule_id):
        return False
    return outcomes is None or event.get("outcome") in outcomes
