"""Kafka client configuration and the classification of delivery errors.

The only module that knows librdkafka property names. Order of precedence: our defaults,
then the operator's KAFKA_* properties, then the few properties our guarantees rest on.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from typing import Any

from confluent_kafka import (
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicCollection,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from blackbox.envelope import Header, normalize_headers
from blackbox.errors import DeadLetterReason, SettingsError
from blackbox.settings import Settings

_CONSUMER_DEFAULTS = {
    "auto.offset.reset": "earliest",
    "fetch.wait.max.ms": "100",
    "auto.commit.interval.ms": "1000",
}
_CONSUMER_FORCED = {
    # The at-least-once recipe: offsets are stored only after the work is done.
    "enable.auto.offset.store": "false",
    "enable.auto.commit": "true",
}
# Batching: the intake's answers and dead letters wait up to 2 ms to share a request. The
# firing producer waits up to 5 ms: a delivery's record is stamped (and its own lateness
# measured) when it is handed over at its due instant, and a steady stream shares one
# produce request per 5 ms instead of one per message (at 1,000/s the broker's CPU per
# message fell from about 330 to 100 µs, the consumer's p50 rose from 1 to 5 ms, the
# plain relay's; `python -m benchmarks.steady`). A burst fills its batches sooner.
ANSWERS_LINGER_MS = 2
FIRING_LINGER_MS = 5
# A keyed record goes to the partition Java's default partitioner (murmur2) picks, as Spark's
# connector and every Java producer do: a schedule and its cancel sent by different
# producers then land on one partition, in order. librdkafka's own default is CRC32.
JAVA_PARTITIONER = "murmur2_random"
_MURMUR2_M, _MURMUR2_SEED, _U32 = 0x5BD1E995, 0x9747B28C, 0xFFFFFFFF
_PRODUCER_FORCED = {"enable.idempotence": "true", "acks": "all"}
# Whether librdkafka reports successful deliveries too: blackbox decides, per producer.
_REPORT_ONLY_ERRORS = "delivery.report.only.error"

# Errors that will not go away by retrying soon: the message counts an attempt toward
# dead-lettering. Everything else (timeouts, brokers away) is retried without limit.
_LASTING = {
    KafkaError.UNKNOWN_TOPIC_OR_PART: DeadLetterReason.UNKNOWN_TOPIC,
    KafkaError._UNKNOWN_TOPIC: DeadLetterReason.UNKNOWN_TOPIC,
    KafkaError.TOPIC_AUTHORIZATION_FAILED: DeadLetterReason.UNKNOWN_TOPIC,
    KafkaError.TOPIC_EXCEPTION: DeadLetterReason.UNKNOWN_TOPIC,
    KafkaError.MSG_SIZE_TOO_LARGE: DeadLetterReason.RECORD_TOO_LARGE,
    KafkaError.RECORD_LIST_TOO_LARGE: DeadLetterReason.RECORD_TOO_LARGE,
    KafkaError.INVALID_RECORD: DeadLetterReason.DELIVERY_FAILED,
    KafkaError.POLICY_VIOLATION: DeadLetterReason.DELIVERY_FAILED,
}


def read_headers(message: Message) -> list[Header] | None:
    """A record's headers as (name, bytes) pairs, or None when they cannot be read.

    confluent-kafka decodes header names as UTF-8 and fails (a SystemError wrapping a
    UnicodeDecodeError) on one that is not; a second `headers()` call on such a message
    was seen to crash the process. So read them once, here, and keep what this returns.
    """
    try:
        return normalize_headers(message.headers())
    except (SystemError, UnicodeDecodeError):
        return None


def java_partition(key: bytes, partitions: int) -> int:
    """The partition Java's default partitioner gives a keyed record (Kafka's murmur2 of the
    key, made positive, modulo the partition count): where JAVA_PARTITIONER puts it too."""
    m = _MURMUR2_M
    h = (_MURMUR2_SEED ^ len(key)) & _U32
    whole = len(key) - len(key) % 4
    for i in range(0, whole, 4):
        k = (int.from_bytes(key[i : i + 4], "little") * m) & _U32
        k = ((k ^ (k >> 24)) * m) & _U32
        h = ((h * m) & _U32) ^ k
    tail = key[whole:]
    if tail:
        h = ((h ^ int.from_bytes(tail, "little")) * m) & _U32
    h = ((h ^ (h >> 13)) * m) & _U32
    h ^= h >> 15
    return (h & 0x7FFFFFFF) % partitions


def lasting_reason(error: KafkaError) -> DeadLetterReason | None:
    """The dead-letter reason for an error retrying will not fix; None if it may pass."""
    return _LASTING.get(error.code())


def consumer_config(settings: Settings) -> dict[str, Any]:
    return {
        **_CONSUMER_DEFAULTS,
        **settings.kafka,
        **settings.kafka_consumer,
        "group.id": settings.group_id,
        **_CONSUMER_FORCED,
    }


def producer_config(
    settings: Settings, *, report_only_errors: bool = False, linger_ms: int = ANSWERS_LINGER_MS
) -> dict[str, Any]:
    """`report_only_errors`: no report per acknowledged record (the intake's answers and
    dead letters are many; a batch counts as landed once the producer's queue is empty).
    `linger_ms`: the default wait to batch; KAFKA_PRODUCER_LINGER_MS overrides it."""
    # Never 0: librdkafka reads 0 as "no timeout", which would outlive any lease.
    timeout_ms = max(1, math.ceil(settings.delivery_timeout * 1000))
    timeout = {"message.timeout.ms": str(timeout_ms)}
    # A topic missing from the metadata must fail as unknown (lasting: dead-lettered after
    # its attempts) before the message times out (transient: retried without end).
    propagation = {"topic.metadata.propagation.max.ms": str(max(1, timeout_ms // 2))}
    return {
        "linger.ms": str(linger_ms),
        "partitioner": JAVA_PARTITIONER,
        **propagation,
        **settings.kafka,
        **settings.kafka_producer,
        **timeout,
        **_PRODUCER_FORCED,
        _REPORT_ONLY_ERRORS: report_only_errors,  # confluent-kafka takes a bool here
    }


def new_consumer(settings: Settings) -> Consumer:
    with _naming_bad_settings():
        return Consumer(consumer_config(settings))


def new_producer(
    settings: Settings, *, report_only_errors: bool = False, linger_ms: int = ANSWERS_LINGER_MS
) -> Producer:
    config = producer_config(settings, report_only_errors=report_only_errors, linger_ms=linger_ms)
    with _naming_bad_settings():
        return Producer(config)


@contextmanager
def _naming_bad_settings() -> Iterator[None]:
    try:
        yield
    except KafkaException as e:
        raise SettingsError(f"a KAFKA_* setting is invalid: {e.args[0].str()}") from e


def ensure_topics(  # noqa: PLR0913 - a new topic's settings, each by name
    config: Mapping[str, Any], names: Iterable[str], partitions: int = 1, timeout: float = 15,
    *, replication_factor: int = -1, topic_config: Mapping[str, str] | None = None,
) -> None:  # fmt: skip
    """Create the topics that do not exist yet (an existing topic is left as it is), with
    `replication_factor` copies (-1: the broker's default) and `topic_config`."""
    admin = AdminClient(dict(config))
    new = [NewTopic(n, num_partitions=partitions, replication_factor=replication_factor,
                    config=dict(topic_config or {})) for n in names]  # fmt: skip
    futures = admin.create_topics(new, request_timeout=timeout)
    for future in futures.values():
        try:
            future.result(timeout)
        except KafkaException as e:
            if e.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise


class TopicIds:
    """Names the id of each given topic through one admin client, kept until `close()`
    (a call raises KafkaException if it cannot ask; a broker that knows no topic ids gives
    the zero id)."""

    def __init__(self, config: Mapping[str, Any], timeout: float = 10.0) -> None:
        self.timeout = timeout
        # An AdminClient has no close(): leaving its context is what destroys it.
        self._closing = ExitStack()
        self._admin = self._closing.enter_context(AdminClient(dict(config)))

    def __call__(self, names: Sequence[str]) -> dict[str, str]:
        collection = TopicCollection(list(names))
        futures = self._admin.describe_topics(collection, request_timeout=self.timeout)
        return {n: str(future.result(self.timeout).topic_id) for n, future in futures.items()}

    def close(self) -> None:
        self._closing.close()


def topic_id_lookup(config: Mapping[str, Any], timeout: float = 10.0) -> TopicIds:
    """A callable naming the id of each given topic; close it when done."""
    return TopicIds(config, timeout)


def close_producer(producer: Producer) -> None:
    """Close a producer whose records were flushed or given up: what is left is purged
    (close() alone would wait for it up to message.timeout.ms), then its connections end."""
    producer.purge()
    producer.close()


def committed_offsets(
    settings: Settings, timeout: float = 10.0
) -> Callable[[Iterable[tuple[str, int]]], dict[tuple[str, int], int | None]]:
    """A function giving the intake group's committed offset of each (topic, partition),
    None where none is committed (raises KafkaException if it cannot ask). It reads the
    commits without joining the group."""

    def committed(partitions: Iterable[tuple[str, int]]) -> dict[tuple[str, int], int | None]:
        asked = [TopicPartition(topic, partition) for topic, partition in partitions]
        if not asked:
            return {}
        consumer = new_consumer(settings)
        try:
            found = consumer.committed(asked, timeout=timeout)
        finally:
            consumer.close()
        return {(tp.topic, tp.partition): tp.offset if tp.offset >= 0 else None for tp in found}

    return committed
