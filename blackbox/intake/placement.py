"""Where a signed keyed record must sit: on its key's partition, as Java places it.

A signature covers a record's topic, key, value and headers, not its partition: a producer
picks the partition after the record is built. Whoever may write to an intake topic could
copy a signed record onto another partition, where the intake may read it before the
original; the nonce is then the copy's, and the original is refused as a replay (a cancel
defeated, so what it cancelled fires). Every producer partitions keys as Java's default
partitioner does (README), so a signed record with a key is taken only on its key's
partition. A keyless one has no such place: signers key their records (docs/SIGNING.md).

The partition counts come from the consumer's metadata, read once per topic and again
after each assignment (partitions added to a topic make the group rebalance).
"""

from __future__ import annotations

from collections.abc import Iterable

from confluent_kafka import Consumer, KafkaError, KafkaException

from blackbox.errors import DeadLetterReason, InvalidEnvelope
from blackbox.kafka.clients import java_partition

# How long one metadata request may take before the batch is retried.
METADATA_SECONDS = 10.0


class Placement:
    """The partition counts of the intake's topics, and the check they serve."""

    def __init__(self, consumer: Consumer) -> None:
        self.consumer = consumer
        self._counts: dict[str, int] = {}

    def forget(self, topics: Iterable[str]) -> None:
        """Drop the counts of `topics`: read again before their next batch (at assignment)."""
        for topic in topics:
            self._counts.pop(topic, None)

    def prepare(self, places: Iterable[tuple[str, int]]) -> None:
        """Know the partition count of every topic of these (topic, partition) places, before
        any record of a batch is applied; KafkaException when the metadata cannot be read."""
        for topic, partition in places:
            if self._counts.get(topic, 0) <= partition:
                self._counts[topic] = self._read(topic)

    def check(self, topic: str, partition: int, key: bytes | None) -> None:
        """InvalidEnvelope (bad_signature) when a signed record with a key is not on the
        partition its key goes to; `prepare` has read the topic's count."""
        if key is None:
            return
        home = java_partition(key, self._counts[topic])
        if partition != home:
            raise InvalidEnvelope(
                DeadLetterReason.BAD_SIGNATURE,
                f"a signed record sits on partition {partition}, its key's partition is "
                f"{home}: a copy moved",
            )

    def _read(self, topic: str) -> int:
        metadata = self.consumer.list_topics(topic, timeout=METADATA_SECONDS).topics.get(topic)
        if metadata is None or metadata.error is not None or not metadata.partitions:
            error = None if metadata is None else metadata.error
            raise KafkaException(error or KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART, topic))
        return len(metadata.partitions)
