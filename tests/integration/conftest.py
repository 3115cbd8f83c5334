"""Fixtures starting a real redis-server (or a Redis Cluster) and a real Apache Kafka broker
on free ports.

One broker serves the whole test session (a JVM takes seconds to start); each test is kept
apart by topics, a consumer group and a Redis namespace of its own."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from fastapi.dependencies import models as fastapi_models

from blackbox.dev.cluster import RedisCluster, formed_cluster
from blackbox.dev.servers import KafkaBroker, RedisServer, free_port, start_on_free_ports
from blackbox.kafka import clients
from blackbox.role import Role
from blackbox.service import Service
from blackbox.settings import Settings
from blackbox.storage.keys import Keys
from tests.kafkatools import (
    TopicReader,
    close_client,
    holders,
    open_clients,
    unique,
    wait_until,
)
from tests.process import BlackboxProcess

pytestmark = pytest.mark.integration


@pytest.fixture(scope="session")
def broker(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KafkaBroker]:
    """The session's broker. Before it stops, every Kafka client still open is closed: one
    left running would log a "Connection refused" line per reconnect until the process
    exits (thousands, burying a failing run's report). In a session that passed, one left
    open is an error naming what holds it; after a failure it may be the failed test's
    (its traceback keeps its frames), so it is only closed."""
    server = start_on_free_ports(tmp_path_factory.mktemp("kafka"),
                                 lambda folder: KafkaBroker(free_port(), folder))  # fmt: skip
    yield server
    left = open_clients()
    found = [f"{type(c).__name__} held by {holders(c)}" for c in left]
    for client in left:
        close_client(client)
    server.stop()
    if found and not request.session.testsfailed:
        pytest.fail(f"{len(found)} Kafka clients left open at the end of the session: "
                    + "; ".join(found[:10]))  # fmt: skip


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = start_on_free_ports(tmp_path_factory.mktemp("redis"),
                                 lambda folder: RedisServer(free_port(), folder))  # fmt: skip
    yield server
    server.stop()


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisCluster]:
    """A Redis Cluster of three masters on free ports, started when a test first asks for it
    and stopped at the end of the session."""
    with formed_cluster(3, tmp_path_factory.mktemp("redis-cluster")) as cluster:
        yield cluster


def service_env(redis_url: str, bootstrap: str, **overrides: str) -> dict[str, str]:
    """An environment for one isolated blackbox: its own topics and Redis namespace."""
    env = {
        "REDIS_URL": redis_url,
        "KAFKA_BOOTSTRAP_SERVERS": bootstrap,
        # A replica killed mid-test hands its partitions on after this.
        "KAFKA_CONSUMER_SESSION_TIMEOUT_MS": "6000",
        "KAFKA_CONSUMER_HEARTBEAT_INTERVAL_MS": "500",
        "BLACKBOX_INTAKE_TOPIC": unique("intake"),
        "BLACKBOX_DLQ_TOPIC": unique("dlq"),
        "BLACKBOX_EVENTS_TOPIC": unique("events"),
        "BLACKBOX_GROUP_ID": unique("group"),
        "BLACKBOX_NAMESPACE": unique("ns"),
        "BLACKBOX_POLL_INTERVAL": "0.1",
        "BLACKBOX_LOG_FORMAT": "json",
        "BLACKBOX_HTTP_PORT": "0",
        "BLACKBOX_HEALTH_INTERVAL": "0.5",
    }
    env.update(overrides)
    return env


@pytest.fixture
def broker_bootstrap(broker: KafkaBroker) -> str:
    return broker.bootstrap


# The storage modes a test marked `both_store_modes` runs in: inline without a store topic
# (the default), and index mode: a store topic (kafka/storetopic.py), created compacted as
# create-topics makes it, with Redis keeping references to its records (reference.py).
# Inline mode with a store topic is what test_store_topic.py and the store attacks run.
STORE_MODES = ("no-store", "index")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if metafunc.definition.get_closest_marker("both_store_modes") and (
        "env" in metafunc.fixturenames
    ):
        metafunc.parametrize("store_mode", STORE_MODES)


@pytest.fixture
def store_mode() -> str:
    """The storage mode of a test not marked `both_store_modes`: no store topic."""
    return "no-store"


def with_store_topic(env: dict[str, str]) -> dict[str, str]:
    """`env` with a store topic of its own, created compacted as `create-topics` does."""
    topic = unique("store")
    config = {"bootstrap.servers": env["KAFKA_BOOTSTRAP_SERVERS"]}
    clients.ensure_topics(config, [topic], topic_config={"cleanup.policy": "compact"})
    return {**env, "BLACKBOX_STORE_TOPIC": topic}


@pytest.fixture
def env(redis_server: RedisServer, broker: KafkaBroker, store_mode: str) -> dict[str, str]:
    env = service_env(redis_server.url, broker.bootstrap)
    if store_mode == "no-store":
        return env
    return {**with_store_topic(env), "BLACKBOX_STORAGE_MODE": store_mode}


@pytest.fixture
def redis_client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_server.url)
    yield client
    client.close()


@pytest.fixture
def keys(env: dict[str, str]) -> Keys:
    return Keys(env["BLACKBOX_NAMESPACE"])


ServiceFactory = Callable[..., Service]


@pytest.fixture
def start_service(env: dict[str, str]) -> Iterator[ServiceFactory]:
    """Start in-process services (the topics created first, a store topic compacted); stop
    them all at the end."""
    started: list[Service] = []

    def start(role: Role = Role.ALL, **overrides: str) -> Service:
        settings = Settings.from_env({**env, **overrides})
        store = settings.store_topic  # compacted, or the service refuses it at start
        clients.ensure_topics(settings.kafka, [t for t in settings.own_topics if t != store])
        if store:
            clients.ensure_topics(
                settings.kafka, [store], topic_config={"cleanup.policy": "compact"}
            )
        service = Service(settings, role=role)
        service.start()
        started.append(service)
        return service

    yield start
    for service in started:
        service.stop()
    assert_none_crashed(started)
    started.clear()
    forget_routes()


def forget_routes() -> None:
    """Let stopped services be freed. FastAPI remembers up to 4,096 route callables in
    lru_caches (fastapi/dependencies/models.py), and each holds its service's whole graph,
    Kafka clients included; confluent-kafka frees a client's thread-local key only when the
    client itself is freed, and a process has 1,024 of them: past about a thousand services
    in one session, creating a client failed ("Failed to initialize thread local
    storage"). A service runs once per process in production; tests start hundreds."""
    for value in vars(fastapi_models).values():
        clear = getattr(value, "cache_clear", None)
        if callable(clear):
            clear()


CliRun = Callable[..., tuple[int, str]]


def cli_of(service: Service, env: dict[str, str], token: str, folder: Path) -> CliRun:
    """A runner of `blackbox` commands against `service`'s API as a user's shell runs them
    (its token and address in the environment): `run(name, *args)` is the exit code and
    output of one, its log named `name` in `folder`."""
    assert service.endpoints is not None
    cli_env = {**env, "BLACKBOX_API_TOKEN": token,
               "BLACKBOX_API_URL": f"http://127.0.0.1:{service.endpoints.port}"}  # fmt: skip

    def run(name: str, *args: str) -> tuple[int, str]:
        process = BlackboxProcess(cli_env, folder / f"{name}.log", *args)
        return process.wait(60), process.output()

    return run


def wipe_namespace(client: redis.Redis, namespace: str, *, schedules_only: bool = False) -> int:
    """Delete every key of the namespace, as FLUSHALL or a restore without them would; with
    `schedules_only`, its schedules and watermarks, as a failover to a replica that lagged
    behind them would (the namespace's shard count, heartbeats and clocks, older, stay). How many
    keys went."""
    keys = list(client.scan_iter(match="{" + namespace + "*", count=1000))
    if schedules_only:
        kept = (b":shards", b":procs", b":firers", b":clock")
        keys = [k for k in keys if not k.endswith(kept)]
    if keys:
        client.delete(*keys)
    return len(keys)


def settle(service: Service, timeout: float = 30.0) -> None:
    """Wait until `service`'s Redis namespace holds nothing due or in flight: from then on it
    delivers nothing more, so a topic read to its end holds everything it ever will."""
    wait_until(lambda: service.store.counts() == (0, 0), timeout, "nothing pending")


def assert_none_crashed(services: list[Service]) -> None:
    """Fail the test if a worker thread of any of `services` died (Service._guard saw it)."""
    crashed = [s.settings.group_id for s in services if s.failed]
    if crashed:
        pytest.fail(f"a worker thread crashed in the service(s) of group {crashed}; see the log")


ReaderFactory = Callable[..., TopicReader]


@pytest.fixture
def reader(broker: KafkaBroker) -> Iterator[ReaderFactory]:
    readers: list[TopicReader] = []

    def make(topic: str) -> TopicReader:
        r = TopicReader(broker.bootstrap, topic)
        readers.append(r)
        return r

    yield make
    for r in readers:
        r.close()


@pytest.fixture
def scratch(tmp_path: Path) -> Path:
    return tmp_path
