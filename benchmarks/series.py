"""Recurring series at scale: N series with one-minute periods pending, stored, then fired.

    python -m benchmarks.series                     # 100,000 series, first occurrences spread
                                                    # evenly over one minute
    python -m benchmarks.series --spread 0          # all due at one instant: fire throughput
    python -m benchmarks.series --series 10000      # fewer
    python -m benchmarks.series --one-off           # one-off messages due at the same instants

Series n is `{"id": "s<n>", "every": 60, "start": T + n * spread / N}` (no jitter, the
default missed policy): with `--spread 60` a minute's occurrences fall evenly over the
minute, as N one-minute series do in steady state; with `--spread 0` all N are due at T.
The envelopes wait in the intake topic before the service starts, so storing them is timed
from the first stored to the last (S3's way); T is `--lead` seconds after they are sent.

Figures: Redis bytes per series (INFO used_memory before and after, divided by N; MEMORY
USAGE of one payload and of the due index), the intake rate, and while the first
occurrences fire: occurrences/s from the first arrival to the last, lateness per
occurrence (arrival at a consumer in its own process minus `blackbox-due-ms`), and the
service's and Redis's CPU per occurrence fired (from T to the last arrival, divided by
the service's `blackbox_delivered_total` over that span). Each occurrence also writes a
`fired` event to the events topic. Prints one JSON line, then a table.
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid

import orjson
import redis

from benchmarks.collect import Deliveries, summary
from benchmarks.producing import produce_waiting
from benchmarks.scenarios import collector_for, new_producer, table
from benchmarks.stack import (
    ServiceProcess,
    Stack,
    cpu_seconds,
    local_stack,
    redis_cpu_seconds,
    time_storing,
    wait_for,
)
from blackbox.clock import now_ms
from blackbox.envelope import CALLER_HEADER
from blackbox.schedule import scoped_id
from blackbox.storage.keys import Layout

Result = dict[str, object]
CALLER = b"bench"
PERIOD_S = 60


def envelope(n: int, target: str, start_ms: int, *, one_off: bool) -> dict[str, object]:
    """Series n, or (`one_off`) a one-off message with the same id due at its start."""
    due = {"deliver_at": start_ms / 1000} if one_off else {"every": PERIOD_S,
                                                            "start": start_ms / 1000}  # fmt: skip
    return {"id": f"s{n}", "topic": target, "message": n, **due}


def send_series(  # noqa: PLR0913 - the load's shape, by name
    stack: Stack, target: str, count: int, first_ms: int, spread_s: float, *, one_off: bool
) -> None:
    """N every-minute series to the intake topic, the first due at `first_ms`, the rest
    spread evenly over `spread_s` after it."""
    producer = new_producer(stack)
    for n in range(count):
        start_ms = first_ms + int(n * spread_s * 1000 / count)
        document = envelope(n, target, start_ms, one_off=one_off)
        produce_waiting(producer, stack.settings.intake_topic, orjson.dumps(document),
                        headers=[(CALLER_HEADER, CALLER)])  # fmt: skip
    if producer.flush(60):
        raise SystemExit("the intake topic did not take every series")


def memory_per_series(client: redis.Redis, layout: Layout, count: int, before: int) -> Result:
    """Redis bytes per pending series: all of used_memory, and one payload's and the due
    indexes' share (every shard's) as MEMORY USAGE reads them."""
    used = int(client.info("memory")["used_memory"]) - before
    first = scoped_id(CALLER, "s0")
    sample = layout.keys_of(first).payload(first)
    index = sum(int(client.memory_usage(k.due, samples=0) or 0) for k in layout.shards)
    return {
        "used_memory_per_series": round(used / count, 1),
        "payload_memory_usage": client.memory_usage(sample, samples=0),
        "payload_bytes": client.strlen(sample),
        "due_index_per_series": round(index / count, 1),
    }


def firing_figures(got: Deliveries, first_ms: int) -> Result:
    """Occurrences/s from the first arrival to the last (each series' first occurrence),
    and copies of an occurrence delivered more than once."""
    firsts = got.first_copies()
    arrivals = [arrived for arrived, _ in firsts]
    span_s = (max(arrivals) - min(arrivals)) / 1000 if arrivals else 0
    again = sum(len(c) - len({due for _, due in c}) for c in got.copies.values())
    return {
        "delivered": len(firsts),
        "duplicated": again,
        "first_arrival_after_due_ms": min(arrivals) - first_ms if arrivals else None,
        "last_arrival_after_due_ms": max(arrivals) - first_ms if arrivals else None,
        "fire_rate_per_s": round(len(arrivals) / span_s) if span_s else None,
    }


def run(count: int, spread_s: float, lead_s: float, *, one_off: bool = False) -> Result:
    began = time.monotonic()
    with local_stack() as stack:
        client = redis.Redis.from_url(stack.redis.url)
        target = f"series-{uuid.uuid4().hex[:8]}"
        collector = collector_for(stack, target, count, lead_s + spread_s + 600)
        before = int(client.info("memory")["used_memory"])
        first_ms = (int(now_ms() + lead_s * 1000) // 1000 + 1) * 1000
        send_series(stack, target, count, first_ms, spread_s, one_off=one_off)
        service = ServiceProcess(stack.env, "all", stack.work / "service.log")
        try:
            storing = time_storing(client, stack.layout, count, service.pid)
            if now_ms() >= first_ms:
                raise SystemExit("storing ended after the first occurrence: raise --lead")
            memory = memory_per_series(client, stack.layout, count, before)
            delivered = service.metric("blackbox_delivered_total")  # before any is due
            wait_for(lambda: now_ms() >= first_ms, lead_s, "the first occurrence", every=0.001)
            cpu, redis_cpu = cpu_seconds(service.pid), redis_cpu_seconds(client)
            got = collector.result(timeout=spread_s + 600)
            wait_for(lambda: service.metric("blackbox_delivered_total") - delivered >= count,
                     60, "the service settling every occurrence")  # fmt: skip
            cpu, redis_cpu = cpu_seconds(service.pid) - cpu, redis_cpu_seconds(client) - redis_cpu
            fired = service.metric("blackbox_delivered_total") - delivered
        finally:
            service.stop()
        client.close()
    return {
        "benchmark": "series", "series": count, "one_off": one_off, "period_s": PERIOD_S,
        "spread_s": spread_s,
        "redis_bytes": memory,
        "intake": {"seconds": round(storing.seconds, 3),
                   "series_per_s": round(count / storing.seconds),
                   "service_cpu_us_per_series": round(storing.service_cpu / count * 1e6, 1),
                   "redis_cpu_us_per_series": round(storing.redis_cpu / count * 1e6, 1)},
        "firing": firing_figures(got, first_ms),
        "lateness_ms": summary([arrived - due for arrived, due in got.first_copies()]),
        "firing_cpu": {"occurrences_fired": int(fired),
                       "service_us_per_occurrence": round(cpu / fired * 1e6, 1),
                       "redis_us_per_occurrence": round(redis_cpu / fired * 1e6, 1)},
        "run_seconds": round(time.monotonic() - began),
    }  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--series", type=int, default=100_000)
    parser.add_argument("--spread", type=float, default=60.0,
                        help="seconds the first occurrences span (0: one instant)")  # fmt: skip
    parser.add_argument("--lead", type=float, default=None,
                        help="seconds from sending to the first occurrence "
                             "(default: 20 + 1 per 2,500 series)")  # fmt: skip
    parser.add_argument("--one-off", action="store_true",
                        help="the same instants as one-off messages, to compare")  # fmt: skip
    args = parser.parse_args()
    lead = args.lead if args.lead is not None else 20 + args.series / 2500
    result = run(args.series, args.spread, lead, one_off=args.one_off)
    print(orjson.dumps(result).decode())  # noqa: T201 - a benchmark prints its figures
    print(table(result))  # noqa: T201
    firing = result["firing"]
    assert isinstance(firing, dict)
    return 0 if firing["delivered"] == args.series else 1


if __name__ == "__main__":
    sys.exit(main())
