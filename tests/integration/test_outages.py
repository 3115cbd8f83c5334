"""Redis or the broker unreachable mid-run: the service stays up, reports not-ready, resumes
by itself and loses nothing. (`make chaos` holds each outage for 30 s; these for the time a
steady sender takes, a few seconds.)"""

from __future__ import annotations

import os
import signal
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from confluent_kafka import Producer

from blackbox.dev.servers import KafkaBroker, RedisServer, free_port
from blackbox.kafka import clients
from blackbox.service import Service
from blackbox.settings import Settings
from tests.integration.conftest import service_env
from tests.kafkatools import TopicReader, unique, wait_until

MESSAGES = 200


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(free_port(), tmp_path / "redis", appendfsync="always")
    (tmp_path / "redis").mkdir()
    server.start()
    yield server
    _resume(server)
    server.stop()


@pytest.fixture
def own_broker(tmp_path: Path) -> Iterator[KafkaBroker]:
    server = KafkaBroker(free_port(), tmp_path / "kafka")
    server.start()
    yield server
    _resume(server)
    server.stop()


def _pause(server: RedisServer | KafkaBroker) -> None:
    """SIGSTOP: the process keeps its port and its data but answers nothing."""
    assert server.process is not None
    os.kill(server.process.pid, signal.SIGSTOP)


def _resume(server: RedisServer | KafkaBroker) -> None:
    if server.process is not None and server.process.poll() is None:
        os.kill(server.process.pid, signal.SIGCONT)


def _ready(service: Service) -> bool:
    assert service.endpoints is not None
    url = f"http://127.0.0.1:{service.endpoints.port}/ready"
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except urllib.error.HTTPError as e:
        assert e.code == 503
        return False


class _SteadySender(threading.Thread):
    """Sends MESSAGES envelopes over a few seconds; counts the broker's acknowledgements."""

    def __init__(self, bootstrap: str, intake: str, target: str) -> None:
        super().__init__(daemon=True)
        self.producer = Producer(
            {"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True}
        )  # a retry writes nothing twice
        self.intake, self.target = intake, target
        self.produced = self.acknowledged = 0
        self.stop = threading.Event()

    def run(self) -> None:
        for n in range(MESSAGES):
            value = orjson.dumps({"topic": self.target, "message": n, "countdown": n % 3})
            self.producer.produce(self.intake, value, on_delivery=self._report)
            self.producer.poll(0)
            self.produced += 1
            self.stop.wait(0.02)
        self.producer.flush(120)

    def _report(self, error: object, _message: object) -> None:
        if error is None:
            self.acknowledged += 1


def _run_outage(server: RedisServer | KafkaBroker, redis_url: str, bootstrap: str) -> None:
    env = service_env(redis_url, bootstrap, BLACKBOX_HEALTH_INTERVAL="0.3")
    settings = Settings.from_env(env)
    target = unique("outage")
    clients.ensure_topics(settings.kafka, [*settings.own_topics, target])
    reader = TopicReader(bootstrap, target)
    service = Service(settings)
    service.start()
    try:
        wait_until(lambda: _ready(service), what="ready before the outage")
        sender = _SteadySender(bootstrap, settings.intake_topic, target)
        sender.start()
        _pause(server)
        wait_until(lambda: not _ready(service), timeout=15, what="not-ready during the outage")
        wait_until(lambda: sender.produced >= MESSAGES // 2, what="the sender half way")
        _resume(server)
        wait_until(lambda: _ready(service), timeout=30, what="ready again after the outage")
        sender.join(120)
        records = reader.wait_count(MESSAGES, timeout=90)

        assert sender.acknowledged == MESSAGES
        assert sorted(orjson.loads(r.value or b"") for r in records) == list(range(MESSAGES))
        assert not service.failed
        assert service.metrics.value("blackbox_ready") == 1
    finally:
        service.stop()
        reader.close()


def test_redis_away_reports_not_ready_resumes_and_loses_nothing(
    own_redis: RedisServer, broker: KafkaBroker
) -> None:
    """Guarantee 5: with Redis unreachable, intake and firing back off and resume by themselves."""
    _run_outage(own_redis, own_redis.url, broker.bootstrap)


def test_broker_away_reports_not_ready_resumes_and_loses_nothing(
    own_broker: KafkaBroker, redis_server: RedisServer
) -> None:
    """Guarantee 5: with the broker unreachable, nothing is committed or acked until it is back."""
    _run_outage(own_broker, redis_server.url, own_broker.bootstrap)
