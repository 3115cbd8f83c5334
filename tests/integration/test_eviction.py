"""An evicting Redis is refused at start (it may delete payloads: lost schedules), unless the
risk is accepted; a Redis whose CONFIG is disabled is run on, with a warning."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from structlog.testing import capture_logs

from blackbox.dev.servers import RedisServer, free_port
from blackbox.errors import EvictingRedis
from blackbox.exits import EXIT_SETTINGS
from blackbox.service import Service
from blackbox.settings import Settings
from blackbox.storage import memory
from tests.kafkatools import wait_until
from tests.process import BlackboxProcess

EVICTING = {"maxmemory": "64mb", "maxmemory-policy": "volatile-lru"}


def _started(path: Path, config: dict[str, str], port: int = 0) -> RedisServer:
    server = RedisServer(port or free_port(), path, config=config)
    server.start()
    return server


@pytest.fixture
def evicting_redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = _started(tmp_path, EVICTING)
    yield server
    server.stop()


def _env(redis_url: str, **overrides: str) -> dict[str, str]:
    """Settings that reach no broker: the policy is checked before any Kafka call."""
    return {
        "REDIS_URL": redis_url,
        "KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{free_port()}",
        "BLACKBOX_HTTP_PORT": "off",
        "BLACKBOX_LOG_FORMAT": "json",
        "BLACKBOX_HEALTH_INTERVAL": "0.2",
        **overrides,
    }


def test_the_service_refuses_an_evicting_redis_with_exit_code_2(
    evicting_redis: RedisServer, tmp_path: Path
) -> None:
    """Guarantee 1: Redis with maxmemory-policy volatile-lru may evict payloads (they all
    carry a TTL), so `blackbox run` stops at start with exit code 2 and says what to set."""
    process = BlackboxProcess(_env(evicting_redis.url), tmp_path / "run.log", "run")
    try:
        code = process.wait(timeout=30)
    finally:
        if process.process.poll() is None:  # it did not stop: end it, the test fails
            process.kill()

    assert code == 2
    output = process.output()
    assert "maxmemory-policy is volatile-lru" in output
    assert "noeviction" in output
    assert "BLACKBOX_ACCEPT_EVICTION=true" in output


def test_an_accepted_evicting_redis_is_run_on_with_a_warning(
    evicting_redis: RedisServer,
) -> None:
    """BLACKBOX_ACCEPT_EVICTION=true is the explicit opt-out: it starts, and says so."""
    client = redis.Redis.from_url(evicting_redis.url)
    with capture_logs() as logs:
        memory.check_eviction(client, accept=True)
        with pytest.raises(EvictingRedis, match="maxmemory-policy is volatile-lru"):
            memory.check_eviction(client, accept=False)
    client.config_set("maxmemory-policy", "noeviction")
    memory.check_eviction(client, accept=False)
    client.close()

    assert [e["event"] for e in logs] == ["eviction_accepted"]
    assert logs[0]["policy"] == "volatile-lru"


def test_a_redis_without_config_is_run_on_with_one_warning(tmp_path: Path) -> None:
    """Managed Redis often renames CONFIG away: the policy cannot be read, so the service
    warns once (naming what to check) and starts."""
    server = _started(tmp_path, {**EVICTING, "rename-command": "CONFIG ''"})
    client = redis.Redis.from_url(server.url)
    try:
        with capture_logs() as logs:
            memory.check_eviction(client, accept=False)
    finally:
        client.close()
        server.stop()

    assert [e["event"] for e in logs] == ["eviction_policy_unknown"]
    assert logs[0]["needed"] == "noeviction"
    assert "unknown command" in logs[0]["error"]


def test_a_redis_found_evicting_after_start_stops_the_service(tmp_path: Path) -> None:
    """Redis away at start: the policy is read by the first probe that reaches it, and an
    evicting Redis then stops the service with exit code 2 all the same."""
    port = free_port()
    settings = Settings.from_env(_env(f"redis://127.0.0.1:{port}/0"))
    service = Service(settings)
    server: RedisServer | None = None
    try:
        service.start()
        assert not service.stopping.is_set()
        server = _started(tmp_path, EVICTING, port)
        wait_until(service.stopping.is_set, timeout=15)
    finally:
        service.stop()
        if server is not None:
            server.stop()

    assert service.exit_code == EXIT_SETTINGS
