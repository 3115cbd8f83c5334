"""Crashes and outages: re-read intake records are not stored twice; Redis restarts lose nothing."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
import redis

from blackbox.dev.servers import RedisServer, free_port
from blackbox.intake.incarnations import tag_of
from blackbox.kafka import clients
from blackbox.settings import Settings
from blackbox.storage.keys import Keys
from tests.integration.conftest import ReaderFactory, ServiceFactory, service_env
from tests.kafkatools import envelope, produce, unique, wait_until
from tests.process import BlackboxProcess


def test_records_reread_after_a_crash_are_not_stored_twice(
    start_service: ServiceFactory,
    reader: ReaderFactory,
    env: dict[str, str],
    redis_client: redis.Redis,
    tmp_path: Path,
) -> None:
    """Guarantee 2: intake is idempotent: a crash before commit re-reads, never duplicates."""
    env = {**env, "BLACKBOX_SHARDS": "1"}  # one shard: its due set alone holds everything
    settings = Settings.from_env(env)
    clients.ensure_topics(settings.kafka, settings.own_topics)
    target = unique("replayed")
    produce(settings.kafka["bootstrap.servers"], settings.intake_topic,
            [envelope(target, {"n": n}, 20) for n in range(50)])  # fmt: skip
    due_key = Keys(settings.namespace).due
    # A replica that stores the records but never commits, then dies hard.
    crashing = BlackboxProcess(
        {**env, "KAFKA_CONSUMER_AUTO_COMMIT_INTERVAL_MS": "3600000"}, tmp_path / "first.log"
    )
    wait_until(lambda: redis_client.zcard(due_key) == 50, what="50 stored by the first replica")
    crashing.kill()
    killed_ms = int(time.time() * 1000)

    service = start_service()
    target_reader = reader(target)
    target_reader.wait_count(50, timeout=40)

    # The records are re-read once the dead member leaves the group; each is a no-op.
    wait_until(lambda: service.metrics.value("blackbox_intake_records_total",
                                             {"outcome": "duplicate"}) == 50,
               what="50 records re-read as duplicates")  # fmt: skip
    assert service.metrics.value("blackbox_intake_records_total", {"outcome": "scheduled"}) == 0
    wait_until(lambda: service.store.counts() == (0, 0), what="nothing pending")
    records = target_reader.read_to_end()  # a late second copy would be read too
    ids = Counter(r.header("blackbox-id") for r in records)
    assert len(records) == len(ids) == 50
    # The dead replica may have died before answering: each re-read is answered again.
    answers = [orjson.loads(e.value or b"") for e in reader(settings.events_topic).read_to_end()]
    again = {a["intake"]["offset"] for a in answers
             if a["at_ms"] >= killed_ms and a["outcome"] == "scheduled"}  # fmt: skip
    assert again == set(range(50))


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A Redis of this test's own, append-only with fsync on every write."""
    server = RedisServer(free_port(), tmp_path / "redis", appendfsync="always")
    server.data_dir.mkdir()
    server.start()
    yield server
    server.stop()


def test_redis_stopped_and_restarted_mid_run_loses_nothing(
    start_service: ServiceFactory,
    reader: ReaderFactory,
    own_redis: RedisServer,
    env: dict[str, str],
) -> None:
    """Guarantee 5: intake and firing pause while Redis is away and resume; nothing is lost."""
    service = start_service(REDIS_URL=own_redis.url)
    bootstrap = env["KAFKA_BOOTSTRAP_SERVERS"]
    target = unique("outage")
    produce(bootstrap, env["BLACKBOX_INTAKE_TOPIC"],
            [envelope(target, {"n": n}, n % 5 * 0.5) for n in range(100)])  # fmt: skip
    records = reader(target)
    records.wait_count(10, timeout=30)

    own_redis.kill()
    produce(bootstrap, env["BLACKBOX_INTAKE_TOPIC"],
            [envelope(target, {"n": n}, 0) for n in range(100, 200)])  # fmt: skip
    wait_until(lambda: service.metrics.value("blackbox_dependency_errors_total",
                                             {"dependency": "redis"}) > 0,
               what="the outage noticed")  # fmt: skip
    own_redis.start()

    delivered = records.wait_for(
        lambda rs: {r.header("blackbox-id") for r in rs} >= _ids(env, 200), timeout=60
    )
    assert len({r.header("blackbox-id") for r in delivered}) == 200


def _ids(env: dict[str, str], count: int) -> set[str]:
    """The ids of the first `count` records of the intake topic (tagged by its incarnation)."""
    intake = env["BLACKBOX_INTAKE_TOPIC"]
    topic_id = clients.topic_id_lookup(Settings.from_env(env).kafka)([intake])[intake]
    return {f"{intake}:0:{offset}:{tag_of(topic_id)}" for offset in range(count)}


def test_service_exits_cleanly_on_sigterm(
    redis_server: RedisServer, broker_bootstrap: str, tmp_path: Path
) -> None:
    """SIGTERM: intake stops, offsets are committed, the process exits 0 within 10 s."""
    env = service_env(redis_server.url, broker_bootstrap)
    settings = Settings.from_env(env)
    clients.ensure_topics(settings.kafka, settings.own_topics)
    process = BlackboxProcess(env, tmp_path / "service.log")
    wait_until(lambda: "intake_started" in process.output(), what="the service started")

    assert process.terminate(timeout=10) == 0
    assert "service_stopped" in process.output()


def test_a_replica_stopped_mid_stream_leaves_nothing_in_flight(
    reader: ReaderFactory, env: dict[str, str], redis_client: redis.Redis, tmp_path: Path
) -> None:
    """Guarantees 1 and 2: SIGTERM while batches await the broker settles each of them: what
    was delivered is forgotten (no second copy after a restart), the rest is due again."""
    env = {**env, "BLACKBOX_SHARDS": "1"}  # one shard: its sets alone hold everything
    settings = Settings.from_env(env)
    clients.ensure_topics(settings.kafka, settings.own_topics)
    target = unique("stopping")
    # Due one every 5 ms over 3 s: something is always due soon, so batches are sent
    # while earlier ones are still being acknowledged.
    produce(settings.kafka["bootstrap.servers"], settings.intake_topic,
            [envelope(target, {"n": n}, 2 + n * 0.005) for n in range(600)])  # fmt: skip
    service = BlackboxProcess(env, tmp_path / "service.log")
    target_reader = reader(target)
    target_reader.wait_count(100, timeout=40)

    assert service.terminate(timeout=15) == 0
    keys = Keys(settings.namespace)
    due, in_flight = redis_client.zcard(keys.due), redis_client.zcard(keys.in_flight)
    target_reader.wait_count(600 - due, timeout=20)
    records = target_reader.read_to_end()  # nothing runs now: the topic is complete

    assert in_flight == 0
    ids = Counter(r.header("blackbox-id") for r in records)
    assert len(records) == len(ids) == 600 - due
