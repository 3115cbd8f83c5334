"""The store topic's own settings (kafka/retention.py `check_store`): `blackbox create-topics`
creates it compacted and keeps the intake topics a day beside it; it and the service refuse
a store topic that is missing or whose cleanup.policy has `delete` in it (a schedule pending
longer than retention.ms would lose the only version the store holds of it), and neither
changes one."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator, Mapping, MutableMapping
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    ConfigResource,
    ConfigSource,
    NewTopic,
)
from structlog.testing import capture_logs

from blackbox.dev.servers import KafkaBroker, RedisServer, free_port
from blackbox.exits import EXIT_SETTINGS
from blackbox.kafka import clients, retention
from blackbox.service import Service
from blackbox.settings import Settings
from tests.integration.conftest import ServiceFactory, service_env
from tests.kafkatools import unique, wait_until
from tests.process import BlackboxProcess

HOUR_MS = 3_600_000
DAY_MS = 86_400_000
DELETING = ["delete", "compact,delete"]


def _bootstrap(env: Mapping[str, str]) -> dict[str, Any]:
    return {"bootstrap.servers": env["KAFKA_BOOTSTRAP_SERVERS"]}


def _create(env: Mapping[str, str], topics: list[NewTopic]) -> None:
    admin = AdminClient(_bootstrap(env))  # kept until every topic is created
    for future in admin.create_topics(topics).values():
        future.result(15)


def _with_store(env: dict[str, str]) -> dict[str, str]:
    return {**env, "BLACKBOX_STORE_TOPIC": unique("store")}


def _create_topics(env: dict[str, str], log: Path, *args: str) -> tuple[int, str]:
    process = BlackboxProcess(env, log, "create-topics", *args)
    return process.wait(60), process.output()


def _dynamic_min_insync(env: Mapping[str, str], topic: str) -> tuple[str, int]:
    """A topic's min.insync.replicas and where the broker has it from."""
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    admin = AdminClient(_bootstrap(env))  # kept until its answer came
    entry = admin.describe_configs([resource])[resource].result(15)["min.insync.replicas"]
    return entry.value, entry.source


def test_create_topics_creates_the_store_compacted_and_keeps_the_intake_topics_a_day(
    env: dict[str, str], tmp_path: Path
) -> None:
    """Guarantee 1: with BLACKBOX_STORE_TOPIC, create-topics creates it with
    cleanup.policy=compact (its partitions and replication settings as the other topics'),
    raises the intake and dead-letter topics to the one day the store leaves them to keep
    (86,400,000 ms, not the horizon's), and a second run changes nothing."""
    run_env = _with_store(env)
    store, intake, dlq = (run_env[f"BLACKBOX_{n}_TOPIC"] for n in ("STORE", "INTAKE", "DLQ"))
    hour = {retention.RETENTION: str(HOUR_MS)}
    _create(env, [NewTopic(intake, 1, config=hour), NewTopic(dlq, 1, config=hour)])

    code, output = _create_topics(run_env, tmp_path / "first.log", "--partitions", "2")
    assert code == 0, output

    found = retention.kept(_bootstrap(env), [store, intake, dlq])
    assert found[store].cleanup_policy == "compact"
    assert found[intake].retention_ms == found[dlq].retention_ms == DAY_MS
    assert "intake_retention_raised" in output
    assert "dead_letter_retention_raised" in output
    topics = AdminClient(_bootstrap(env)).list_topics(store, timeout=15).topics
    assert len(topics[store].partitions) == 2
    assert _dynamic_min_insync(env, store) == ("1", ConfigSource.DYNAMIC_TOPIC_CONFIG.value)

    code, again = _create_topics(run_env, tmp_path / "second.log")
    assert code == 0, again
    assert retention.kept(_bootstrap(env), [store, intake, dlq]) == found
    assert "retention_raised" not in again
    assert "Traceback" not in output + again


def test_beside_a_store_a_new_intake_topic_is_not_raised_to_the_horizon(
    env: dict[str, str], tmp_path: Path
) -> None:
    """With a store topic, a new intake topic keeps the broker's default retention (a week,
    more than the day it needs) instead of being raised to the longest horizon plus the
    grace, as it is without one."""
    run_env = _with_store(env)
    code, output = _create_topics(run_env, tmp_path / "create.log")
    assert code == 0, output
    names = [env["BLACKBOX_INTAKE_TOPIC"], env["BLACKBOX_EVENTS_TOPIC"]]
    found = retention.current_ms(_bootstrap(env), names)
    settings = Settings.from_env(run_env)
    horizon = retention.needed_ms(settings.max_countdown, settings.grace_seconds)
    assert found[names[0]] == found[names[1]]  # as the broker made it: not raised
    assert DAY_MS <= found[names[0]] < horizon


def test_without_a_store_create_topics_is_as_before(env: dict[str, str], tmp_path: Path) -> None:
    """No BLACKBOX_STORE_TOPIC: the three topics alone, none compacted, and the intake topic
    raised to the longest horizon plus the grace."""
    code, output = _create_topics(env, tmp_path / "create.log")
    assert code == 0, output
    names = [env[f"BLACKBOX_{n}_TOPIC"] for n in ("INTAKE", "DLQ", "EVENTS")]
    found = retention.kept(_bootstrap(env), names)
    assert [retention.compacted(k) for k in found.values()] == [False] * 3
    settings = Settings.from_env(env)
    horizon = retention.needed_ms(settings.max_countdown, settings.grace_seconds)
    assert found[names[0]].retention_ms == horizon > DAY_MS
    assert "store" not in output


@pytest.mark.parametrize("policy", DELETING)
def test_create_topics_refuses_a_store_topic_that_deletes_and_leaves_it(
    policy: str, env: dict[str, str], tmp_path: Path
) -> None:
    """Guarantee 1: a store topic found with `delete` in its cleanup.policy is a usage error
    (exit code 2) naming the topic, the policy found and the kafka-configs command that
    fixes it; the topic is left as it was (changing `compact,delete` silently would be as
    wrong as keeping it: an operator decides)."""
    run_env = _with_store(env)
    store = run_env["BLACKBOX_STORE_TOPIC"]
    _create(env, [NewTopic(store, 1, config={retention.CLEANUP: policy})])

    code, output = _create_topics(run_env, tmp_path / "create.log")

    assert code == 2, output
    assert f"BLACKBOX_STORE_TOPIC={store}: the topic has cleanup.policy={policy}," in output
    assert (f"kafka-configs.sh --bootstrap-server {env['KAFKA_BOOTSTRAP_SERVERS']} --alter "
            f"--entity-type topics --entity-name {store} --add-config cleanup.policy=compact"
            ) in output  # fmt: skip
    assert "Traceback" not in output
    assert retention.kept(_bootstrap(env), [store])[store].cleanup_policy == policy


@pytest.mark.parametrize("policy", [None, *DELETING])
def test_the_service_refuses_to_start_beside_a_store_topic_missing_or_deleting(
    policy: str | None, env: dict[str, str], tmp_path: Path
) -> None:
    """Guarantee 1: `blackbox run` with a store topic that does not exist, or whose
    cleanup.policy has `delete`, stops at start with exit code 2 and says what it found and
    how to fix it; nothing creates or changes the topic."""
    run_env = _with_store(env)
    store = run_env["BLACKBOX_STORE_TOPIC"]
    clients.ensure_topics(_bootstrap(env), [env["BLACKBOX_INTAKE_TOPIC"]])
    if policy is not None:
        _create(env, [NewTopic(store, 1, config={retention.CLEANUP: policy})])
    process = BlackboxProcess(run_env, tmp_path / "run.log", "run")
    try:
        code = process.wait(timeout=60)
    finally:
        if process.process.poll() is None:  # it did not stop: end it, the test fails
            process.kill()

    output = process.output()
    assert code == EXIT_SETTINGS == 2, output
    assert "Traceback" not in output
    if policy is None:
        assert f"BLACKBOX_STORE_TOPIC={store}: the topic does not exist" in output
        assert "Run `blackbox create-topics`" in output
        assert store not in AdminClient(_bootstrap(env)).list_topics(timeout=15).topics
    else:
        assert f"the topic has cleanup.policy={policy}," in output
        assert f"--entity-name {store} --add-config cleanup.policy=compact" in output
        assert retention.kept(_bootstrap(env), [store])[store].cleanup_policy == policy


def test_beside_a_compacted_store_the_start_check_names_the_one_day_window(
    start_service: ServiceFactory, env: dict[str, str]
) -> None:
    """A compacted store topic starts the service, is not warned of as compacted (the
    intake topics' compaction warning is not for it), and an intake topic keeping less
    than a day is named with the one-day window the store leaves it."""
    run_env = _with_store(env)
    store, intake = run_env["BLACKBOX_STORE_TOPIC"], env["BLACKBOX_INTAKE_TOPIC"]
    _create(env, [NewTopic(intake, 1, config={retention.RETENTION: str(HOUR_MS)})])
    with capture_logs() as logs:
        service = start_service(BLACKBOX_STORE_TOPIC=store)
        wait_until(lambda: any(e["event"] == "intake_retention_short" for e in list(logs)),
                   what="the intake topic named")  # fmt: skip

    (short,) = [e for e in logs if e["event"] == "intake_retention_short"]
    assert (short["topic"], short["store_topic"], short["needed_ms"]) == (intake, store, DAY_MS)
    assert "one-day window" in short["why"]
    assert [e for e in logs if e.get("topic") == store and e["log_level"] != "info"] == []
    assert service.health.holds == {}
    assert not service.failed


@pytest.fixture
def own_broker(tmp_path: Path) -> Iterator[KafkaBroker]:
    server = KafkaBroker(free_port(), tmp_path / "kafka")
    server.start()
    yield server
    _signal(server, signal.SIGCONT)
    server.stop()


def _signal(server: KafkaBroker, signum: signal.Signals) -> None:
    if server.process is not None and server.process.poll() is None:
        os.kill(server.process.pid, signum)


def test_a_broker_away_at_start_holds_intake_and_a_store_found_deleting_then_stops_it(
    own_broker: KafkaBroker, redis_server: RedisServer
) -> None:
    """Guarantee 5 and 1: a broker that cannot describe the store topic at start does not
    stop the service: intake waits and the replica is not ready, naming why; each probe
    asks again, and once the broker tells a cleanup.policy with `delete` the service stops
    with exit code 2."""
    env = _with_store(service_env(redis_server.url, own_broker.bootstrap))
    store = env["BLACKBOX_STORE_TOPIC"]
    settings = Settings.from_env(env)
    clients.ensure_topics(settings.kafka, [t for t in settings.own_topics if t != store])
    _create(env, [NewTopic(store, 1, config={retention.CLEANUP: "delete"})])
    _signal(own_broker, signal.SIGSTOP)  # it keeps its port but answers nothing
    service = Service(settings)
    with capture_logs() as logs:
        service.start()  # a broker that does not answer is no reason to stop
        try:
            assert not service.failed
            assert "could not be checked" in service.health.holds["store"]
            assert "store_topic_unchecked" in _events(logs)
            _signal(own_broker, signal.SIGCONT)
            wait_until(service.stopping.is_set, 90, "the service stopped")
            assert service.exit_code == EXIT_SETTINGS
            assert "store_topic_refused" in _events(logs)
            assert not service._redis_checked.is_set()  # intake never began
        finally:
            service.stop()


def _events(logs: list[MutableMapping[str, Any]]) -> list[str]:
    return [e["event"] for e in list(logs)]
