"""Roles: an intake-only process and a dispatch-only process share the work apart."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis
from confluent_kafka.admin import AdminClient
from structlog.testing import capture_logs

from blackbox.dev.servers import RedisServer, free_port
from blackbox.kafka import clients
from blackbox.role import Role
from blackbox.service import Service
from blackbox.settings import Settings
from tests.integration.conftest import ReaderFactory, ServiceFactory, settle
from tests.kafkatools import envelope, produce, unique, wait_until
from tests.process import BlackboxProcess

MESSAGES = 200


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A Redis of the test's own, whose maxmemory it may change."""
    server = RedisServer(free_port(), tmp_path)
    server.start()
    yield server
    server.stop()


def _members(settings: Settings) -> int:
    """How many consumers the intake consumer group has now."""
    admin = AdminClient(dict(settings.kafka))
    futures = admin.describe_consumer_groups([settings.group_id], request_timeout=10)
    return len(futures[settings.group_id].result(timeout=10).members)


def _ready(service: Service) -> httpx.Response:
    assert service.endpoints is not None
    return httpx.get(f"http://127.0.0.1:{service.endpoints.port}/ready", timeout=5)


def _ready_report(service: Service) -> dict[str, object]:
    """/ready's body once it answers 200."""
    wait_until(lambda: _ready(service).status_code == 200, 30, f"{service.role} ready")
    body: dict[str, object] = _ready(service).json()
    return body


def test_intake_and_dispatch_processes_deliver_everything_apart(
    start_service: ServiceFactory, reader: ReaderFactory
) -> None:
    """Roles: every message stored by an intake-only process is fired once by a dispatch-only
    one; the intake process fires nothing, the dispatch process consumes nothing and never
    joins the intake consumer group."""
    intake = start_service(Role.INTAKE)
    dispatch = start_service(Role.DISPATCH)
    settings = intake.settings
    target = unique("apart")
    values = [envelope(target, {"n": n}, 0.5) for n in range(MESSAGES)]
    produce(settings.kafka["bootstrap.servers"], settings.intake_topic, values)

    reader(target).wait_count(MESSAGES, timeout=60)
    reader(settings.events_topic).wait_count(MESSAGES, timeout=30)  # intake answered each
    settle(dispatch)
    records = reader(target).read_to_end()

    ids = Counter(r.header("blackbox-id") for r in records)
    assert len(records) == len(ids) == MESSAGES
    assert (intake.firing, dispatch.receiving) == (None, None)
    delivered = [s.metrics.value("blackbox_delivered_total") for s in (intake, dispatch)]
    assert delivered == [0, MESSAGES]
    scheduled = [
        s.metrics.value("blackbox_intake_records_total", {"outcome": "scheduled"})
        for s in (intake, dispatch)
    ]
    assert scheduled == [MESSAGES, 0]
    assert _members(settings) == 1  # the intake process alone


def test_an_intake_process_wakes_the_dispatch_process_at_the_due_time(
    start_service: ServiceFactory, reader: ReaderFactory
) -> None:
    """Roles: a schedule stored by an intake-only process is fired near its due time by a
    dispatch-only process woken through Redis, not at its next safety-net tick (every 60 s
    here, past the test's deadline)."""
    intake = start_service(Role.INTAKE)
    start_service(Role.DISPATCH, BLACKBOX_POLL_INTERVAL="60", BLACKBOX_LEASE_SECONDS="140")
    settings = intake.settings
    target = unique("woken")
    produce(settings.kafka["bootstrap.servers"], settings.intake_topic,
            [envelope(target, {"soon": True}, 1.0)])  # fmt: skip

    (record,) = reader(target).wait_count(1, timeout=20)
    assert record.header("blackbox-id")


def test_each_role_is_ready_on_what_it_uses_and_says_its_role(
    start_service: ServiceFactory,
) -> None:
    """Roles: each role's /ready probes Redis and the broker; the intake role has no firing
    clock, the dispatch role's ticks; the role is logged at start and exported as
    blackbox_role_info."""
    with capture_logs() as logs:
        services = {Role.INTAKE: start_service(Role.INTAKE),
                    Role.DISPATCH: start_service(Role.DISPATCH)}  # fmt: skip
    starting = [e["role"] for e in logs if e["event"] == "service_starting"]
    assert starting == ["intake", "dispatch"]
    clocks = {Role.INTAKE: "none", Role.DISPATCH: "ticking"}
    for role, service in services.items():
        report = _ready_report(service)
        assert report["clock"] == clocks[role]
        assert report["dependencies"] == {"redis": "up", "kafka": "up"}
        assert service.metrics.value("blackbox_role_info", {"role": role.value}) == 1


def test_a_redis_full_for_intake_leaves_only_the_dispatch_role_ready(
    own_redis: RedisServer, start_service: ServiceFactory
) -> None:
    """Roles: readiness probes what a role uses. A Redis refusing intake's writes for memory
    makes an intake-only process not ready ("redis": "full"), while a dispatch-only one
    stays ready: its firing is what frees the room."""
    intake = start_service(Role.INTAKE, REDIS_URL=own_redis.url)
    dispatch = start_service(Role.DISPATCH, REDIS_URL=own_redis.url)
    for service in (intake, dispatch):
        _ready_report(service)
    client = redis.Redis.from_url(own_redis.url)
    try:
        client.config_set("maxmemory", 1)
        wait_until(lambda: _ready(intake).status_code == 503, 30, "intake not ready")
        # The dispatch process's probe saw the full Redis too, and stayed ready.
        wait_until(lambda: dispatch.metrics.value("blackbox_redis_full") == 1, 30, "seen full")
        assert _ready(intake).json()["dependencies"]["redis"] == "full"
        assert _ready(dispatch).status_code == 200
    finally:
        client.config_set("maxmemory", 0)
        client.close()


@pytest.fixture
def role_processes(env: dict[str, str], tmp_path: Path) -> Iterator[dict[str, BlackboxProcess]]:
    """`blackbox run --role intake` and `--role dispatch` (topics created first); killed at
    the end if a test left one running."""
    clients.ensure_topics(Settings.from_env(env).kafka, Settings.from_env(env).own_topics)
    processes = {
        role: BlackboxProcess(env, tmp_path / f"{role}.log", "run", "--role", role)
        for role in ("intake", "dispatch")
    }
    yield processes
    for process in processes.values():
        if process.process.poll() is None:
            process.kill()


def test_blackbox_run_role_processes_deliver_everything_and_stop_cleanly(
    role_processes: dict[str, BlackboxProcess], env: dict[str, str], reader: ReaderFactory
) -> None:
    """Roles: `blackbox run --role intake` and `blackbox run --role dispatch`, as an operator
    starts them, deliver every message between them, log their role, and exit 0 on
    SIGTERM."""
    settings = Settings.from_env(env)
    target = unique("processes")
    produce(settings.kafka["bootstrap.servers"], settings.intake_topic,
            [envelope(target, {"n": n}, 0.5) for n in range(50)])  # fmt: skip

    records = reader(target).wait_count(50, timeout=60)

    assert len({r.header("blackbox-id") for r in records}) == 50
    assert "intake_started" not in role_processes["dispatch"].output()
    for role, process in role_processes.items():
        assert process.terminate(timeout=20) == 0, process.output()[-2000:]
        assert f'"role": "{role}"' in process.output()
