"""Lateness of delivery: N messages with countdowns spread over a window, measured by a
consumer outside the service from each record's arrival and its `blackbox-due-ms` header.

    python -m benchmarks.lateness --messages 1000 --min-countdown 2 --max-countdown 10

Prints one JSON line, then a table.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
import uuid
from collections.abc import Sequence

import orjson
from confluent_kafka import Consumer, Producer, TopicPartition

from benchmarks.stack import local_stack, service_process
from blackbox.envelope import normalize_headers


def _percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _collect(bootstrap: str, topic: str, count: int, timeout: float) -> dict[str, list[int]]:
    """Read `topic` until `count` distinct ids arrived; lateness in ms per id (every copy)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex}",
                         "fetch.wait.max.ms": 1, "auto.offset.reset": "earliest",
                         "enable.auto.commit": False})  # fmt: skip
    assigned = 0
    seen: dict[str, list[int]] = {}
    deadline = time.monotonic() + timeout
    while len(seen) < count and time.monotonic() < deadline:
        metadata = consumer.list_topics(topic, timeout=2).topics.get(topic)
        if metadata is not None and metadata.error is None and len(metadata.partitions) > assigned:
            new = range(assigned, len(metadata.partitions))
            consumer.incremental_assign([TopicPartition(topic, p, 0) for p in new])
            assigned = len(metadata.partitions)
        # poll() returns as soon as one record is there; consume(n, 0) drains the rest
        # (consume(n, t) would hold every record until n arrived or t passed).
        first = consumer.poll(0.05)
        for m in [first, *consumer.consume(10_000, timeout=0)] if first else []:
            if m.error() is None:
                arrived = time.time_ns() // 1_000_000
                headers = dict(normalize_headers(m.headers()))
                due = int(headers["blackbox-due-ms"] or b"0")
                seen.setdefault((headers["blackbox-id"] or b"").decode(), []).append(arrived - due)
    consumer.close()
    return seen


def _warm_up(producer: Producer, intake: str, bootstrap: str) -> None:
    """Wait until the service delivers a probe: its intake has joined and is assigned."""
    probe = f"warmup-{uuid.uuid4().hex[:8]}"
    producer.produce(intake, orjson.dumps({"topic": probe, "message": 0, "countdown": 0}))
    producer.flush(10)
    if not _collect(bootstrap, probe, 1, timeout=60):
        raise SystemExit("the service never delivered the warm-up probe")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=1000)
    parser.add_argument("--min-countdown", type=float, default=2.0)
    parser.add_argument("--max-countdown", type=float, default=10.0)
    parser.add_argument("--poll-interval", default="1.0", help="BLACKBOX_POLL_INTERVAL")
    args = parser.parse_args()
    with local_stack(BLACKBOX_POLL_INTERVAL=args.poll_interval) as stack, service_process(stack):
        target = f"bench-{uuid.uuid4().hex[:8]}"
        bootstrap = stack.broker.bootstrap
        producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
        _warm_up(producer, stack.settings.intake_topic, bootstrap)
        rng = random.Random(1)
        for n in range(args.messages):
            countdown = rng.uniform(args.min_countdown, args.max_countdown)
            value = orjson.dumps({"topic": target, "message": {"n": n}, "countdown": countdown})
            producer.produce(stack.settings.intake_topic, value)
        producer.flush(30)
        seen = _collect(bootstrap, target, args.messages, timeout=args.max_countdown + 60)
    lateness = [copies[0] for copies in seen.values()]
    result = {
        "benchmark": "lateness",
        "messages": args.messages,
        "countdown_s": [args.min_countdown, args.max_countdown],
        "poll_interval_s": float(args.poll_interval),
        "delivered": len(seen),
        "lost": args.messages - len(seen),
        "duplicated": sum(len(c) - 1 for c in seen.values()),
        "lateness_ms": {
            "p50": _percentile(lateness, 0.5) if lateness else None,
            "p90": _percentile(lateness, 0.9) if lateness else None,
            "p99": _percentile(lateness, 0.99) if lateness else None,
            "max": max(lateness) if lateness else None,
            "mean": round(statistics.fmean(lateness), 1) if lateness else None,
        },
    }
    print(orjson.dumps(result).decode())  # noqa: T201 - a benchmark prints its figures
    print(_table(result))  # noqa: T201
    return 0 if result["lost"] == 0 else 1


def _table(result: dict[str, object]) -> str:
    lateness = result["lateness_ms"]
    assert isinstance(lateness, dict)
    rows = [("messages", result["messages"]), ("delivered", result["delivered"]),
            ("lost", result["lost"]), ("duplicated", result["duplicated"])]  # fmt: skip
    rows += [(f"lateness {k} (ms)", v) for k, v in lateness.items()]
    return "\n".join(f"{name:<22}{value}" for name, value in rows)


if __name__ == "__main__":
    sys.exit(main())
