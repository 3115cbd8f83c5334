"""A local stack for benchmarks: Redis, a broker and `blackbox run` as separate processes.

The broker is Apache Kafka; BLACKBOX_BENCH_BROKER=tansu runs the same benchmark on the light
Tansu broker instead, for a side-by-side figure.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import redis

from blackbox import kafka
from blackbox.localstack import KafkaBroker, RedisServer, TansuBroker, free_port, scratch_dir
from blackbox.settings import Settings


@dataclass(frozen=True)
class Stack:
    redis: RedisServer
    broker: KafkaBroker | TansuBroker
    env: dict[str, str]
    settings: Settings
    work: Path


@contextmanager
def local_stack(appendfsync: str | None = None, **overrides: str) -> Iterator[Stack]:
    """Start Redis and the broker on free ports, with the intake and DLQ topics created."""
    work = scratch_dir("blackbox-bench-")
    redis = RedisServer(free_port(), work, appendfsync=appendfsync)
    broker = new_broker(work)
    redis.start()
    broker.start()
    env = {
        "REDIS_URL": redis.url,
        "KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap,
        "KAFKA_CONSUMER_SESSION_TIMEOUT_MS": "6000",  # a killed replica's partitions move on
        "BLACKBOX_LOG_FORMAT": "json",
        "BLACKBOX_LOG_LEVEL": "warning",
        "BLACKBOX_HTTP_PORT": str(free_port()),  # known ahead: benchmarks read /metrics
        **overrides,
    }
    settings = Settings.from_env(env)
    kafka.ensure_topics(settings.kafka, settings.own_topics)
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
    return KafkaBroker(free_port(), work / "kafka", heap="1g")


def start_service(stack: Stack) -> subprocess.Popen[bytes]:
    """`blackbox run` in its own process, its output appended to service.log."""
    with (stack.work / "service.log").open("ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "blackbox", "run"],
            # Unbuffered: a process killed with SIGKILL keeps its last lines in the log.
            env={**os.environ, **stack.env, "PYTHONUNBUFFERED": "1"},
            stdout=log,
            stderr=subprocess.STDOUT,
        )


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


def redis_cpu_seconds(client: redis.Redis) -> float:
    """CPU time the Redis server has used so far (its polling by the benchmark included)."""
    cpu = client.info("cpu")
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])
