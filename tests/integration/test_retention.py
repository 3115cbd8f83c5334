"""The intake topics keep every request as long as it can be pending: `blackbox create-topics`
sets their retention from the longest horizon, and the service warns when a topic keeps less
(what Redis loses is read again or rebuilt from them)."""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import Any

from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]
from structlog.testing import capture_logs

from blackbox.kafka import retention
from tests.integration.conftest import ServiceFactory
from tests.kafkatools import unique, wait_until
from tests.process import BlackboxProcess

HOUR_MS = 3_600_000


def _create(bootstrap: Mapping[str, Any], topics: list[NewTopic]) -> None:
    admin = AdminClient(dict(bootstrap))  # kept until every topic is created
    for future in admin.create_topics(topics).values():
        future.result(15)


def test_create_topics_sets_the_intake_retention_from_the_longest_horizon(
    env: dict[str, str], tmp_path: Path
) -> None:
    """Guarantee 1: the intake topic keeps a request for the longest horizon any caller may
    use plus the grace (a caller's policy horizon counts), and a topic that keeps less is
    raised, never lowered; the dead-letter topic too (a rebuild reads what was refused and
    what failed there); the events topic is left as Kafka makes it."""
    policy = tmp_path / "policy.yaml"
    policy.write_text("callers:\n  billing:\n    max_horizon_seconds: 7200\n")
    run_env = {**env, "BLACKBOX_POLICY_FILE": str(policy), "BLACKBOX_MAX_COUNTDOWN": "3600",
               "BLACKBOX_GRACE_SECONDS": "600"}  # fmt: skip
    bootstrap = {"bootstrap.servers": env["KAFKA_BOOTSTRAP_SERVERS"]}
    short = NewTopic(env["BLACKBOX_INTAKE_TOPIC"], 1, config={retention.RETENTION: str(HOUR_MS)})
    letters = NewTopic(env["BLACKBOX_DLQ_TOPIC"], 1, config={retention.RETENTION: str(HOUR_MS)})
    _create(bootstrap, [short, letters])

    created = BlackboxProcess(run_env, tmp_path / "create.log", "create-topics")
    assert created.wait(60) == 0, created.output()

    names = [env["BLACKBOX_INTAKE_TOPIC"], env["BLACKBOX_DLQ_TOPIC"], env["BLACKBOX_EVENTS_TOPIC"]]
    found = retention.current_ms(bootstrap, names)
    assert found[env["BLACKBOX_INTAKE_TOPIC"]] == (7200 + 600) * 1000
    assert found[env["BLACKBOX_DLQ_TOPIC"]] == (7200 + 600) * 1000
    assert found[env["BLACKBOX_EVENTS_TOPIC"]] != (7200 + 600) * 1000
    assert "intake_retention_raised" in created.output()
    assert "dead_letter_retention_raised" in created.output()


def test_a_topic_that_keeps_records_forever_is_left_alone(
    env: dict[str, str], tmp_path: Path
) -> None:
    """retention.ms=-1 (keep forever) is never lowered to the needed retention."""
    bootstrap = {"bootstrap.servers": env["KAFKA_BOOTSTRAP_SERVERS"]}
    forever = NewTopic(env["BLACKBOX_INTAKE_TOPIC"], 1, config={retention.RETENTION: "-1"})
    _create(bootstrap, [forever])
    created = BlackboxProcess(env, tmp_path / "create.log", "create-topics")
    assert created.wait(60) == 0, created.output()
    assert retention.current_ms(bootstrap, [forever.topic]) == {forever.topic: -1}


def test_the_service_warns_when_the_intake_topic_keeps_less_than_needed(
    env: dict[str, str],
) -> None:
    """The check the service runs at start names an intake topic that would delete
    requests before they can fire, and passes over one that keeps them long enough."""
    bootstrap = {"bootstrap.servers": env["KAFKA_BOOTSTRAP_SERVERS"]}
    topics = [
        NewTopic(env["BLACKBOX_INTAKE_TOPIC"], 1, config={retention.RETENTION: str(HOUR_MS)}),
        NewTopic(env["BLACKBOX_EVENTS_TOPIC"], 1, config={retention.RETENTION: "-1"}),
    ]
    _create(bootstrap, topics)
    names = [t.topic for t in topics]
    assert retention.warn_if_short(bootstrap, names, 2 * HOUR_MS) == [names[0]]
    assert retention.warn_if_short(bootstrap, names, HOUR_MS) == []


def test_the_service_warns_when_a_size_cap_or_compaction_deletes_requests(
    env: dict[str, str],
) -> None:
    """Guarantee 1: retention.bytes deletes a partition's oldest records long before
    retention.ms, and compaction drops a schedule's earlier versions and its creation
    record: the check the service runs at start names each, and passes over a topic that
    keeps every record for long enough."""
    bootstrap = {"bootstrap.servers": env["KAFKA_BOOTSTRAP_SERVERS"]}
    capped, compacted, kept = (unique("capped"), unique("compacted"), unique("kept"))
    _create(bootstrap, [
        NewTopic(capped, 1, config={retention.RETENTION: "-1", retention.SIZE: "1048576"}),
        NewTopic(compacted, 1, config={retention.RETENTION: "-1",
                                       retention.CLEANUP: "compact,delete"}),
        NewTopic(kept, 1, config={retention.RETENTION: "-1", retention.SIZE: "-1"}),
    ])  # fmt: skip
    with capture_logs() as logs:
        warned = retention.warn_if_short(bootstrap, [capped, compacted, kept], HOUR_MS)
    assert warned == sorted([capped, compacted])
    found = {(e["event"], e["topic"]) for e in logs if e["log_level"] == "warning"}
    assert found == {("intake_retention_size_capped", capped),
                     ("intake_topic_compacted", compacted)}  # fmt: skip


def test_create_topics_names_a_size_cap_and_compaction_and_leaves_them(
    env: dict[str, str], tmp_path: Path
) -> None:
    """`blackbox create-topics` raises retention.ms but does not change a retention.bytes or
    cleanup.policy it finds on an intake topic (an operator's disk budget, or a topic shared
    on purpose): it says what it found and what deletes requests, so it is never silent."""
    bootstrap = {"bootstrap.servers": env["KAFKA_BOOTSTRAP_SERVERS"]}
    intake = env["BLACKBOX_INTAKE_TOPIC"]
    _create(bootstrap, [NewTopic(intake, 1, config={
        retention.RETENTION: str(HOUR_MS), retention.SIZE: "1048576",
        retention.CLEANUP: "compact"})])  # fmt: skip

    created = BlackboxProcess(env, tmp_path / "create.log", "create-topics")
    assert created.wait(60) == 0, created.output()

    assert "intake_retention_size_capped" in created.output()
    assert "intake_topic_compacted" in created.output()
    found = retention.kept(bootstrap, [intake])[intake]
    assert (found.retention_bytes, found.cleanup_policy) == (1048576, "compact")
    assert found.retention_ms is not None and found.retention_ms > HOUR_MS


def test_the_service_warns_when_the_dead_letter_topic_keeps_less_than_needed(
    start_service: ServiceFactory, env: dict[str, str]
) -> None:
    """A rebuild trusts the dead-letter topic (what was refused, what failed for good): the
    check at start covers it as it covers the intake topic."""
    bootstrap = {"bootstrap.servers": env["KAFKA_BOOTSTRAP_SERVERS"]}
    dlq = env["BLACKBOX_DLQ_TOPIC"]
    _create(bootstrap, [NewTopic(dlq, 1, config={retention.RETENTION: str(HOUR_MS)})])
    with capture_logs() as logs:
        start_service()
        wait_until(lambda: ("intake_retention_short", dlq) in _warned(logs),
                   what="the dead-letter topic named")  # fmt: skip


def _warned(logs: list[MutableMapping[str, Any]]) -> set[tuple[str, str]]:
    return {(e["event"], e.get("topic", "")) for e in list(logs)}
