"""Kill a replica under load, many times: three `blackbox run` replicas on one Redis and one
Apache Kafka broker, a CPU burner beside them, messages scheduled and firing throughout; a
random replica is killed with SIGKILL and started again, `kills` times.

    python -m benchmarks.chaos kill-replicas --kills 20 --messages 5000

Checked from outside, after the run: every id the events topic answered `scheduled` is on
the target topic (nothing scheduled is missing), and every id delivered more than once was
in flight (claimed, not yet acked) at the instant of a kill. The in-flight set is sampled
just before each SIGKILL; an id of it still held under the same lease once the replacement
is ready was the killed replica's (a live replica acks or gives back within its delivery
timeout), which the figures count apart.
"""

from __future__ import annotations

import random
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

import orjson
from confluent_kafka import Consumer, Message, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions  # type: ignore[attr-defined]

from benchmarks.stack import ServiceProcess, Stack, local_stack, wait_for
from blackbox.envelope import normalize_headers
from blackbox.kafka import clients
from blackbox.storage.connections import redis_client
from blackbox.storage.keys import Layout
from blackbox.storage.shardcount import DEFAULT_SHARDS
from blackbox.storage.store import pending_counts

Result = dict[str, object]
REPLICAS = 3
PARTITIONS = 3  # of the intake topic: each replica reads one
SECONDS_PER_KILL = 6.0  # of steady load: each kill waits for its replacement to be ready


@contextmanager
def cpu_burner() -> Iterator[None]:
    """One process spinning on a core for as long as the block runs."""
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        burner.kill()
        burner.wait()


class Fleet:
    """The replicas of the run, and what was in flight at each kill."""

    def __init__(self, stack: Stack, seed: int) -> None:
        self.stack, self.rng = stack, random.Random(seed)
        self.log = stack.work / "replicas.log"
        self.client = redis_client(stack.redis.url)
        self.layout = Layout(stack.settings.namespace, DEFAULT_SHARDS)
        self.replicas = [self._start() for _ in range(REPLICAS)]
        self.at_kills: set[str] = set()  # in flight at a kill, in any replica
        self.abandoned: set[str] = set()  # ... and still under the killed one's lease after

    def _start(self) -> ServiceProcess:
        replica = ServiceProcess(self.stack.env, "all", self.log)
        wait_for(replica.ready, 60, "a replica ready")
        return replica

    def in_flight(self) -> dict[str, float]:
        """Every shard's in-flight ids with their lease tokens."""
        pipe = self.client.pipeline(transaction=False)
        for keys in self.layout.shards:
            pipe.zrange(keys.in_flight, 0, -1, withscores=True)
        return {i.decode(): s for found in pipe.execute() for i, s in found}

    def kill_one(self) -> None:
        """SIGKILL a random replica, mid-fire when it can be, and start its replacement."""
        deadline = time.monotonic() + 2.0
        while not self.in_flight() and time.monotonic() < deadline:
            time.sleep(0.005)
        victim = self.rng.randrange(REPLICAS)
        before = self.in_flight()
        self.replicas[victim].process.kill()
        self.replicas[victim].process.wait()
        self.replicas[victim] = self._start()
        after = self.in_flight()
        self.at_kills |= before.keys()
        self.abandoned |= {i for i, lease in before.items() if after.get(i) == lease}

    def drained(self) -> bool:
        return pending_counts(self.client, self.layout) == (0, 0)

    def stop(self) -> None:
        for replica in self.replicas:
            replica.stop()
        self.client.close()


def kill_replicas(messages: int = 5000, kills: int = 20, seed: int = 7) -> Result:
    """SIGKILL a random one of three replicas `kills` times under load and a CPU burner."""
    from benchmarks.chaos import CHAOS_SETTINGS, Sender  # noqa: PLC0415 - chaos imports this module

    with local_stack(**CHAOS_SETTINGS, BLACKBOX_SHARDS=str(DEFAULT_SHARDS)) as stack, cpu_burner():
        target = f"replicas-{uuid.uuid4().hex[:8]}"
        _topics(stack, target)
        fleet = Fleet(stack, seed)
        try:
            sender = Sender(stack, target, messages, seconds=kills * SECONDS_PER_KILL)
            sender.start()
            for _ in range(kills):
                time.sleep(fleet.rng.uniform(0.5, 2.0))  # the chaos schedule: a random moment
                fleet.kill_one()
            sender.join()
            bootstrap = stack.broker.bootstrap
            wait_for(lambda: _all_committed(stack) and fleet.drained(), 300, "every message fired")
        finally:
            fleet.stop()
        answered = _answered(bootstrap, stack.settings.events_topic)
        copies, values = _delivered(bootstrap, target)
    duplicated = {i for i, n in copies.items() if n > 1}
    scheduled = answered["scheduled"]
    sent = {orjson.dumps(n) for n in range(sender.accepted)}
    return {
        "scenario": "kill replicas", "replicas": REPLICAS, "kills": kills, "sent": messages,
        "accepted": sender.accepted, "delivered": len(sent & values), "lost": len(sent - values),
        "duplicated": sum(copies[i] - 1 for i in duplicated),
        # What the events topic answered: a record stored and not yet answered when its
        # replica died is skipped as applied when read again, and never answered.
        "answered_scheduled": len(scheduled),
        "answered_dead_lettered": len(answered["dead_lettered"]),
        "scheduled_not_delivered": len(scheduled - copies.keys()),
        "in_flight_at_kills": len(fleet.at_kills),
        "abandoned_by_the_killed": len(fleet.abandoned),
        "duplicates_not_in_flight_at_a_kill": len(duplicated - fleet.at_kills),
        "duplicates_not_abandoned_by_the_killed": len(duplicated - fleet.abandoned),
    }  # fmt: skip


def _topics(stack: Stack, target: str) -> None:
    """The target topic, and PARTITIONS intake partitions so every replica reads intake."""
    clients.ensure_topics(stack.settings.kafka, [target])
    admin = AdminClient(dict(stack.settings.kafka))
    grown = admin.create_partitions([NewPartitions(stack.settings.intake_topic, PARTITIONS)])
    for future in grown.values():
        future.result(15)


def _read_all(bootstrap: str, topic: str) -> list[Message]:
    """Every record of every partition of `topic`, up to its end when called."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex,
                         "enable.auto.commit": False})  # fmt: skip
    partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
    ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in partitions}  # fmt: skip
    consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
    read: list[Message] = []
    deadline = time.monotonic() + 120
    while len(read) < sum(ends.values()) and time.monotonic() < deadline:
        read += [m for m in consumer.consume(10_000, timeout=0.5) if m.error() is None]
    consumer.close()
    return read


def _answered(bootstrap: str, topic: str) -> dict[str, set[str]]:
    """The ids the events topic answered `scheduled`, and the records answered
    `dead_lettered`."""
    ids: dict[str, set[str]] = {"scheduled": set(), "dead_lettered": set()}
    for m in _read_all(bootstrap, topic):
        event = orjson.loads(m.value() or b"{}")
        if event.get("outcome") in ids:
            ids[event["outcome"]].add(event["blackbox_id"] or str(event["intake"]))
    return ids


def _delivered(bootstrap: str, topic: str) -> tuple[Counter[str], set[bytes]]:
    """Copies of each `blackbox-id` on the target topic, and the values delivered."""
    records = _read_all(bootstrap, topic)
    ids = Counter((dict(normalize_headers(m.headers()))["blackbox-id"] or b"").decode()
                  for m in records)  # fmt: skip
    return ids, {m.value() or b"" for m in records}


def _all_committed(stack: Stack) -> bool:
    """Whether the intake group committed every intake record (each stored or
    dead-lettered: what is stored is in Redis until it fired)."""
    topic = stack.settings.intake_topic
    consumer = Consumer({"bootstrap.servers": stack.broker.bootstrap,
                         "group.id": stack.settings.group_id})  # fmt: skip
    try:
        asked = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        committed = consumer.committed(asked, timeout=10)
        ends = [consumer.get_watermark_offsets(tp, timeout=10)[1] for tp in asked]
        return all(max(tp.offset, 0) >= end for tp, end in zip(committed, ends, strict=True))
    finally:
        consumer.close()
