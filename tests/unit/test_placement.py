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


def _key_moved_by(old: int, new: int) -> bytes:
    """A key whose partition differs under `old` and `new` partitions."""
    for n in range(1000):
        key = f"inv-{n}".encode()
        if java_partition(key, old) != java_partition(key, new):
            return key
    raise AssertionError("no key moves")


def test_a_topic_that_grew_takes_its_keys_under_the_old_count_and_the_new() -> None:
    """Guarantee 7 without harming the owner: partitions added to the intake topic (3 -> 4)
    move keys, and the intake learns of it late. A signed record on its key's partition
    under the new count makes the intake read the count again and is taken; one written
    before the growth, on its key's partition under the old count, is taken too; any other
    partition is still refused."""
    placement, consumer = _placement({"in": 3})
    key = _key_moved_by(3, 4)
    old_home, new_home = java_partition(key, 3), java_partition(key, 4)
    placement.prepare([("in", 0)])
    consumer.counts["in"] = 4  # grown; the intake has not read it yet
    placement.check("in", new_home, key)
    placement.check("in", old_home, key)
    other = next(p for p in range(4) if p not in (old_home, new_home))
    with pytest.raises(InvalidEnvelope) as refused:
        placement.check("in", other, key)
    assert refused.value.reason is DeadLetterReason.BAD_SIGNATURE
