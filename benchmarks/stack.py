"""A local stack for benchmarks: Redis, a broker and `blackbox run` as separate processes.

The broker is Apache Kafka; BLACKBOX_BENCH_BROKER=tansu runs the same benchmark on the light
Tansu broker instead, for a side-by-side figure.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import redis
from prometheus_client.parser import text_string_to_metric_families

from blackbox.dev.cluster import formed_cluster
from blackbox.dev.servers import (
    KafkaBroker,
    RedisServer,
    TansuBroker,
    free_port,
    scratch_dir,
    start_on_free_ports,
)
from blackbox.kafka import clients
from blackbox.settings import Settings
from blackbox.storage.keys import Layout
from blackbox.storage.shardcount import DEFAULT_SHARDS
from blackbox.storage.store import pending_counts


@dataclass(frozen=True)
class Stack:
    redis: RedisServer
    broker: KafkaBroker | TansuBroker
    env: dict[str, str]
    settings: Settings
    work: Path

    @property
    def layout(self) -> Layout:
        """The shards the service spreads its messages over (a new namespace: the default)."""
        return Layout(self.settings.namespace, self.settings.shards or DEFAULT_SHARDS)


def shards_setting() -> dict[str, str]:
    """BLACKBOX_SHARDS as the benchmark was run with it (unset: the default)."""
    shards = os.environ.get("BLACKBOX_SHARDS")
    return {"BLACKBOX_SHARDS": shards} if shards else {}


@contextmanager
def local_stack(appendfsync: str | None = None, **overrides: str) -> Iterator[Stack]:
    """Start Redis and the broker on free ports, with the intake and DLQ topics created."""
    work = scratch_dir("blackbox-bench-")
    redis = start_on_free_ports(
        work / "redis", lambda folder: RedisServer(free_port(), folder, appendfsync=appendfsync)
    )
    broker = start_on_free_ports(work, new_broker)
    env = {
        "REDIS_URL": redis.url,
        "KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap,
        "KAFKA_CONSUMER_SESSION_TIMEOUT_MS": "6000",  # a killed replica's partitions move on
        "BLACKBOX_LOG_FORMAT": "json",
        "BLACKBOX_LOG_LEVEL": "warning",
        "BLACKBOX_HTTP_PORT": str(free_port()),  # known ahead: benchmarks read /metrics
        # The settings a user gets; BLACKBOX_SHARDS set for the benchmark is passed on.
        **shards_setting(),
        **overrides,
    }
    settings = Settings.from_env(env)
    if settings.store_topic:  # compacted, as create-topics makes it
        clients.ensure_topics(settings.kafka, [settings.store_topic],
                              topic_config={"cleanup.policy": "compact"})  # fmt: skip
    clients.ensure_topics(settings.kafka, settings.own_topics)
    try:
        yield Stack(redis, broker, env, settings, work)
    finally:
        broker.stop()
        redis.stop()


def broker_name() -> str:
    """The broker benchmarks run on: "kafka" (Apache Kafka) unless BLACKBOX_BENCH_BROKER says."""
    name = os.environ.get("BLACKBOX_BENCH_BROKER", "kafka")
    if name not in ("kafka", "tansu"):
        raise SystemExit(f"BLACKBOX_BENCH_BROKER={name!r}: choose kafka or tansu")
    return name


def new_broker(work: Path) -> KafkaBroker | TansuBroker:
    if broker_name() == "tansu":
        return TansuBroker(free_port(), work / "tansu.log")
    return kafka_broker(work)


def kafka_broker(work: Path) -> KafkaBroker:
    return KafkaBroker(free_port(), work / "kafka", heap="1g")


def spawn_service(env: dict[str, str], log_path: Path, *args: str) -> subprocess.Popen[bytes]:
    """`blackbox run ARGS` in its own process with `env`, its output appended to `log_path`."""
    with log_path.open("ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "blackbox", "run", *args],
            # Unbuffered: a process killed with SIGKILL keeps its last lines in the log.
            env={**os.environ, **env, "PYTHONUNBUFFERED": "1"},
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def start_service(stack: Stack) -> subprocess.Popen[bytes]:
    """`blackbox run` in its own process, its output appended to service.log."""
    return spawn_service(stack.env, stack.work / "service.log")


def wait_for(condition: Callable[[], bool], timeout: float, what: str, every: float = 0.1) -> None:
    """Poll `condition` every `every` seconds; stop the benchmark at the deadline."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"benchmark stopped: {what} not within {timeout} s")
        time.sleep(every)


@contextmanager
def service_process(stack: Stack) -> Iterator[subprocess.Popen[bytes]]:
    """`blackbox run` in its own process, stopped with SIGTERM at the end."""
    process = start_service(stack)
    try:
        yield process
    finally:
        process.terminate()
        process.wait(15)


def cpu_seconds(pid: int) -> float:
    """User and system CPU time a process has used so far (all its threads)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def thread_cpu_seconds(pid: int) -> dict[str, float]:
    """CPU time a process's threads have used so far, by thread name: librdkafka names its
    own ("rdk:main", "rdk:broker1", ...; brokers summed as "rdk:broker"), Python's threads
    keep the process's name. Threads that ended are left out."""
    used: dict[str, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name, fields = (task / "stat").read_text().split("(", 1)[1].rsplit(")", 1)
        except OSError:
            continue
        if name.startswith("rdk:broker"):
            name = "rdk:broker"
        ticks = int(fields.split()[11]) + int(fields.split()[12])
        used[name] = used.get(name, 0.0) + ticks / os.sysconf("SC_CLK_TCK")
    return used


@dataclass(frozen=True)
class Storing:
    """How long a service took to store a backlog, from its first record stored to its
    last, and the CPU it and Redis spent meanwhile."""

    seconds: float
    service_cpu: float
    redis_cpu: float


def due_count(client: redis.Redis, layout: Layout) -> int:
    """How many ids are due over every shard of `layout`."""
    return pending_counts(client, layout)[0]


def time_storing(client: redis.Redis, layout: Layout, count: int, pid: int) -> Storing:
    """Wait (polling) until `count` ids are due in `layout`'s shards, timed from the first."""
    while due_count(client, layout) == 0:
        time.sleep(0.001)
    first, cpu_first, redis_first = time.monotonic(), cpu_seconds(pid), redis_cpu_seconds(client)
    while due_count(client, layout) < count:
        time.sleep(0.005)
    return Storing(time.monotonic() - first, cpu_seconds(pid) - cpu_first,
                   redis_cpu_seconds(client) - redis_first)  # fmt: skip


def redis_cpu_seconds(client: redis.Redis) -> float:
    """CPU time the Redis server has used so far (its polling by the benchmark included)."""
    cpu = client.info("cpu")
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


@contextmanager
def started_broker() -> Iterator[KafkaBroker]:
    """An Apache Kafka broker on a free port, for benchmarks that start their own services."""
    broker = start_on_free_ports(scratch_dir("blackbox-bench-"), kafka_broker)
    try:
        yield broker
    finally:
        broker.stop()


CLUSTER_MASTERS = 3


@contextmanager
def redis_for(kind: str) -> Iterator[str]:
    """A Redis of `kind` on free ports, its REDIS_URL: "single" (one redis-server) or
    "cluster" (a Redis Cluster of three masters, `redis+cluster://`)."""
    work = scratch_dir("blackbox-bench-")
    if kind == "cluster":
        with formed_cluster(CLUSTER_MASTERS, work) as cluster:
            yield cluster.url
        return
    server = RedisServer(free_port(), work)
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


class ServiceProcess:
    """`blackbox run --role ROLE` in its own process with an HTTP port of its own; its output
    appended to `log`."""

    def __init__(self, env: dict[str, str], role: str, log: Path) -> None:
        self.port = free_port()
        own = {**env, "BLACKBOX_HTTP_PORT": str(self.port)}
        self.process = spawn_service(own, log, "--role", role)

    @property
    def pid(self) -> int:
        return self.process.pid

    def _get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as r:
                return r.status, r.read().decode()
        except (urllib.error.URLError, ConnectionError) as e:
            return getattr(e, "code", 0), ""

    def ready(self) -> bool:
        if self.process.poll() is not None:
            raise SystemExit(f"blackbox run exited with {self.process.returncode}; see its log")
        return self._get("/ready")[0] == 200

    def metric(self, name: str) -> float:
        """The sum of a metric's samples named `name` on the process's /metrics."""
        _, text = self._get("/metrics")
        return sum(s.value for f in text_string_to_metric_families(text)
                   for s in f.samples if s.name == name)  # fmt: skip

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@contextmanager
def service_processes(
    env: dict[str, str], count: int, role: str, ready_within: float = 60
) -> Iterator[list[ServiceProcess]]:
    """`count` service processes of one role, once every one is ready; stopped at the end."""
    log = scratch_dir("blackbox-bench-") / "service.log"
    with ExitStack() as stack:
        processes = [ServiceProcess(env, role, log) for _ in range(count)]
        for process in processes:
            stack.callback(process.stop)
        wait_for(lambda: all(p.ready() for p in processes), ready_within, "every process ready")
        yield processes
