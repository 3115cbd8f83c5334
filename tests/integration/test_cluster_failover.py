"""A Redis Cluster master killed under load (issue 37): three masters with one replica each,
all append-only with `appendfsync always`, the real `blackbox run` process on
`redis+cluster://` with the default 16 shards, schedules produced continuously. The master
serving the most shards falls behind its replica for real (tests/clustering.py: its
replication link held through a relay), is killed with SIGKILL, and the cluster promotes
the replica that lacks what intake applied and committed meanwhile."""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from blackbox.dev.cluster import RedisCluster, formed_cluster
from blackbox.dev.servers import KafkaBroker, RedisServer, free_port
from blackbox.kafka import clients
from blackbox.settings import Settings
from blackbox.storage.keys import Layout
from tests.clustering import RelayedMaster, client, shards_by_master
from tests.integration.conftest import ReaderFactory, service_env
from tests.integration.test_failover import ready
from tests.kafkatools import TopicReader, envelope, unique, wait_until
from tests.process import BlackboxProcess

log = logging.getLogger(__name__)

PARTITIONS = 3  # of the intake topic
SHARDS = 16  # the default shard count, spread over the three masters
COUNTDOWN = 4.0  # seconds: what is scheduled before the kill falls due around it
PER_TICK, TICK = 10, 0.1  # 100 schedules a second
LAGGED_RECORDS = 30  # per partition, committed past what the replica received
AFTER_FAILOVER = 200  # schedules produced once the cluster serves every slot again
DELIVERY_DEADLINE = 30.0  # seconds after the last schedule's due time


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[RedisCluster]:
    """Three masters and three replicas, every node append-only with `appendfsync always`."""
    with formed_cluster(6, tmp_path / "cluster", replicas=1, appendfsync="always") as formed:
        yield formed


class Load:
    """Schedules produced at PER_TICK per TICK in a thread until `stop()`, each message
    unique and spread over the intake partitions; `acked()` is how many the broker took."""

    def __init__(self, bootstrap: str, intake: str, target: str) -> None:
        self.intake, self.target = intake, target
        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5,
                                  "enable.idempotence": True})  # fmt: skip
        self.bodies: list[str] = []
        self.failures: list[KafkaError] = []
        self.unflushed = 0
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> list[str]:
        """Stop producing (at once if it never started); every body the broker
        acknowledged."""
        self._stopping.set()
        if not self._thread.is_alive():
            return self.bodies
        self._thread.join(60)
        assert not self._thread.is_alive(), "the producer did not stop"
        assert (self.failures, self.unflushed) == ([], 0)
        return self.bodies

    def acked(self) -> int:
        with self._lock:
            return len(self.bodies)

    def _run(self) -> None:
        sent = 0
        while not self._stopping.wait(TICK):  # paces the load; nothing waits to settle
            for n in range(sent, sent + PER_TICK):
                self._produce(f"m-{n}", n % PARTITIONS)
            sent += PER_TICK
            self.producer.poll(0)
        self.unflushed = self.producer.flush(30)
        self.producer.close()

    def _produce(self, body: str, partition: int) -> None:
        def report(error: KafkaError | None, _message: object) -> None:
            with self._lock:
                if error is None:
                    self.bodies.append(body)
                else:
                    self.failures.append(error)

        value = envelope(self.target, body, COUNTDOWN)
        self.producer.produce(self.intake, value, partition=partition, on_delivery=report)


class Deliveries:
    """The target topic read in a thread of its own, so that each copy is timed when it
    arrived (within a poll) whatever the test waits for meanwhile: per message body the
    `blackbox-id` of each copy, and when each copy was read, with its id."""

    def __init__(self, reader: TopicReader, layout: Layout) -> None:
        self.reader, self.layout = reader, layout
        self.copies: dict[str, list[str]] = defaultdict(list)
        self.arrivals: list[tuple[int, str]] = []
        self._read = 0
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stopping.is_set():
            self.reader.poll(0.05)
            self._collect()

    def _collect(self) -> None:
        with self._lock:
            for record in self.reader.records[self._read :]:
                schedule_id = record.header("blackbox-id")
                self.copies[(record.value or b"").decode()].append(schedule_id)
                self.arrivals.append((record.received_ms, schedule_id))
            self._read = len(self.reader.records)

    def delivered(self) -> set[str]:
        with self._lock:
            return set(self.copies)

    def finish(self) -> None:
        """Stop the thread, then read the topic to its end (a second copy written after
        the last first one is read too)."""
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join(10)
        self.reader.read_to_end()
        self._collect()

    def stall(self, since_ms: int, shards: set[int]) -> tuple[int, int]:
        """The longest pause in one shard's deliveries after `since_ms`, among `shards`: the
        instants (epoch ms) its last copy before and its first copy after were read."""
        with self._lock:
            arrivals = list(self.arrivals)
        by_shard: dict[int, list[int]] = {shard: [since_ms] for shard in shards}
        for at, schedule_id in sorted(arrivals):
            if at > since_ms and self.layout.shard_of(schedule_id) in shards:
                by_shard[self.layout.shard_of(schedule_id)].append(at)
        pauses = [pair for times in by_shard.values() for pair in itertools.pairwise(times)]
        return max(pauses, key=lambda pause: pause[1] - pause[0], default=(since_ms, since_ms))


@dataclass(frozen=True)
class Kill:
    """The figures of the kill: when (epoch ms), how long the cluster took to promote the
    replica, how far behind the replica was (bytes of the stream; committed intake offsets
    its marks lacked) and how many schedules had been produced by then."""

    killed_ms: int
    failover_s: float
    lag_bytes: int
    lost_offsets: int
    acked: int


def test_a_cluster_master_killed_under_load_loses_no_schedule(
    broker: KafkaBroker, reader: ReaderFactory, cluster: RedisCluster, tmp_path: Path
) -> None:
    """Guarantee 1 on Redis Cluster, no silent loss whatever happens to Redis: a master
    serving the most shards is killed while its replica lags, and the cluster promotes the
    replica. Every schedule produced before, during and after is delivered, each once
    (issue 50: what the killed master fired during the lag, its acks lost with it, was
    delivered again: 50-75 copies; the claims now name their server, and what the target
    topic shows delivered is rechecked); `blackbox run` never exits and /ready answers 200
    again."""
    port = free_port()
    env = service_env(cluster.url, broker.bootstrap, BLACKBOX_HTTP_PORT=str(port))
    settings = Settings.from_env(env)
    target = unique("cluster-failover")
    clients.ensure_topics(settings.kafka, [settings.intake_topic], PARTITIONS)
    clients.ensure_topics(settings.kafka, [*settings.own_topics, target])
    deliveries = Deliveries(reader(target), Layout(settings.namespace, SHARDS))
    owners = shards_by_master(cluster.nodes[0], deliveries.layout)
    victim = next(n for n in cluster.nodes if n.port == max(owners, key=lambda p: len(owners[p])))
    load = Load(settings.kafka["bootstrap.servers"], settings.intake_topic, target)
    with RelayedMaster(cluster, victim) as relayed:
        service = BlackboxProcess(env, tmp_path / "service.log")
        try:
            wait_until(lambda: ready(port), 60, "/ready answering 200")
            deliveries.start()
            load.start()
            kill = _kill_under_lag(relayed, settings, load, deliveries)
            wait_until(lambda: load.acked() >= kill.acked + AFTER_FAILOVER, 30,
                       "schedules produced after the failover")  # fmt: skip
            produced = load.stop()
            _wait_for_all(deliveries, produced, time.monotonic() + COUNTDOWN + DELIVERY_DEADLINE)
            wait_until(lambda: ready(port), 30, "/ready answering 200 after the failover")
            assert service.process.poll() is None, "the service exited"
        finally:
            load.stop()
            deliveries.finish()
            service.terminate()

    _report(deliveries, produced, kill, set(owners[victim.port]))
    missing = sorted(set(produced) - deliveries.copies.keys())
    assert missing == [], f"{len(missing)} of {len(produced)} never delivered: {missing[:10]}"
    under_two_ids = {body: ids for body, ids in deliveries.copies.items() if len(set(ids)) > 1}
    assert under_two_ids == {}
    twice = {body: ids for body, ids in deliveries.copies.items() if len(ids) > 1}
    assert twice == {}


def _kill_under_lag(
    relayed: RelayedMaster, settings: Settings, load: Load, deliveries: Deliveries
) -> Kill:
    """Once firing delivers, hold the victim's replication link until intake committed
    LAGGED_RECORDS more of every partition than the victim had applied, kill it and wait
    for the promotion; the figures of the kill. The promoted replica's watermarks must lack
    offsets intake committed: the lag was real."""
    shards = shards_by_master(relayed.master, deliveries.layout)[relayed.master.port]
    wait_until(lambda: bool(deliveries.delivered()), 30, "a first delivery")
    relayed.partition()
    held = _marks(relayed.master, deliveries.layout, shards, settings.intake_topic)
    assert min(held) >= 0, f"no watermark of some partition on the victim: {held}"
    past = [mark + LAGGED_RECORDS for mark in held]
    wait_until(lambda: all(c > p for c, p in zip(_committed(settings), past, strict=True)),
               30, "intake committing past what the replica received")  # fmt: skip
    lag_bytes = relayed.lag()
    committed = _committed(settings)
    acked = load.acked()
    killed_ms, killed = time.time_ns() // 1_000_000, time.monotonic()
    relayed.fail_over()
    failover_s = time.monotonic() - killed
    promoted = _marks(relayed.replica, deliveries.layout, shards, settings.intake_topic)
    lost = [c - 1 - p for c, p in zip(committed, promoted, strict=True)]
    assert lag_bytes > 0 and min(lost) > 0, (
        f"the replica was not behind: {lag_bytes} bytes, marks {promoted} of {committed}"
    )
    return Kill(killed_ms, failover_s, lag_bytes, sum(lost), acked)


def _wait_for_all(deliveries: Deliveries, produced: list[str], deadline: float) -> None:
    """Until every produced body was delivered or the (monotonic) deadline passed."""
    expected = set(produced)
    while time.monotonic() < deadline and not expected <= deliveries.delivered():
        time.sleep(0.05)  # the reader thread collects meanwhile


def _report(deliveries: Deliveries, produced: list[str], kill: Kill, victim: set[int]) -> None:
    """Log the run's figures (pytest -o log_cli=true --log-cli-level=INFO shows them): among
    the killed master's shards and among the others, the longest pause of one shard's
    deliveries after the kill, as seconds from the kill to its start and to its end."""
    groups = {"killed": victim, "others": set(range(SHARDS)) - victim}
    stalls = {}
    for name, shards in groups.items():
        start, end = deliveries.stall(kill.killed_ms, shards)
        stalls[name] = ((start - kill.killed_ms) / 1000, (end - kill.killed_ms) / 1000)
    again = [ids[0] for ids in deliveries.copies.values() for _ in ids[1:]]
    log.info(
        "cluster_failover produced=%d delivered=%d duplicates=%d (of the killed master's "
        "shards: %d) lag_bytes=%d lost_offsets=%d failover_s=%.2f longest_shard_stall_s: "
        "killed_shards=%.2f-%.2f other_shards=%.2f-%.2f",
        len(produced), len(deliveries.copies.keys() & set(produced)), len(again),
        sum(deliveries.layout.shard_of(i) in victim for i in again), kill.lag_bytes,
        kill.lost_offsets, kill.failover_s, *stalls["killed"], *stalls["others"],
    )  # fmt: skip


def _marks(node: RedisServer, layout: Layout, shards: list[int], topic: str) -> list[int]:
    """Per intake partition, the highest watermark the node's shards hold of it (-1: none),
    whatever the topic's incarnation tag ("topic:partition[:tag]")."""
    marks = [-1] * PARTITIONS
    with client(node) as plain:
        for shard in shards:
            for name, mark in plain.hgetall(layout.shards[shard].intake_marks).items():
                written, partition = name.split(":")[:2]
                if written == topic:
                    marks[int(partition)] = max(marks[int(partition)], int(mark))
    return marks


def _committed(settings: Settings) -> list[int]:
    """The group's committed offset of each intake partition (-1: none yet)."""
    consumer = Consumer({**settings.kafka, "group.id": settings.group_id})
    try:
        asked = [TopicPartition(settings.intake_topic, p) for p in range(PARTITIONS)]
        return [max(-1, tp.offset) for tp in consumer.committed(asked, timeout=5)]
    finally:
        consumer.close()
