"""How long `blackbox rebuild` takes per million requests read, beside its floor.

    python -m benchmarks.rebuild [--requests 200000] [--partitions 3]

Requests (four in five plain, one in five under a caller's id, due in an hour) are written
to the intake topic and the intake group's offsets committed at its end, as a service that
accepted them leaves them; Redis is empty, as after a flush. Printed: the time to read the
same records with a bare consumer doing nothing else (the floor), then the rebuild's time
(`blackbox rebuild --yes`, its own process, the defaults: 16 shards), both per million
requests, and how many schedules Redis holds afterwards.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import uuid

import orjson
from confluent_kafka import Consumer, Producer, TopicPartition

from benchmarks.stack import started_broker
from blackbox.dev.servers import RedisServer, free_port, scratch_dir
from blackbox.kafka import clients
from blackbox.settings import Settings
from blackbox.storage.connections import redis_client
from blackbox.storage.keys import Layout
from blackbox.storage.shardcount import DEFAULT_SHARDS
from blackbox.storage.store import pending_counts

CALLER: list[tuple[str, str | bytes | None]] = [("CALLER_SERVICE", b"bench")]


def _write(settings: Settings, count: int, target: str) -> None:
    producer = Producer({**settings.kafka, "linger.ms": 50, "enable.idempotence": True,
                         "partitioner": "murmur2_random"})  # fmt: skip
    for n in range(count):
        request: dict[str, object] = {"topic": target, "message": f"m-{n}", "countdown": 3600}
        if n % 5 == 0:
            request["id"] = f"order-{n}"
            producer.produce(settings.intake_topic, orjson.dumps(request), f"order-{n}".encode(),
                             headers=CALLER)  # fmt: skip
        else:
            producer.produce(settings.intake_topic, orjson.dumps(request))
        if n % 10_000 == 0:
            producer.poll(0)
    assert producer.flush(120) == 0


def _commit_ends(settings: Settings, partitions: int) -> int:
    """Commit the intake group's offsets at the end of every partition; how many records."""
    consumer = Consumer({**settings.kafka, "group.id": settings.group_id})
    try:
        ends = [TopicPartition(settings.intake_topic, p,
                               consumer.get_watermark_offsets(
                                   TopicPartition(settings.intake_topic, p), timeout=10)[1])
                for p in range(partitions)]  # fmt: skip
        consumer.commit(offsets=ends, asynchronous=False)
        return sum(tp.offset for tp in ends)
    finally:
        consumer.close()


def _floor(settings: Settings, partitions: int, records: int) -> float:
    """Seconds a bare consumer takes to read every record once."""
    consumer = Consumer({**settings.kafka, "group.id": f"floor-{uuid.uuid4().hex}",
                         "enable.auto.commit": False})  # fmt: skip
    consumer.assign([TopicPartition(settings.intake_topic, p, 0) for p in range(partitions)])
    started, read = time.perf_counter(), 0
    while read < records:
        read += sum(1 for m in consumer.consume(500, timeout=1.0) if m.error() is None)
    elapsed = time.perf_counter() - started
    consumer.close()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=200_000)
    parser.add_argument("--partitions", type=int, default=3)
    args = parser.parse_args()
    work = scratch_dir("blackbox-bench-")
    redis_server = RedisServer(free_port(), work)
    redis_server.start()
    try:
        with started_broker() as broker:
            env = {"REDIS_URL": redis_server.url, "KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap,
                   "BLACKBOX_LOG_FORMAT": "json"}  # fmt: skip
            settings = Settings.from_env(env)
            clients.ensure_topics(settings.kafka, settings.own_topics, args.partitions)
            target = f"rebuilt-{uuid.uuid4().hex[:8]}"
            clients.ensure_topics(settings.kafka, [target])
            _write(settings, args.requests, target)
            records = _commit_ends(settings, args.partitions)
            floor = _floor(settings, args.partitions, records)
            started = time.perf_counter()
            command = [sys.executable, "-m", "blackbox", "rebuild", "--yes"]
            done = subprocess.run(
                command, env={**os.environ, **env}, capture_output=True, check=False
            )
            rebuilt = time.perf_counter() - started
            assert done.returncode == 0, done.stderr.decode()[-2000:]
            pending = sum(pending_counts(redis_client(redis_server.url),
                                         Layout(settings.namespace, DEFAULT_SHARDS)))  # fmt: skip
    finally:
        redis_server.stop()
    per_million = 1_000_000 / records
    _print("requests read", records)
    _print(
        "floor: a bare consumer reading them, s",
        f"{floor:.2f} ({floor * per_million:.1f} s per million)",
    )
    _print(
        "rebuild (its process, start to exit), s",
        f"{rebuilt:.2f} ({rebuilt * per_million:.1f} s per million)",
    )
    _print("schedules in Redis afterwards", pending)


def _print(name: str, value: object) -> None:
    print(f"{name:>42}: {value}", flush=True)  # noqa: T201 - the benchmark's output


if __name__ == "__main__":
    main()
