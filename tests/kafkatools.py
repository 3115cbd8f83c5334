"""Test helpers that talk to a real broker: produce envelopes, read topics to the end."""

from __future__ import annotations

import gc
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import orjson
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from blackbox.envelope import normalize_headers

Header = tuple[str, bytes | None]
# The key of the end markers read_to_end() writes: readers skip them, tests never see them.
END_MARKER_KEY = b"kafkatools-end-marker"


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
    created_ms: int = 0  # the record's timestamp: its producer's create time

    def header(self, name: str) -> str:
        raw = self.headers[name]
        assert raw is not None
        return raw.decode()


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def envelope(topic: str, message: object, countdown: float) -> bytes:
    return orjson.dumps({"topic": topic, "message": message, "countdown": countdown})


def produce(  # noqa: PLR0913 - the record's parts, each with a default
    bootstrap: str,
    topic: str,
    values: Iterable[bytes | None],
    headers: Sequence[Header] = (),
    key: bytes | None = None,
    *,
    timestamp_ms: int = 0,
) -> int:
    """Produce every value and wait until the broker acknowledged all of them.

    `timestamp_ms` sets the records' create time (0: now), as a sender's clock would."""
    # Not idempotent: its setup costs a round trip per call, and these sends meet no broker
    # failure (the fault tests' senders are idempotent).
    failures: list[KafkaError] = []

    def report(error: KafkaError | None, _message: object) -> None:
        if error is not None:
            failures.append(error)

    count = 0
    with Producer({"bootstrap.servers": bootstrap, "linger.ms": 5}) as producer:
        for value in values:
            producer.produce(topic, value, key, headers=list(headers), on_delivery=report,
                             timestamp=timestamp_ms)  # fmt: skip
            producer.poll(0)
            count += 1
        assert producer.flush(30) == 0
    assert failures == []
    return count


def produce_to(
    bootstrap: str, topic: str, records: Iterable[tuple[int | None, bytes | None, bytes]],
    headers: Sequence[Header] = (),
) -> None:  # fmt: skip
    """Produce (partition, key, value) records, each to its partition (None: any), each
    with `headers`."""
    with Producer({"bootstrap.servers": bootstrap}) as producer:
        for partition, key, value in records:
            if partition is None:
                producer.produce(topic, value, key, headers=list(headers))
            else:
                producer.produce(topic, value, key, partition=partition, headers=list(headers))
        assert producer.flush(30) == 0


def rewind_intake(env: Mapping[str, str]) -> None:
    """What a replica killed after applying, before committing, leaves: the service's
    group commit on the intake topic's partition 0 back at offset 0 (every record is read
    again). `env`: the service's environment."""
    consumer = Consumer({"bootstrap.servers": env["KAFKA_BOOTSTRAP_SERVERS"],
                         "group.id": env["BLACKBOX_GROUP_ID"]})  # fmt: skip
    try:
        consumer.commit(offsets=[TopicPartition(env["BLACKBOX_INTAKE_TOPIC"], 0, 0)],
                        asynchronous=False)  # fmt: skip
    finally:
        consumer.close()


def end_offset(bootstrap: str, topic: str, partition: int = 0) -> int:
    """The offset the next record written to `topic`/`partition` will get."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("end")})
    try:
        _, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
        return int(high)
    finally:
        consumer.close()


class TopicReader:
    """Reads a topic from its beginning with assign(), never joining a group."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.bootstrap, self.topic = bootstrap, topic
        self.partitions = 0
        self.markers: set[tuple[int, bytes]] = set()
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
            if m.key() == END_MARKER_KEY:
                self.markers.add((m.partition() or 0, m.value() or b""))
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
                    created_ms=m.timestamp()[1],
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

    def read_to_end(self, timeout: float = 30.0) -> list[Received]:
        """Every record the topic holds now, however many there are.

        wait_count() returns at the N-th record, so a copy written after the last original
        would go unseen. This writes a marker to the end of each partition and reads until
        every marker is back: whatever the topic held before is read by then. (The broker's
        end offset would do as well on Apache Kafka; Tansu reports it short of the log end.)
        """
        self._assign_new_partitions()
        token = uuid.uuid4().hex.encode()
        partitions = range(self.partitions) if self.partitions else [None]
        produce_to(self.bootstrap, self.topic, [(p, END_MARKER_KEY, token) for p in partitions])
        self.wait_for(lambda _: self._markers_back(token), timeout)
        return self.records

    def _markers_back(self, token: bytes) -> bool:
        seen = {p for p, t in self.markers if t == token}
        return self.partitions > 0 and seen >= set(range(self.partitions))

    def close(self) -> None:
        self.consumer.close()


KafkaClient = Producer | Consumer | AdminClient


def open_clients() -> list[KafkaClient]:
    """Every Kafka client (producer, consumer, admin client) of this process that something
    still holds and nobody closed: its librdkafka threads go on connecting to its broker.
    Those only a reference cycle keeps are collected first (that closes them)."""
    gc.collect()
    found = [o for o in gc.get_objects() if isinstance(o, Producer | Consumer | AdminClient)]
    return [client for client in found if _is_open(client)]


def _is_open(client: KafkaClient) -> bool:
    try:
        if isinstance(client, Consumer):
            client.assignment()
        else:
            client.poll(0)
    except RuntimeError:  # "... has been closed", "Consumer closed"
        return False
    return True


def close_client(client: KafkaClient) -> None:
    """Close a client at once: a producer's queue purged, not flushed."""
    if isinstance(client, Consumer):
        client.close()
    elif isinstance(client, AdminClient):
        client.__exit__(None, None, None)  # an AdminClient's only way to be destroyed
    else:
        client.purge()
        client.close()


def holders(client: KafkaClient) -> str:
    """What holds `client`: the types of the objects referring to it (a test's lead)."""
    names = set()
    for referrer in gc.get_referrers(client):
        owner = _owner_of(referrer)
        if owner is not None:
            names.add(owner)
    return ", ".join(sorted(names)) or "nothing found"


def _owner_of(referrer: object) -> str | None:
    if isinstance(referrer, dict):
        owners = [o for o in gc.get_referrers(referrer) if getattr(o, "__dict__", None) is referrer]
        return ", ".join(f"{type(o).__module__}.{type(o).__qualname__}" for o in owners) or None
    if isinstance(referrer, list):  # our own list of found clients, or some list
        return None
    return f"{type(referrer).__module__}.{type(referrer).__qualname__}"


# How late a delivery may be on the test stack: generous (a loaded 2-core machine), yet a
# message fired one poll interval late, or 15 s late, fails.
LATENESS_BOUND_MS = 2_000


def assert_on_time(record: Received, due_ms: float) -> None:
    """`record` arrived at or after `due_ms` (what the sender asked for), and not much later."""
    late = record.received_ms - due_ms
    assert 0 <= late <= LATENESS_BOUND_MS, f"{late:.0f} ms after due ({record.value!r:.60})"


def now_ms() -> float:
    """Wall-clock epoch milliseconds, as Kafka record timestamps count them."""
    return time.time() * 1000


def wait_until(condition: Callable[[], bool], timeout: float = 30.0, what: str = "") -> None:
    """Poll `condition` every 20 ms; fail at the deadline."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout} s waiting for {what or condition}")
