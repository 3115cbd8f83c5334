"""The store topic's own settings (kafka/retention.py `check_store`): `blackbox create-topics`
creates it compacted and keeps the intake topics a day beside it; it refuses a store topic
whose cleanup.policy has `delete` in it (a schedule pending longer than retention.ms would
lose the only version the store holds of it), and does not change one."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    ConfigResource,
    ConfigSource,
    NewTopic,
)

from blackbox.kafka import retention
from blackbox.settings import Settings
from tests.kafkatools import unique
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
