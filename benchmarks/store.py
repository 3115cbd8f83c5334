"""The store topic (BLACKBOX_STORE_TOPIC): Kafka disk against what is pending, and the
rebuild from the store beside the rebuild from every intake record.

    python -m benchmarks.store [--fired 100000] [--pending 10000] [--bytes 300]

One stack, one `blackbox run` with a store topic, the defaults otherwise. It sends
`--pending` schedules due in an hour and `--fired` due within 1-10 s (messages of
`--bytes`), waits until the latter were delivered, then lets the broker compact the store
(the store is created with 1 MB segments and a 1 s `delete.retention.ms`, so compaction
shows within the run; the default keeps tombstones a day). Printed: the bytes each topic
keeps on disk and the records the store holds after compaction, per pending schedule; then,
with the service stopped and Redis flushed, `blackbox rebuild --yes` from the store, and
again with the store setting removed (every intake record read), each timed, with what
Redis holds afterwards.
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import orjson
import redis
from confluent_kafka import Producer

from benchmarks.producing import produce_waiting
from benchmarks.stack import Stack, local_stack, start_service, wait_for
from blackbox.kafka import clients, readback
from blackbox.storage.store import pending_counts

STORE = "blackbox.store"
# Compaction within the run: small segments, tombstones dropped a second after cleaning.
STORE_CONFIG = {"cleanup.policy": "compact", "segment.bytes": str(1024 * 1024),
                "min.cleanable.dirty.ratio": "0.001", "delete.retention.ms": "1000",
                "segment.ms": "5000"}  # fmt: skip


def _send(stack: Stack, target: str, fired: int, pending: int, size: int) -> None:
    producer = Producer({**stack.settings.kafka, "linger.ms": 20})
    rng = random.Random(7)
    filler = "x" * max(0, size - 60)
    requests = [(3600.0, n) for n in range(pending)] + [
        (rng.uniform(1, 10), pending + n) for n in range(fired)
    ]
    rng.shuffle(requests)
    for countdown, n in requests:
        document = {"topic": target, "message": f"{n}:{filler}", "countdown": countdown}
        produce_waiting(producer, stack.settings.intake_topic, orjson.dumps(document))
        producer.poll(0)
    assert producer.flush(120) == 0


def _disk_bytes(stack: Stack, topic: str) -> int:
    """Bytes of the log segments the broker keeps for `topic`'s partitions (their indexes,
    10 MB preallocated per active segment, and segments waiting for deletion left out)."""
    data = Path(stack.work) / "kafka" / "kafka-data"
    return sum(f.stat().st_size for d in data.glob(f"{topic}-*") for f in d.glob("*.log"))


def _store_records(stack: Stack) -> dict[str, int]:
    """The records the store topic holds now: versions and tombstones."""
    bounds = readback.extents_of(stack.settings.kafka, [STORE])
    found = {"versions": 0, "tombstones": 0}
    for message, _ in readback.records(stack.settings.kafka, bounds):
        found["tombstones" if message.value() is None else "versions"] += 1
    return found


def _delivered(stack: Stack, target: str) -> int:
    bounds = readback.extents_of(stack.settings.kafka, [target])
    return sum(e.high for e in bounds.values())


def _roll(stack: Stack) -> None:
    """A tombstone of no schedule: the store's active segment rolls once it is old enough
    (compaction never touches the active segment)."""
    producer = Producer(dict(stack.settings.kafka))
    producer.produce(STORE, None, b"benchmark/roll")
    producer.flush(10)


def _rebuild(stack: Stack, store: bool) -> dict[str, float]:
    client = redis.Redis.from_url(stack.redis.url)
    client.flushall()
    env = {**stack.env, "BLACKBOX_STORE_TOPIC": STORE if store else ""}
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "blackbox", "rebuild", "--yes"], env=env,
                          capture_output=True, check=False)  # fmt: skip
    elapsed = time.perf_counter() - started
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    due, flying = pending_counts(client, stack.layout)
    client.close()
    return {"seconds": round(elapsed, 2), "pending_after": due + flying}


def _fire_and_compact(
    stack: Stack, target: str, args: argparse.Namespace
) -> tuple[redis.Redis, tuple[int, dict[str, object], float]]:
    """Send, wait for the fired ones, then for compaction: Redis's memory when only the
    pending were left, the store before compaction, and how long compaction took."""
    client = redis.Redis.from_url(stack.redis.url)
    _send(stack, target, args.fired, args.pending, args.bytes)
    wait_for(lambda: _delivered(stack, target) >= args.fired, 600, "the fired delivered")
    wait_for(lambda: sum(pending_counts(client, stack.layout)) == args.pending, 60,
             "only the pending left")  # fmt: skip
    settled = time.perf_counter()
    memory = int(client.info("memory")["used_memory"])
    before: dict[str, object] = {"store": _disk_bytes(stack, STORE),
                                 "records": _store_records(stack)}  # fmt: skip

    def compacted() -> bool:  # only the pending ids' versions left (and the mark)
        _roll(stack)
        return bool(_store_records(stack)["versions"] <= args.pending + 1)

    wait_for(compacted, 600, "the store compacted", every=5.0)
    compacted_s = round(time.perf_counter() - settled, 1)
    time.sleep(30)  # tombstones go at a later cleaning, delete.retention.ms after the first
    _roll(stack)
    time.sleep(20)
    return client, (memory, before, compacted_s)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--fired", type=int, default=100_000)
    parser.add_argument("--pending", type=int, default=10_000)
    parser.add_argument("--bytes", type=int, default=300)
    args = parser.parse_args()
    os.environ.setdefault("BLACKBOX_LOG_LEVEL", "warning")
    with local_stack(BLACKBOX_STORE_TOPIC="") as stack:
        clients.ensure_topics(stack.settings.kafka, [STORE], topic_config=STORE_CONFIG)
        stack.env["BLACKBOX_STORE_TOPIC"] = STORE
        target = "store-bench-target"
        clients.ensure_topics(stack.settings.kafka, [target])
        service = start_service(stack)
        try:
            client, measured = _fire_and_compact(stack, target, args)
        finally:  # a benchmark stopped half-way leaves no service behind
            service.terminate()
            service.wait(30)
        memory, before, compacted_s = measured
        figures = {
            "fired": args.fired,
            "pending": args.pending,
            "message_bytes": args.bytes,
            "store_before_compaction": before,
            "store_bytes": _disk_bytes(stack, STORE),
            "store_records": _store_records(stack),
            "compacted_within_s": compacted_s,
            "intake_bytes": _disk_bytes(stack, stack.settings.intake_topic),
            "redis_used_memory": memory,
        }
        figures["store_bytes_per_pending"] = round(figures["store_bytes"] / args.pending, 1)
        figures["intake_bytes_per_pending"] = round(figures["intake_bytes"] / args.pending, 1)
        client.close()
        figures["rebuild_from_store"] = _rebuild(stack, store=True)
        figures["rebuild_from_intake"] = _rebuild(stack, store=False)
        print(orjson.dumps(figures, option=orjson.OPT_INDENT_2).decode())  # noqa: T201


if __name__ == "__main__":
    main()
