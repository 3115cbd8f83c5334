"""Test helpers that talk to a real broker: produce envelopes, read topics to the end."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import orjson
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from blackbox.envelope import normalize_headers

Header = tuple[str, bytes | None]


@dataclass(frozen=True)
class Received:
    """A record read back from a topic, with the instant this reader got it."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: dict[str, bytes | None]
    received_ms: int

    def header(self, name: str) -> str:
        raw = self.headers[name]
        assert raw is not None
        return raw.decode()


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def envelope(topic: str, message: object, countdown: float) -> bytes:
    return orjson.dumps({"topic": topic, "message": message, "countdown": countdown})


def produce(
    bootstrap: str,
    topic: str,
    values: Iterable[bytes | None],
    headers: Sequence[Header] = (),
    key: bytes | None = None,
) -> int:
    """Produce every value and wait until the broker acknowledged all of them."""
    # Not idempotent: its setup costs a round trip per call, and these sends meet no broker
    # failure (the fault tests' senders are idempotent).
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    failures: list[KafkaError] = []

    def report(error: KafkaError | None, _message: object) -> None:
        if error is not None:
            failures.append(error)

    count = 0
    for value in values:
        producer.produce(topic, value, key, headers=list(headers), on_delivery=report)
        producer.poll(0)
        count += 1
    assert producer.flush(30) == 0
    assert failures == []
    return count


class TopicReader:
    """Reads a topic from its beginning with assign(), never joining a group."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.topic = topic
        self.partitions = 0
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": unique("reader"),
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "fetch.wait.max.ms": 20,
                "topic.metadata.refresh.interval.ms": 1000,
            }
        )
        self.records: list[Received] = []

    def _assign_new_partitions(self) -> None:
        """Follow the topic as it appears and grows (brokers may auto-create it)."""
        metadata = self.consumer.list_topics(self.topic, timeout=2).topics.get(self.topic)
        if metadata is None or metadata.error is not None:
            return
        count = len(metadata.partitions)
        if count > self.partitions:
            new = [TopicPartition(self.topic, p, 0) for p in range(self.partitions, count)]
            self.consumer.incremental_assign(new)
            self.partitions = count

    def poll(self, timeout: float = 0.2) -> None:
        self._assign_new_partitions()
        for m in self.consumer.consume(10_000, timeout=timeout):
            if m.error() is not None:
                continue
            self.records.append(
                Received(
                    topic=m.topic() or "",
                    partition=m.partition() or 0,
                    offset=m.offset() or 0,
                    key=m.key(),
                    value=m.value(),
                    headers=dict(normalize_headers(m.headers())),
                    received_ms=time.time_ns() // 1_000_000,
                )
            )

    def wait_for(
        self, condition: Callable[[list[Received]], bool], timeout: float = 30.0
    ) -> list[Received]:
        """Poll until `condition(records)` holds; fail the test at the deadline."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.poll()
            if condition(self.records):
                return self.records
        raise AssertionError(
            f"timed out after {timeout} s on {self.topic}: {len(self.records)} records read"
        )

    def wait_count(self, count: int, timeout: float = 30.0) -> list[Received]:
        return self.wait_for(lambda records: len(records) >= count, timeout)

    def close(self) -> None:
        self.consumer.close()


def wait_until(condition: Callable[[], bool], timeout: float = 30.0, what: str = "") -> None:
    """Poll `condition` every 20 ms; fail at the deadline."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout} s waiting for {what or condition}")
