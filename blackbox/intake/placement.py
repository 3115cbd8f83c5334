"""Where a signed keyed record must sit: on its key's partition, as Java places it.

A signature covers a record's topic, key, value and headers, not its partition: a producer
picks the partition after the record is built. Whoever may write to an intake topic could
copy a signed record onto another partition, where the intake may read it before the
original; the nonce is then the copy's, and the original is refused as a replay (a cancel
defeated, so what it cancelled fires). Every producer partitions keys as Java's default
partitioner does (README), so a signed record with a key is taken only on its key's
partition. A keyless one has no such place: signers key their records (docs/SIGNING.md).

A topic that grows moves keys: a record written under 3 partitions sits where murmur2 % 3
put it, one written a moment after the growth where % 4 puts it, and the intake learns of
the growth only at its next metadata refresh. So every count a topic's intake has seen is
kept (in Redis, for every replica and the next start), a record is taken on its key's
partition under any of them, and a record on no such partition makes the intake read the
count again before it refuses it. A copy can then move only between a key's partitions
under the counts the topic has had, never anywhere else.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException

from blackbox.errors import DeadLetterReason, InvalidEnvelope
from blackbox.kafka.clients import java_partition
from blackbox.storage.store import RedisStore

# How long one metadata request may take before the batch is retried.
METADATA_SECONDS = 10.0


class Placement:
    """The partition counts of the intake's topics, and the check they serve."""

    def __init__(self, consumer: Consumer, store: RedisStore | None = None) -> None:
        """`store`: whose Redis keeps the counts seen (None: this process alone)."""
        self.consumer = consumer
        self._store = store
        self._counts: dict[str, int] = {}
        self._seen: dict[str, set[int]] = {}

    def forget(self, topics: Iterable[str]) -> None:
        """Drop the counts of `topics`: read again before their next batch (at assignment)."""
        for topic in topics:
            self._counts.pop(topic, None)

    def prepare(self, places: Iterable[tuple[str, int]]) -> None:
        """Know the partition count of every topic of these (topic, partition) places, before
        any record of a batch is applied; KafkaException when the metadata cannot be read."""
        for topic, partition in places:
            if self._counts.get(topic, 0) <= partition:
                self._refresh(topic)

    def check(self, topic: str, partition: int, key: bytes | None) -> None:
        """InvalidEnvelope (bad_signature) when a signed record with a key is on none of the
        partitions its key went to under the counts the topic has had, its count read again
        first; `prepare` has read the topic's count."""
        if key is None or partition in self._homes(topic, key):
            return
        self._refresh(topic)
        homes = self._homes(topic, key)
        if partition not in homes:
            raise InvalidEnvelope(
                DeadLetterReason.BAD_SIGNATURE,
                f"a signed record sits on partition {partition}, its key's partition is "
                f"{' or '.join(map(str, sorted(homes)))}: a copy moved",
            )

    def _homes(self, topic: str, key: bytes) -> set[int]:
        return {java_partition(key, count) for count in self._seen.get(topic, set())}

    def _refresh(self, topic: str) -> None:
        """Read the topic's count now, and keep it among those seen (merged with Redis's)."""
        count = self._read(topic)
        self._counts[topic] = count
        seen = self._seen.setdefault(topic, set())
        seen |= self._stored(topic)
        if count not in seen and self._store is not None:
            seen.add(count)
            key = self._store.layout.partition_counts
            self._store.client.hset(key, topic, ",".join(map(str, sorted(seen))))
        seen.add(count)

    def _stored(self, topic: str) -> set[int]:
        """The counts Redis keeps for `topic` (every replica's, earlier starts' too)."""
        if self._store is None:
            return set()
        found: Any = self._store.client.hget(self._store.layout.partition_counts, topic)
        text = found.decode() if isinstance(found, bytes) else str(found or "")
        return {int(part) for part in text.split(",") if part.isdigit()}

    def _read(self, topic: str) -> int:
        metadata = self.consumer.list_topics(topic, timeout=METADATA_SECONDS).topics.get(topic)
        if metadata is None or metadata.error is not None or not metadata.partitions:
            error = None if metadata is None else metadata.error
            raise KafkaException(error or KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART, topic))
        return len(metadata.partitions)
