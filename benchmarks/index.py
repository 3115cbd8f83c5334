"""Index mode (BLACKBOX_STORAGE_MODE=index) beside inline mode, both with the store topic:
Redis memory per pending schedule, and a burst fired from references read back by a
process that never wrote them.

    python -m benchmarks.index [--pending 100000] [--bytes 100 4096] [--burst 20000]
    python -m benchmarks.index --pending 10000000 --burst 0 --bytes 100 --modes index

For each message size, inline then index (each on a stack of its own, the defaults
otherwise): `--pending` schedules with ids of 25 characters due in a day, and `--burst`
due at one instant, sent shuffled together so that the burst's records lie scattered over
the store topic. Printed per run: Redis's used memory per schedule stored (its keys, sets
and payloads: `INFO memory` before and after), the store topic's bytes on disk per schedule;
then the service is restarted before the burst falls due (its cache empty: in index mode
every record is read back from the store topic) and the last delivery's time after due is
printed with the service's CPU per message from the due instant to the last delivery.
With `--burst 0`, memory and disk only (no restart, no burst).
"""

from __future__ import annotations

import argparse
import random
import time
import uuid
from pathlib import Path
from typing import Any

import orjson
import redis
from confluent_kafka import Producer

from benchmarks.collect import CollectorProcess
from benchmarks.producing import produce_waiting
from benchmarks.stack import Stack, cpu_seconds, local_stack, spawn_service, wait_for
from blackbox.envelope import CALLER_HEADER
from blackbox.kafka import clients
from blackbox.storage.store import pending_counts

STORE = "blackbox.store"
CALLER = b"bench"
# The slowest rate of storing a run waits for (intake stores 16,000-21,000/s on this machine).
STORED_PER_S = 2000
MODES = {"inline": {"BLACKBOX_STORE_TOPIC": STORE},
         "index": {"BLACKBOX_STORE_TOPIC": STORE, "BLACKBOX_STORAGE_MODE": "index"}}  # fmt: skip


def _send(stack: Stack, target: str, load: tuple[int, int, int], due: float) -> None:
    """`load`: (pending, burst, message bytes)."""
    pending, burst, size = load
    producer = Producer({**stack.settings.kafka, "linger.ms": 20,
                         "queue.buffering.max.messages": 1_000_000})  # fmt: skip
    rng = random.Random(size)
    filler = "x" * max(0, size - 12)
    kinds = [False] * pending + [True] * burst
    rng.shuffle(kinds)
    for n, in_burst in enumerate(kinds):
        countdown = due - time.time() if in_burst else 86_400.0
        document = {"id": f"{n:025d}", "topic": target, "message": f"{n:011d}:{filler}",
                    "countdown": countdown}  # fmt: skip
        produce_waiting(producer, stack.settings.intake_topic, orjson.dumps(document),
                        headers=[(CALLER_HEADER, CALLER)])  # fmt: skip
        producer.poll(0)
    assert producer.flush(120) == 0


def _disk_bytes(stack: Stack, topic: str) -> int:
    data = Path(stack.work) / "kafka" / "kafka-data"
    return sum(f.stat().st_size for d in data.glob(f"{topic}-*") for f in d.glob("*.log"))


def one_run(mode: str, pending: int, burst: int, size: int, cache_mb: str = "") -> dict[str, Any]:
    total = pending + burst
    cache = {"BLACKBOX_STORE_CACHE_MB": cache_mb} if cache_mb and mode == "index" else {}
    with local_stack(**MODES[mode], **cache) as stack:
        client = redis.Redis.from_url(stack.redis.url)
        target = f"index-{uuid.uuid4().hex[:8]}"
        clients.ensure_topics(stack.settings.kafka, [target])
        service = spawn_service(stack.env, stack.work / "service.log")
        try:
            wait_for(lambda: client.exists(stack.layout.shards[0].clock) == 1, 60, "started")
            before = int(client.info("memory")["used_memory"])
            due = time.time() + 30 + total / 4000  # the burst's, after all is stored
            started = time.monotonic()
            _send(stack, target, (pending, burst, size), due)
            wait_for(lambda: sum(pending_counts(client, stack.layout)) >= total,
                     max(600, total / STORED_PER_S), "every schedule stored",
                     every=0.5)  # fmt: skip
            stored_s = time.monotonic() - started
            used = int(client.info("memory")["used_memory"]) - before
            service.terminate()
            service.wait(30)
            if not burst:  # memory and disk only
                disk = _disk_bytes(stack, STORE)
                return _figures(mode, cache, size, total, stored_s=stored_s, used=used, disk=disk)
            if time.time() > due - 5:
                raise SystemExit("benchmark stopped: storing outlasted the burst's lead")
            collector = CollectorProcess(
                stack.broker.bootstrap, target, burst, due - time.time() + 120
            )
            service = spawn_service(stack.env, stack.work / "service.log")  # its cache empty
            wait_for(lambda: time.time() >= due, due - time.time() + 5, "the due instant")
            cpu_at_due = cpu_seconds(service.pid)
            got = collector.result(timeout=180)
            cpu = cpu_seconds(service.pid) - cpu_at_due
            disk = _disk_bytes(stack, STORE)
        finally:
            service.terminate()
            service.wait(30)
            client.close()
    last = max((c[0][0] - c[0][1] for c in got.copies.values()), default=None)
    return {**_figures(mode, cache, size, total, stored_s=stored_s, used=used, disk=disk),
            "burst": burst, "burst_delivered": len(got.copies),
            "burst_duplicated": got.duplicated(), "burst_last_after_due_ms": last,
            "burst_service_cpu_us_per_message": round(cpu / burst * 1e6, 1)}  # fmt: skip


def _figures(  # noqa: PLR0913 - one run's figures, each named
    mode: str, cache: dict[str, str], size: int, total: int, *, stored_s: float, used: int,
    disk: int,
) -> dict[str, Any]:  # fmt: skip
    return {"mode": mode, **cache, "message_bytes": size, "pending": total,
            "stored_in_s": round(stored_s, 1),
            "redis_bytes_per_pending": round(used / total, 1),
            "store_disk_bytes_per_pending": round(disk / total, 1)}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pending", type=int, default=100_000)
    parser.add_argument("--burst", type=int, default=20_000)
    parser.add_argument("--bytes", type=int, nargs="+", default=[100, 4096])
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    parser.add_argument("--cache-mb", default="", help="index mode's BLACKBOX_STORE_CACHE_MB")
    args = parser.parse_args()
    print(f"# python -m benchmarks.index --pending {args.pending} --burst {args.burst} "  # noqa: T201
          f"--bytes {' '.join(map(str, args.bytes))} --modes {' '.join(args.modes)}"
          + (f" --cache-mb {args.cache_mb}" if args.cache_mb else ""))  # fmt: skip
    for size in args.bytes:
        for mode in args.modes:
            result = one_run(mode, args.pending, args.burst, size, args.cache_mb)
            print(orjson.dumps(result).decode(), flush=True)  # noqa: T201
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
