"""Scale out with real `blackbox run` processes: three replicas on a three-master Redis
Cluster and on one Redis (one of them killed mid-run), intake and dispatch roles apart, and
updates and cancels of callers' ids spread over every shard.

Each test prints what every process did (its share of the deliveries, read from its
/metrics) so a run under `pytest -s` shows how the work was spread."""

from __future__ import annotations

import json
import os
import signal
import statistics
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx
import orjson
import pytest
from confluent_kafka import ConsumerGroupState, Producer
from confluent_kafka.admin import AdminClient
from prometheus_client.parser import text_string_to_metric_families

from blackbox.dev.cluster import RedisCluster
from blackbox.dev.servers import KafkaBroker, RedisServer, free_port
from blackbox.envelope import CALLER_HEADER
from blackbox.firing.shares import owned_by
from blackbox.kafka import clients
from blackbox.schedule import scoped_id
from blackbox.settings import Settings
from blackbox.storage.connections import RedisClient, redis_client
from blackbox.storage.keys import Layout
from blackbox.storage.shardcount import DEFAULT_SHARDS
from blackbox.storage.store import RedisStore
from tests.integration.conftest import ReaderFactory, service_env
from tests.kafkatools import (
    Received,
    close_client,
    envelope,
    now_ms,
    produce_to,
    unique,
    wait_until,
)
from tests.process import BlackboxProcess

_DECODER = json.JSONDecoder()

SHARDS = 6
PARTITIONS = 6
MESSAGES = 10_000
# The dispatch processes' safety-net tick in the roles test: longer than the test.
TICK_S = 60
TOKEN = "scale-token-0123456789abcdef"  # noqa: S105 - a test token
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def _show(line: str) -> None:
    """Report a figure of the run (shown under `pytest -s`)."""
    print(line)  # noqa: T201 - the per-replica shares the tests report


class Replica:
    """One `blackbox run --role ROLE` process with an HTTP port of its own."""

    def __init__(self, env: dict[str, str], log_path: Path, role: str) -> None:
        self.role = role
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        own = {**env, "BLACKBOX_HTTP_PORT": str(self.port)}
        self.process = BlackboxProcess(own, log_path, "run", "--role", role)
        self.last_delivered = 0.0

    @property
    def pid(self) -> int:
        return self.process.process.pid

    @property
    def alive(self) -> bool:
        return self.process.process.poll() is None

    def ready(self) -> bool:
        try:
            return httpx.get(f"{self.base}/ready", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def metric(self, sample: str, labels: dict[str, str] | None = None) -> float:
        """One sample of the process's /metrics (0 when it has none yet)."""
        text = httpx.get(f"{self.base}/metrics", timeout=5).text
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == sample and s.labels == (labels or {}):
                    return float(s.value)
        return 0.0

    def delivered(self) -> float:
        """blackbox_delivered_total, remembered for after the process is gone."""
        self.last_delivered = self.metric("blackbox_delivered_total")
        return self.last_delivered

    def events(self) -> list[dict[str, object]]:
        """The JSON log events the process wrote."""
        found = []
        for line in self.process.output().splitlines():
            if line.startswith("{"):
                # The first document of the line: an unbuffered print writes its text and
                # its newline apart, and librdkafka's stderr line may land in between.
                document, _ = _DECODER.raw_decode(line)
                found.append(document)
        return found


class Fleet:
    """The processes of one test: started, waited on, stopped (or killed) together."""

    def __init__(self, env: dict[str, str], logs: Path) -> None:
        self.env, self.logs = env, logs
        self.settings = Settings.from_env(env)
        self.replicas: list[Replica] = []
        self.client: RedisClient = redis_client(self.settings.redis_url)
        self.layout = Layout(self.settings.namespace, self.settings.shards or DEFAULT_SHARDS)
        self.store = RedisStore(self.client, self.layout, self.settings.grace_seconds)
        self.admin = AdminClient(dict(self.settings.kafka))

    def start(self, roles: Sequence[str], **overrides: str) -> list[Replica]:
        """Start one process per role (`overrides` added to their environment) and wait
        until each is ready, the firing ones share the shards, and the intake ones all
        joined the consumer group."""
        clients.ensure_topics(self.settings.kafka, [self.settings.intake_topic], PARTITIONS)
        clients.ensure_topics(self.settings.kafka, self.settings.own_topics)
        n = len(self.replicas)
        started = [
            Replica({**self.env, **overrides}, self.logs / f"{i + n}-{role}.log", role)
            for i, role in enumerate(roles)
        ]
        self.replicas += started
        for replica in started:
            wait_until(replica.ready, 60, f"{replica.role} process {replica.pid} ready")
        firing = sum(r.role in ("all", "dispatch") for r in started)
        wait_until(lambda: self.firers() == firing, 30, f"{firing} firers in the share")
        intake = sum(r.role in ("all", "intake") for r in started)
        wait_until(lambda: self.group_members() == intake, 30, f"{intake} in the group")
        return started

    def firers(self) -> int:
        return int(self.client.zcard(self.layout.members))

    def firer_names(self) -> list[str]:
        names = self.client.zrange(self.layout.members, 0, -1)
        return sorted(n.decode() for n in names)  # type: ignore[union-attr]

    def group_members(self) -> int:
        """How many consumers the intake group has, once it is stable (0 until then)."""
        group = self.settings.group_id
        found = self.admin.describe_consumer_groups([group], request_timeout=10)[group]
        described = found.result(timeout=10)
        if described.state != ConsumerGroupState.STABLE:
            return 0
        return len(described.members)

    def send(self, values: Sequence[bytes]) -> None:
        """Produce `values` to the intake topic, round-robin over its partitions."""
        produce_to(
            self.settings.kafka["bootstrap.servers"],
            self.settings.intake_topic,
            [(n % PARTITIONS, None, v) for n, v in enumerate(values)],
        )

    def settled(self) -> bool:
        """Nothing due or in flight: nothing more will be delivered."""
        return self.store.counts() == (0, 0)

    def report(self, title: str) -> list[float]:
        """Print each process's share of the deliveries and intake; the delivered counts
        (a dead process's as last scraped)."""
        shares = []
        _show(f"\n{title}")
        for r in self.replicas:
            delivered = r.delivered() if r.alive else r.last_delivered
            taken = (
                r.metric("blackbox_intake_records_total", {"outcome": "scheduled"})
                if r.alive
                else float("nan")
            )
            shares.append(delivered)
            state = "alive" if r.alive else "killed"
            _show(f"  pid {r.pid} --role {r.role:8} {state}: delivered {delivered:6.0f}, "
                  f"intake scheduled {taken:6.0f}")  # fmt: skip
        return shares

    def warnings(self) -> Counter[str]:
        """The warning and error events every process logged, by event name."""
        return Counter(
            f"{e['level']}:{e['event']}"
            for r in self.replicas
            for e in r.events()
            if e.get("level") in ("warning", "error", "critical")
        )

    def stop(self) -> dict[int, int]:
        """SIGTERM every live process at once; their exit codes by pid."""
        live = [r for r in self.replicas if r.alive]
        for r in live:
            r.process.process.send_signal(signal.SIGTERM)
        return {r.pid: r.process.wait(30) for r in live}

    def close(self) -> None:
        for r in self.replicas:
            if r.alive:
                r.process.kill()
            else:  # one that died by itself: its log file closed too
                r.process.wait(5)
        self.client.close()
        close_client(self.admin)


def _fleet(redis_url: str, broker: KafkaBroker, logs: Path, **overrides: str) -> Fleet:
    return Fleet(service_env(redis_url, broker.bootstrap, BLACKBOX_SHARDS=str(SHARDS),
                             **overrides), logs)  # fmt: skip


@pytest.fixture
def cluster_fleet(
    redis_cluster: RedisCluster, broker: KafkaBroker, tmp_path: Path
) -> Iterator[Fleet]:
    fleet = _fleet(redis_cluster.url, broker, tmp_path, BLACKBOX_API_TOKEN=TOKEN)
    yield fleet
    fleet.close()


@pytest.fixture
def redis_fleet(redis_server: RedisServer, broker: KafkaBroker, tmp_path: Path) -> Iterator[Fleet]:
    # A short lease (heartbeats last 5 s at least), so a killed replica's messages come back
    # within seconds: the least the settings accept with a 2 s delivery timeout (2 + 1 s for
    # the reports + the 2 s sweep delay + 1 s).
    fleet = _fleet(redis_server.url, broker, tmp_path,
                   BLACKBOX_LEASE_SECONDS="6.5", BLACKBOX_DELIVERY_TIMEOUT="2")  # fmt: skip
    yield fleet
    fleet.close()


def _burst(target: str, count: int, spread_s: float, start_s: float = 2.0) -> list[bytes]:
    """`count` envelopes for `target`, due from `start_s` to `start_s + spread_s` from now."""
    return [envelope(target, {"n": n}, start_s + spread_s * (n % 100) / 100) for n in range(count)]


def _ids(records: Sequence[Received]) -> Counter[str]:
    return Counter(r.header("blackbox-id") for r in records)


def _late_ms(records: Sequence[Received]) -> list[int]:
    """How late each record arrived after its due time, shortest first."""
    return sorted(r.received_ms - int(r.header("blackbox-due-ms")) for r in records)


def _lateness(records: Sequence[Received]) -> str:
    late = _late_ms(records)
    p99 = late[int(len(late) * 0.99)]
    return f"lateness ms: median {statistics.median(late):.0f}, p99 {p99}, max {late[-1]}"


def _stop_cleanly(fleet: Fleet) -> None:
    codes = fleet.stop()
    assert set(codes.values()) == {0}, codes
    assert "error:thread_crashed" not in fleet.warnings()


def test_three_replicas_on_a_redis_cluster_deliver_10000_once_each_sharing_the_work(
    cluster_fleet: Fleet, reader: ReaderFactory
) -> None:
    """Guarantees 2 and 3 at scale: three `blackbox run` replicas on a three-master Redis
    Cluster (six shards, six intake partitions) deliver every one of 10,000 messages, none
    twice while all are healthy, and each replica fires a share of them."""
    fleet = cluster_fleet
    fleet.start(["all"] * 3)
    target = unique("scaled")
    fleet.send(_burst(target, MESSAGES, spread_s=2.0))

    target_reader = reader(target)
    target_reader.wait_count(MESSAGES, timeout=90)
    wait_until(fleet.settled, 30, "nothing pending")
    records = target_reader.read_to_end()  # a late second copy would be read too
    wait_until(lambda: sum(r.delivered() for r in fleet.replicas) >= MESSAGES, 10, "counted")
    shares = fleet.report("three replicas on a three-master Redis Cluster")
    _show(f"  {_lateness(records)}; warnings {dict(fleet.warnings())}")

    ids = _ids(records)
    assert len(ids) == MESSAGES
    assert [i for i, n in ids.items() if n > 1] == []
    assert sum(shares) == MESSAGES
    assert min(shares) > 0, shares
    _stop_cleanly(fleet)


def _stopped_while_firing(fleet: Fleet, victim: Replica, shards: set[int]) -> list[str]:
    """SIGSTOP `victim` at a moment it holds ids of `shards` in flight (SIGCONT and try
    again if it holds none); those ids."""
    held: list[str] = []

    def caught() -> bool:
        os.kill(victim.pid, signal.SIGSTOP)
        for shard in shards:
            ids = fleet.client.zrange(fleet.layout.shards[shard].in_flight, 0, -1)
            held.extend(i.decode() for i in ids)  # type: ignore[union-attr]
        if not held:
            os.kill(victim.pid, signal.SIGCONT)
        return bool(held)

    wait_until(caught, 20, "the victim firing")
    return held


def test_a_replica_killed_mid_run_loses_nothing_and_its_shards_are_taken_over(
    redis_fleet: Fleet, reader: ReaderFactory
) -> None:
    """Guarantees 1 and 3 under a crash: one of three replicas on one Redis is SIGKILLed
    while it has ids in flight and its shards still hold due messages; the survivors take
    its shards once its heartbeat runs out and deliver every message, the ids it had in
    flight after their lease (as attempt 2). A message sent twice is one of those: its
    second copy says attempt 2."""
    fleet = redis_fleet
    replicas = fleet.start(["all"] * 3)
    target = unique("survived")
    fleet.send(_burst(target, MESSAGES, spread_s=6.0))
    target_reader = reader(target)
    target_reader.wait_count(MESSAGES // 4, timeout=60)

    victim = replicas[0]
    names = fleet.firer_names()
    rank = next(i for i, n in enumerate(names) if f":{victim.pid}:" in n)
    its_shards = set(owned_by(rank, len(names), SHARDS))
    victim.delivered()
    orphans = _stopped_while_firing(fleet, victim, its_shards)
    victim.process.kill()
    killed_ms = now_ms()
    wait_until(lambda: fleet.firers() == 2, 15, "the dead replica's heartbeat gone")

    target_reader.wait_count(MESSAGES, timeout=60)
    wait_until(fleet.settled, 30, "nothing pending")
    records = target_reader.read_to_end()
    shares = fleet.report("three replicas on one Redis, the first killed mid-run")
    taken_over = [
        r for r in records
        if r.received_ms > killed_ms
        and fleet.layout.shard_of(r.header("blackbox-id")) in its_shards
    ]  # fmt: skip
    ids = _ids(records)
    twice = {i for i, n in ids.items() if n > 1}
    retried = {r.header("blackbox-id") for r in records if r.header("blackbox-attempt") != "1"}
    _show(f"  killed after ~{victim.last_delivered:.0f} of its deliveries with {len(orphans)} "
          f"in flight, owning shards "
          f"{sorted(its_shards)}; {len(taken_over)} of them delivered after the kill by the "
          f"survivors; {len(twice)} ids delivered twice, {len(retried)} retried; "
          f"{_lateness(records)}; warnings {dict(fleet.warnings())}")  # fmt: skip

    assert len(ids) == MESSAGES  # nothing lost
    assert twice <= retried, twice - retried
    # Read at the stop, an id may have been sent all the same: produced before the stop
    # (its create time says so) and then either acked (the ack was already in Redis's
    # input) or passed over by a survivor that found it on the target topic. Such an id
    # arrived once, however late this reader got it; every other one came back after its
    # lease, as a retry.
    settled = {r.header("blackbox-id") for r in records
               if r.created_ms < killed_ms and ids[r.header("blackbox-id")] == 1}  # fmt: skip
    assert set(orphans) - settled <= retried, set(orphans) - settled - retried
    assert taken_over, "the dead replica's shards were not delivered after the kill"
    assert min(shares[1:]) > 0, shares
    _stop_cleanly(fleet)


def test_intake_and_dispatch_processes_apart_on_a_redis_cluster_deliver_everything(
    cluster_fleet: Fleet, reader: ReaderFactory
) -> None:
    """Roles at scale: one `--role intake` process stores 10,000 messages on the Redis
    Cluster and two `--role dispatch` processes fire every one once between them, each
    woken through Redis (not by its safety-net tick) for the shards it fires; the intake
    process fires nothing."""
    fleet = cluster_fleet
    # The safety-net tick comes once at start and then only after the test: every
    # message is fired by a waker, woken through Redis for the shards it fires.
    intake, *dispatch = fleet.start(
        ["intake", "dispatch", "dispatch"],
        BLACKBOX_POLL_INTERVAL=str(TICK_S),
        BLACKBOX_LEASE_SECONDS=str(3 * TICK_S),
    )
    target = unique("apart")
    fleet.send(_burst(target, MESSAGES, spread_s=2.0))

    target_reader = reader(target)
    target_reader.wait_count(MESSAGES, timeout=TICK_S * 3 / 4)
    wait_until(fleet.settled, 30, "nothing pending")
    records = target_reader.read_to_end()
    wait_until(lambda: sum(r.delivered() for r in dispatch) >= MESSAGES, 10, "counted")
    shares = fleet.report("intake x1 and dispatch x2 on a three-master Redis Cluster")
    _show(f"  {_lateness(records)}; warnings {dict(fleet.warnings())}")

    ids = _ids(records)
    assert len(ids) == len(records) == MESSAGES
    assert max(_late_ms(records)) < TICK_S * 1000 / 2
    assert shares[0] == 0 and min(shares[1:]) > 0, shares
    scheduled = intake.metric("blackbox_intake_records_total", {"outcome": "scheduled"})
    assert scheduled == MESSAGES
    _stop_cleanly(fleet)


CALLER = "billing"
ADDRESSED = 1_200


def _send_as_caller(fleet: Fleet, documents: Sequence[dict[str, object]]) -> None:
    """Produce each document with the caller's header, keyed by its id: a caller's updates
    and cancels follow its schedule on the same partition, in order."""
    producer = Producer({"bootstrap.servers": fleet.settings.kafka["bootstrap.servers"]})
    for document in documents:
        producer.produce(
            fleet.settings.intake_topic,
            orjson.dumps(document),
            str(document["id"]).encode(),
            headers=[(CALLER_HEADER, CALLER.encode())],
        )
        producer.poll(0)
    assert producer.flush(30) == 0


def test_updates_and_cancels_find_callers_ids_in_every_shard_of_a_cluster(
    cluster_fleet: Fleet, reader: ReaderFactory
) -> None:
    """Addressable schedules across shards: on the Redis Cluster with two replicas, a
    caller's 1,200 ids spread over all six shards; half are updated (new payload, due
    earlier or later) and a quarter cancelled through the intake topic, one more cancelled
    and one rescheduled through the HTTP API of each replica. Exactly the expected set
    arrives, with the updated payloads and due times, and nothing cancelled."""
    fleet = cluster_fleet
    replicas = fleet.start(["all", "all"])
    target = unique("addressed")
    keys = [f"order-{n}" for n in range(ADDRESSED)]
    half, quarter = ADDRESSED // 2, ADDRESSED // 4
    updated, cancelled = keys[:half], keys[half : half + quarter]
    for some in (updated, cancelled):
        assert {_shard(fleet, k) for k in some} == set(range(SHARDS))
    _send_as_caller(fleet, [
        {"id": k, "topic": target, "message": {"k": k, "v": 1}, "countdown": 6} for k in keys
    ])  # fmt: skip
    wait_until(lambda: sum(fleet.store.counts()) == ADDRESSED, 30, "all stored")
    first_due = {k: _due_ms(fleet, k) for k in updated}

    # The even ones move earlier (1 s), the odd ones later (8 s).
    _send_as_caller(fleet, [
        {"id": k, "topic": target, "message": {"k": k, "v": 2}, "countdown": 1 + 7 * (n % 2)}
        for n, k in enumerate(updated)
    ] + [{"id": k, "cancel": True} for k in cancelled])  # fmt: skip
    # Each id is asked of both replicas: one of them did not store it (its partition is
    # the other's), and finds it all the same.
    by_api_cancel, by_api_move = keys[half + quarter], keys[half + quarter + 1]
    gone, moved = [], []
    for replica in replicas:
        with httpx.Client(base_url=replica.base, headers=AUTH, timeout=15) as api:
            gone.append(api.delete(f"/api/v1/schedules/@{CALLER}/{by_api_cancel}"))
            asked_ms = now_ms()
            moved.append(api.post(f"/api/v1/schedules/@{CALLER}/{by_api_move}/reschedule",
                                  json={"countdown": 1}))  # fmt: skip
            answered_ms = now_ms()
    assert [(a.status_code, a.json()["outcome"]) for a in gone] == [(200, "cancelled")] * 2
    assert [(a.status_code, a.json()["outcome"]) for a in moved] == [(200, "updated")] * 2

    expected = {k: 2 for k in updated} | {k: 1 for k in keys[half + quarter + 1 :]}
    target_reader = reader(target)
    target_reader.wait_count(len(expected), timeout=60)
    wait_until(fleet.settled, 30, "nothing pending")
    records = target_reader.read_to_end()
    fleet.report("two replicas, updates and cancels across the shards of a Redis Cluster")

    ids = _ids(records)
    assert [i for i, n in ids.items() if n > 1] == []
    values = {str(orjson.loads(r.value or b"")["k"]): r for r in records}
    assert {k: orjson.loads(r.value or b"")["v"] for k, r in values.items()} == expected
    due = {k: int(r.header("blackbox-due-ms")) for k, r in values.items()}
    assert all(due[k] < first_due[k] for k in updated[0::2])
    assert all(due[k] > first_due[k] for k in updated[1::2])
    assert int(asked_ms) + 1_000 <= due[by_api_move] <= answered_ms + 1_000
    _stop_cleanly(fleet)


def _shard(fleet: Fleet, key: str) -> int:
    return fleet.layout.shard_of(scoped_id(CALLER.encode(), key))


def _due_ms(fleet: Fleet, key: str) -> int:
    """When the caller's `key` is due now, as stored."""
    stored = fleet.store.load(scoped_id(CALLER.encode(), key))
    assert stored is not None
    return stored.due_ms
