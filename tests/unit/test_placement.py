"""Where a signed keyed record must sit, without processes: its key's partition under the
topic's partition count, read from the consumer's metadata once and again when it may have
changed."""

from __future__ import annotations

from types import SimpleNamespace
from typing import cast

import pytest
from confluent_kafka import Consumer, KafkaException

from blackbox.errors import DeadLetterReason, InvalidEnvelope
from blackbox.intake.placement import Placement
from blackbox.kafka.clients import java_partition


class _Consumer:
    """Stands in for confluent-kafka's Consumer: answers list_topics() from `counts`."""

    def __init__(self, counts: dict[str, int]) -> None:
        self.counts = counts
        self.asked: list[str] = []

    def list_topics(self, topic: str, timeout: float) -> SimpleNamespace:
        self.asked.append(topic)
        known = topic in self.counts
        partitions = dict.fromkeys(range(self.counts.get(topic, 0)))
        found = SimpleNamespace(error=None, partitions=partitions)
        return SimpleNamespace(topics={topic: found} if known else {})


def _placement(counts: dict[str, int]) -> tuple[Placement, _Consumer]:
    consumer = _Consumer(counts)
    return Placement(cast(Consumer, consumer)), consumer


def test_a_signed_keyed_record_is_taken_only_on_its_keys_partition() -> None:
    """Guarantee 7: a signed record with a key passes on the partition Java gives its key
    and is refused as bad_signature on any other (a copy moved); a keyless one passes."""
    placement, _ = _placement({"in": 6})
    home = java_partition(b"inv-1", 6)
    placement.prepare([("in", 0)])
    placement.check("in", home, b"inv-1")
    placement.check("in", (home + 1) % 6, None)
    with pytest.raises(InvalidEnvelope) as refused:
        placement.check("in", (home + 1) % 6, b"inv-1")
    assert refused.value.reason is DeadLetterReason.BAD_SIGNATURE
    assert f"its key's partition is {home}: a copy moved" in refused.value.detail


def test_partition_counts_are_read_once_and_again_after_an_assignment() -> None:
    """A count is read once per topic; again once forgotten (at assignment) or when a record
    comes from a partition past it (the topic grew); a topic the broker does not name
    fails the batch with KafkaException rather than refusing its records."""
    placement, consumer = _placement({"in": 2})
    placement.prepare([("in", 0), ("in", 1)])
    placement.prepare([("in", 1)])
    assert consumer.asked == ["in"]
    consumer.counts["in"] = 4
    placement.prepare([("in", 3)])
    placement.forget(["in"])
    placement.prepare([("in", 0)])
    assert consumer.asked == ["in", "in", "in"]
    with pytest.raises(KafkaException):
        placement.prepare([("gone", 0)])
