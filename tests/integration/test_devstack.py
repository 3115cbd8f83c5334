"""`blackbox dev` (what `make run` starts): Apache Kafka and Redis with kept state, as a user
runs it, spoken to by a third-party Kafka client."""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import redis
from confluent_kafka.admin import AdminClient

from blackbox.dev.servers import LOOPBACK, port_open
from blackbox.dev.stack import DEV_PARTITIONS
from blackbox.kafka import retention
from blackbox.settings import Settings
from tests.kafkatools import TopicReader, unique, wait_until
from tests.process import BlackboxProcess


def _dev(
    state: Path, log: Path, kafka_port: int, redis_port: int, broker: str = "kafka", *more: str
) -> BlackboxProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "KAFKA_BOOTSTRAP_SERVERS")}
    env.update(BLACKBOX_HTTP_PORT="0", BLACKBOX_LOG_FORMAT="json", BLACKBOX_POLL_INTERVAL="0.2")
    return BlackboxProcess(env, log, "dev", "--kafka-port", str(kafka_port), "--broker", broker,
                           "--redis-port", str(redis_port), "--state-dir", str(state),
                           *more)  # fmt: skip


def _kcat_send(bootstrap: str, value: dict[str, object]) -> None:
    """Produce one envelope to the intake topic with Debian's kcat (librdkafka's CLI)."""
    kcat = shutil.which("kcat")
    assert kcat is not None, "kcat is installed by make setup"
    subprocess.run([kcat, "-P", "-b", bootstrap, "-t", "blackbox", "-H", "CALLER_SERVICE=e2e"],
                   input=orjson.dumps(value), check=True, timeout=30)  # fmt: skip


def _started(process: BlackboxProcess) -> bool:
    assert process.process.poll() is None, process.output()
    return "local_stack_ready" in process.output()


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((LOOPBACK, port))
        except OSError:
            return False
    return True


@pytest.fixture
def ports() -> tuple[int, int]:
    """A Kafka port whose next port (the controller's) is free too, and a Redis port, all
    below the kernel's ephemeral range: the stack is started twice on them, and a port from
    that range may be taken in between as the local end of any outgoing connection."""
    low, _ = (int(n) for n in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    chooser = random.Random()
    for _ in range(200):
        kafka_port, redis_port = chooser.randrange(10000, low - 1), chooser.randrange(10000, low)
        if redis_port not in (kafka_port, kafka_port + 1) and all(
            _bindable(port) for port in (kafka_port, kafka_port + 1, redis_port)
        ):
            return kafka_port, redis_port
    raise AssertionError("no free ports below the ephemeral range")


def test_dev_keeps_topics_offsets_and_pending_schedules_across_a_restart(
    tmp_path: Path, ports: tuple[int, int]
) -> None:
    """`make run` starts Apache Kafka; a kcat producer schedules through it; a schedule
    pending at a stop fires after the next start, from the same state folder, once."""
    kafka_port, redis_port = ports
    bootstrap, state = f"127.0.0.1:{kafka_port}", tmp_path / "state"
    now_target, later_target = unique("now"), unique("later")
    dev = _dev(state, tmp_path / "dev1.log", kafka_port, redis_port)
    try:
        wait_until(lambda: _started(dev), timeout=120, what="the local stack")
        _kcat_send(bootstrap, {"topic": now_target, "message": 1, "countdown": 0})
        _kcat_send(bootstrap, {"topic": later_target, "message": 2, "countdown": 12})
        events = TopicReader(bootstrap, "blackbox.events")
        events.wait_count(2, timeout=30)
        events.close()
        TopicReader(bootstrap, now_target).wait_count(1, timeout=30)
    finally:
        assert dev.terminate(30) == 0

    again = _dev(state, tmp_path / "dev2.log", kafka_port, redis_port)
    try:
        wait_until(lambda: _started(again), timeout=120, what="the local stack again")
        later = TopicReader(bootstrap, later_target)
        (record,) = later.wait_count(1, timeout=40)
        later.poll(1.0)
        assert [orjson.loads(r.value or b"") for r in later.records] == [2]
        assert record.header("CALLER_SERVICE") == "e2e"
        later.close()
    finally:
        assert again.terminate(30) == 0
    assert (state / "kafka" / "kafka-data" / "meta.properties").exists()
    assert (state / "redis" / "appendonlydir").exists()


def test_dev_serves_its_open_api_to_this_machine_alone(
    tmp_path: Path, ports: tuple[int, int]
) -> None:
    """Guarantee 4: `blackbox dev` opens every API call without a token, so it listens on
    127.0.0.1 only and answers only local Host names: a page elsewhere whose name resolves
    to 127.0.0.1 (DNS rebinding) is refused 400. (Tansu: no state needed here.)"""
    kafka_port, redis_port = ports
    dev = _dev(tmp_path / "state", tmp_path / "dev.log", kafka_port, redis_port, "tansu")
    try:
        wait_until(lambda: _serving(dev), timeout=120, what="the local stack's API")
        listening = _event(dev, "http_listening")
        assert listening["host"] == "127.0.0.1"
        stats = f"http://127.0.0.1:{listening['port']}/api/v1/stats"
        assert httpx.get(stats, timeout=10).status_code == 200
        rebound = httpx.get(stats, headers={"Host": "attacker.example"}, timeout=10)
        assert rebound.status_code == 400
    finally:
        assert dev.terminate(30) == 0


def _serving(process: BlackboxProcess) -> bool:
    return _started(process) and '"http_listening"' in process.output()


def _event(process: BlackboxProcess, name: str) -> dict[str, Any]:
    """The first log event of this name (the log is JSON lines)."""
    for line in process.output().splitlines():
        if line.startswith("{") and f'"{name}"' in line:
            event: dict[str, Any] = orjson.loads(line)
            if event.get("event") == name:
                return event
    raise AssertionError(f"no {name} event in the log")


def test_ctrl_c_stops_the_service_before_redis_and_the_broker(
    tmp_path: Path, ports: tuple[int, int]
) -> None:
    """Ctrl-C on `make run` (SIGINT to the terminal's whole process group) stops the service
    first, cleanly, and only then Redis and the broker: no dependency is seen going away
    and no crash note is left for the next start. The ready line says where the API and
    the admin page are, and the intake topic has several partitions, so a producer with
    the wrong partitioner shows up locally."""
    kafka_port, redis_port = ports
    log = tmp_path / "dev.log"
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "KAFKA_BOOTSTRAP_SERVERS")}
    env.update(BLACKBOX_LOG_FORMAT="json", BLACKBOX_HTTP_PORT="0")
    with log.open("ab") as out:
        dev = subprocess.Popen(
            [sys.executable, "-m", "blackbox", "dev", "--broker", "tansu", "--kafka-port",
             str(kafka_port), "--redis-port", str(redis_port), "--state-dir", str(tmp_path)],
            env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    process = _Watched(dev, log)
    try:
        wait_until(lambda: _serving(process), timeout=120, what="the local stack's API")
        ready = _event(process, "local_stack_ready")
        port = _event(process, "http_listening")["port"]
        assert ready["admin_page"] == f"http://127.0.0.1:{port}/"
        assert ready["api"] == f"http://127.0.0.1:{port}/api/v1"
        admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{kafka_port}"})
        topics = admin.list_topics("blackbox", timeout=30).topics
        assert len(topics["blackbox"].partitions) == DEV_PARTITIONS
    finally:
        os.killpg(dev.pid, signal.SIGINT)  # what the terminal does on Ctrl-C
        assert dev.wait(60) == 0, process.output()
    after = process.output().split('"signal_received"', 1)[1]
    troubles = ("dependency_down", "not_ready", "Connection refused", '"level": "error"', "%3|")
    for trouble in troubles:
        assert trouble not in after, trouble
    assert not port_open(redis_port)
    assert not port_open(kafka_port)


class _Watched(BlackboxProcess):
    """A `blackbox dev` started in its own session (as a terminal's foreground job), read
    like the others."""

    def __init__(self, process: subprocess.Popen[bytes], log_path: Path) -> None:
        self.process, self.log_path = process, log_path


def _printed(process: BlackboxProcess, text: str) -> bool:
    assert process.process.poll() is None, process.output()
    return text in process.output()


def _events(process: BlackboxProcess) -> list[dict[str, Any]]:
    """Every JSON log event written so far."""
    lines = process.output().splitlines()
    return [orjson.loads(line) for line in lines if line.startswith('{"')]


def test_dev_without_the_service_starts_only_redis_and_kafka(
    tmp_path: Path, ports: tuple[int, int]
) -> None:
    """`blackbox dev --no-service` starts Redis and Apache Kafka, creates blackbox's topics
    as `create-topics` does (partitions, retention the service's check accepts), prints
    the settings that reach them, runs no service, and stops both on SIGTERM."""
    kafka_port, redis_port = ports
    dev = _dev(tmp_path / "state", tmp_path / "dev.log", kafka_port, redis_port, "kafka",
               "--no-service")  # fmt: skip
    try:
        wait_until(lambda: _printed(dev, "export KAFKA_BOOTSTRAP_SERVERS="), timeout=120,
                   what="the connection settings")  # fmt: skip
        lines = dev.output().splitlines()
        assert f"export REDIS_URL=redis://127.0.0.1:{redis_port}/0" in lines
        assert f"export KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:{kafka_port}" in lines
        config: dict[str, Any] = {"bootstrap.servers": f"127.0.0.1:{kafka_port}"}
        found = AdminClient(config).list_topics(timeout=30).topics
        assert all(len(found[t].partitions) == DEV_PARTITIONS for t in Settings.from_env(
            {}).own_topics)  # fmt: skip
        _assert_kept_long_enough(config)
        assert redis.Redis(port=redis_port).ping()
    finally:
        assert dev.terminate(30) == 0, dev.output()
    names = [event["event"] for event in _events(dev)]
    assert "local_stack_ready" in names
    assert "service_starting" not in names and "http_listening" not in names
    assert not port_open(redis_port) and not port_open(kafka_port)


def _assert_kept_long_enough(config: dict[str, Any]) -> None:
    """The intake and dead-letter topics keep records as long as the service's own start
    check asks for the default settings (no shortfall it would warn of)."""
    settings = Settings.from_env({})
    needed = retention.needed_ms(settings.max_countdown, settings.grace_seconds)
    kept = retention.kept(config, [settings.intake_topic, settings.dlq_topic])
    assert {topic: retention.shortfalls(k, needed) for topic, k in kept.items()} == {
        settings.intake_topic: [], settings.dlq_topic: []}  # fmt: skip


def test_the_quick_start_logs_no_warning(tmp_path: Path, ports: tuple[int, int]) -> None:
    """`make run` on a fresh machine: `blackbox dev` with Apache Kafka starts the service,
    whose intake starts after its retention check, and nothing on that first screen is a
    warning or an error (7 days' retention was once warned of as intake_retention_short
    for the intake and dead-letter topics at every start, and each idempotent producer
    warned that the broker's transaction coordinator was still loading)."""
    kafka_port, redis_port = ports
    dev = _dev(tmp_path / "state", tmp_path / "dev.log", kafka_port, redis_port)
    try:
        wait_until(lambda: _printed(dev, "intake_started"), timeout=120, what="intake")
        _assert_kept_long_enough({"bootstrap.servers": f"127.0.0.1:{kafka_port}"})
    finally:
        assert dev.terminate(30) == 0, dev.output()
    events = _events(dev)
    assert "intake_started" in [event["event"] for event in events]
    loud = [event for event in events if event.get("level") in ("warning", "error", "critical")]
    assert loud == []
    assert "%3|" not in dev.output() and "%4|" not in dev.output()  # nor librdkafka's
