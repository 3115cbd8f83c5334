"""Measuring deliveries from outside the service: arrival time against `blackbox-due-ms`."""

from __future__ import annotations

import multiprocessing
import statistics
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.queues import Queue

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from blackbox.envelope import normalize_headers


@dataclass
class Deliveries:
    """Every copy of every id read from a topic: (arrival ms, due ms); and the ids each
    distinct record value (the load generators send a number each) arrived under."""

    copies: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    ids_by_value: dict[bytes, set[str]] = field(default_factory=dict)
    # Per id, its first copy's record timestamp (its producer's create time, ms).
    created: dict[str, int] = field(default_factory=dict)
    # Per id, each copy's `blackbox-attempt` header, in arrival order.
    attempts: dict[str, list[int]] = field(default_factory=dict)

    def first_copies(self) -> list[tuple[int, int]]:
        return [c[0] for c in self.copies.values()]

    def lateness_ms(self) -> list[int]:
        return [arrived - due for arrived, due in self.first_copies()]

    def own_lateness_ms(self) -> list[int]:
        """The service's own part of each first copy's lateness: the record's create time
        (stamped as the service handed it to its producer) minus its due time."""
        return [self.created[i] - c[0][1] for i, c in self.copies.items() if i in self.created]

    def copies_by_attempt(self) -> dict[str, int]:
        """The copies beyond each id's first: `again` carry a later attempt (the id was
        fired again, its lease run out or its delivery failed), `as_new` the first attempt
        again (the id was stored and fired anew, as from an intake record read again)."""
        again = as_new = 0
        for numbers in self.attempts.values():
            for attempt in numbers[1:]:
                again += attempt > 1
                as_new += attempt <= 1
        return {"again": again, "as_new": as_new}

    def duplicated(self) -> int:
        return sum(len(c) - 1 for c in self.copies.values())

    def without_probes(self) -> tuple[Deliveries, list[int]]:
        """What blackbox delivered, and the lateness (ms) of the probes beside it."""
        probes = [a - d for i, ((a, d), *_) in self.copies.items() if i.startswith(PROBE_PREFIX)]
        copies = {i: c for i, c in self.copies.items() if not i.startswith(PROBE_PREFIX)}
        values = {v: i for v, i in self.ids_by_value.items() if v != PROBE_VALUE}
        created = {i: t for i, t in self.created.items() if i in copies}
        return Deliveries(copies, values, created), probes

    def tally(self, accepted: int) -> dict[str, int]:
        """Counted by message, not by id: a message missing and another delivered twice
        under two ids would otherwise pass for 0 lost, 0 duplicated."""
        return {
            "delivered": len(self.ids_by_value), "lost": accepted - len(self.ids_by_value),
            "duplicated": self.duplicated(),
            "messages_under_two_ids": sum(len(i) > 1 for i in self.ids_by_value.values()),
        }  # fmt: skip


# A probe goes straight to a target topic, due the instant it is sent: its lateness is
# the local broker's own produce-to-consume time, the floor under blackbox's figures.
PROBE_PREFIX, PROBE_VALUE = "probe-", b"probe"


def new_prober(bootstrap: str) -> Producer:
    """A producer for probes alone: no linger, so a probe waits for nothing but the broker."""
    return Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})


def probe(producer: Producer, topic: str, number: int) -> None:
    headers: list[tuple[str, str | bytes | None]] = [
        ("blackbox-id", f"{PROBE_PREFIX}{number}".encode()),
        ("blackbox-due-ms", str(time.time_ns() // 1_000_000).encode()),
    ]
    producer.produce(topic, PROBE_VALUE, headers=headers)
    producer.poll(0)


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summary(values: Sequence[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p90": None, "p99": None, "max": None, "mean": None}
    return {
        "p50": percentile(values, 0.5),
        "p90": percentile(values, 0.9),
        "p99": percentile(values, 0.99),
        "max": max(values),
        "mean": round(statistics.fmean(values), 2),
    }


@dataclass(frozen=True)
class Window:
    """A topic read live only between two wall-clock times (epoch seconds).

    A long run on Tansu rotates its target topics so that none grows large: that broker's
    fetches cost more the longer a partition's log, and a reader polling every few ms
    stalls it past about 8,000 record batches.
    """

    topic: str
    opens: float
    closes: float

    def is_open(self) -> bool:
        return self.opens <= time.time() < self.closes


def _until(windows: Sequence[Window]) -> float:
    return max(w.closes for w in windows) - time.time()


def count_copies(bootstrap: str, topic: str, timeout: float = 60) -> Counter[str]:
    """How many copies of each `blackbox-id` a topic holds, read to its end."""
    consumer = Consumer({
        "bootstrap.servers": bootstrap, "group.id": f"count-{uuid.uuid4().hex}",
        "enable.auto.commit": False, "isolation.level": "read_uncommitted",
    })  # fmt: skip
    _, end = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
    consumer.assign([TopicPartition(topic, 0, 0)])
    copies: Counter[str] = Counter()
    read, deadline = 0, time.monotonic() + timeout
    while read < end and time.monotonic() < deadline:
        for m in consumer.consume(10_000, timeout=0.5):
            if m.error() is None:
                read += 1
                copies[(dict(normalize_headers(m.headers()))["blackbox-id"] or b"").decode()] += 1
    consumer.close()
    if read < end:
        raise TimeoutError(f"read {read} of {end} records of {topic} in {timeout} s")
    return copies


class Collector:
    """A reader of one topic that stamps each record the moment it is handed over."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.topic = topic
        self.consumer = Consumer({
            "bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex}",
            "fetch.wait.max.ms": 5, "auto.offset.reset": "earliest", "enable.auto.commit": False,
        })  # fmt: skip
        self.assigned = 0
        self.deliveries = Deliveries()

    def _follow_partitions(self) -> None:
        try:
            metadata = self.consumer.list_topics(self.topic, timeout=2).topics.get(self.topic)
        except KafkaException:  # the broker is away (a chaos scenario): look again later
            return
        if metadata is None or metadata.error is not None:
            return
        if len(metadata.partitions) > self.assigned:
            new = range(self.assigned, len(metadata.partitions))
            self.consumer.incremental_assign([TopicPartition(self.topic, p, 0) for p in new])
            self.assigned = len(metadata.partitions)

    def collect(self, count: int, timeout: float) -> Deliveries:
        """Read until `count` distinct ids arrived or `timeout` passed."""
        deadline = time.monotonic() + timeout
        checked = 0.0
        while len(self.deliveries.copies) < count and time.monotonic() < deadline:
            if time.monotonic() - checked > 0.5:
                self._follow_partitions()
                checked = time.monotonic()
            self.read_once()
        return self.deliveries

    def follow(self, windows: Sequence[Window], timeout: float) -> Deliveries:
        """Read each window's topic while it is open, until the last one closes."""
        deadline = time.monotonic() + min(timeout, _until(windows))
        reading: set[str] = set()
        checked = 0.0
        while time.monotonic() < deadline:
            if time.monotonic() - checked > 0.5:
                reading = self._reassign(reading, {w.topic for w in windows if w.is_open()})
                checked = time.monotonic()
            self.read_once()
        return self.deliveries

    def _reassign(self, reading: set[str], wanted: set[str]) -> set[str]:
        if wanted - reading:
            self.consumer.incremental_assign([TopicPartition(t, 0, 0) for t in wanted - reading])
        if reading - wanted:
            self.consumer.incremental_unassign([TopicPartition(t, 0) for t in reading - wanted])
        return wanted

    def read_once(self) -> None:
        # poll() returns as soon as one record is there; consume(n, 0) drains the rest
        # (consume(n, t) would hold every record until n arrived or t passed).
        first = self.consumer.poll(0.05)
        for m in [first, *self.consumer.consume(10_000, timeout=0)] if first else []:
            if m.error() is not None:
                continue
            arrived = time.time_ns() // 1_000_000
            headers = dict(normalize_headers(m.headers()))
            due = int(headers["blackbox-due-ms"] or b"0")
            key = (headers["blackbox-id"] or b"").decode()
            self.deliveries.copies.setdefault(key, []).append((arrived, due))
            self.deliveries.created.setdefault(key, m.timestamp()[1])
            attempt = int(headers.get("blackbox-attempt") or b"1")
            self.deliveries.attempts.setdefault(key, []).append(attempt)
            self.deliveries.ids_by_value.setdefault(m.value() or b"", set()).add(key)

    def close(self) -> None:
        self.consumer.close()


def _collect_into(bootstrap: str, topic: str, count: int, timeout: float, out: Queue) -> None:  # type: ignore[type-arg]
    collector = Collector(bootstrap, topic)
    collector.consumer.incremental_assign([TopicPartition(topic, 0, 0)])
    collector.assigned = 1
    out.put("ready")
    out.put(collector.collect(count, timeout))
    collector.close()


def _follow_into(bootstrap: str, windows: Sequence[Window], timeout: float, out: Queue) -> None:  # type: ignore[type-arg]
    collector = Collector(bootstrap, windows[0].topic)
    out.put("ready")
    out.put(collector.follow(windows, timeout))
    collector.close()


class CollectorProcess:
    """A Collector in a process of its own, so load generation cannot delay its stamps."""

    def __init__(self, bootstrap: str, topic: str, count: int, timeout: float) -> None:
        self._start(_collect_into, (bootstrap, topic, count, timeout))

    @classmethod
    def following(
        cls, bootstrap: str, windows: Sequence[Window], timeout: float
    ) -> CollectorProcess:
        """A collector reading each window's topic while it is open."""
        collector = cls.__new__(cls)
        collector._start(_follow_into, (bootstrap, list(windows), timeout))
        return collector

    def _start(self, target: Callable[..., None], args: tuple[object, ...]) -> None:
        context = multiprocessing.get_context("spawn")
        self.queue: Queue = context.Queue()  # type: ignore[type-arg]
        self.process = context.Process(target=target, args=(*args, self.queue))
        self.process.start()
        if self.queue.get(timeout=60) != "ready":
            raise RuntimeError("the collector did not start")

    def result(self, timeout: float) -> Deliveries:
        deliveries: Deliveries = self.queue.get(timeout=timeout)
        self.process.join(10)
        return deliveries
