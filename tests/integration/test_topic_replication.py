"""`blackbox create-topics` replicates the topics as the cluster allows (kafka/replication.py),
and refuses what the cluster cannot hold. On the one broker of these tests: 1 copy, nothing
to warn of (a 3-broker cluster: benchmarks/broker_failover.py, docs/production.md)."""

from __future__ import annotations

from pathlib import Path

from blackbox.dev.servers import free_port
from blackbox.kafka import replication
from tests.process import BlackboxProcess


def test_create_topics_on_one_broker_keeps_one_copy_and_warns_of_nothing(
    env: dict[str, str], tmp_path: Path
) -> None:
    """Guarantee 1: each topic made on a one-broker cluster has the one copy it can have,
    the broker's own min.insync.replicas, and neither create-topics nor the plan finds it
    short."""
    created = BlackboxProcess(env, tmp_path / "create.log", "create-topics")
    assert created.wait(60) == 0, created.output()

    names = [env["BLACKBOX_INTAKE_TOPIC"], env["BLACKBOX_DLQ_TOPIC"], env["BLACKBOX_EVENTS_TOPIC"]]
    bootstrap = {"bootstrap.servers": env["KAFKA_BOOTSTRAP_SERVERS"]}
    found = replication.found(bootstrap, names)
    assert {t: (f.replication_factor, f.min_insync_replicas) for t, f in found.items()} == {
        name: (1, 1) for name in names
    }
    assert '"replication_factor": 1, "min_insync_replicas": 1' in created.output()
    assert "topic_replication_low" not in created.output()
    assert replication.warn_if_weak(bootstrap, names) == []


def test_create_topics_refuses_more_copies_than_brokers(
    env: dict[str, str], tmp_path: Path
) -> None:
    """Asking for 3 copies of a one-broker cluster is a usage error naming the brokers (it
    was the broker's INVALID_REPLICATION_FACTOR as a traceback), and so are needing more in
    sync than there are copies and counts that are not counts; nothing is created."""
    for args, expected in [
        (("--replication-factor", "3"), "the cluster has 1 broker(s)"),
        (("--min-insync-replicas", "2"), "more than the 1 copies kept"),
        (("--replication-factor", "0"), "'0' is not a count from 1"),
        (("--partitions", "abc"), "'abc' is not a whole number"),
    ]:
        log = tmp_path / f"{args[0]}-{args[1]}.log"
        refused = BlackboxProcess(env, log, "create-topics", *args)
        assert refused.wait(60) == 2, refused.output()
        assert expected in refused.output(), refused.output()
        assert "Traceback" not in refused.output()
    bootstrap = {"bootstrap.servers": env["KAFKA_BOOTSTRAP_SERVERS"]}
    assert replication.brokers(bootstrap) == 1


def test_create_topics_names_a_kafka_that_does_not_answer(
    env: dict[str, str], tmp_path: Path
) -> None:
    """No broker at the address: create-topics says Kafka did not answer and exits 1, with
    no traceback."""
    nowhere = {**env, "KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{free_port()}",
               "KAFKA_SOCKET_CONNECTION_SETUP_TIMEOUT_MS": "1000"}  # fmt: skip
    refused = BlackboxProcess(nowhere, tmp_path / "nowhere.log", "create-topics")
    assert refused.wait(60) == 1, refused.output()
    assert "Kafka did not answer" in refused.output()
    assert "Traceback" not in refused.output()
