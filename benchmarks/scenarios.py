"""The on-time benchmarks, S1-S4, on the local stack. Each prints a JSON line and a table.

    python -m benchmarks.scenarios            # all four
    python -m benchmarks.scenarios s1 s4      # some

S1 burst: 20,000 messages due at one instant 10 s ahead (beside the firing floor).
S2 steady: 1,000 messages/s for 20 s, countdowns uniform in 2-10 s.
S3 intake: 100,000 messages due in an hour, sent as fast as possible: records/s stored.
S4 capacity: 1,000,000 pending 100-byte messages: Redis bytes per message, claim time
    (written straight into one shard's due set: what the layout costs, not the service).
Lateness is measured by a consumer outside the service (benchmarks.collect).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
import uuid
from collections.abc import Callable

import orjson
import redis
from confluent_kafka import Producer

from benchmarks.collect import (
    Collector,
    CollectorProcess,
    Window,
    new_prober,
    percentile,
    probe,
    summary,
)
from benchmarks.floor import firing_floor, intake_floor
from benchmarks.histograms import between, scrape
from benchmarks.producing import produce_waiting
from benchmarks.stack import (
    Stack,
    broker_name,
    cpu_seconds,
    due_count,
    local_stack,
    redis_cpu_seconds,
    service_process,
    time_storing,
)
from blackbox.clock import now_ms
from blackbox.envelope import CALLER_HEADER
from blackbox.kafka import clients
from blackbox.schedule import Schedule, intake_id
from blackbox.storage.applying import IntakeSlice
from blackbox.storage.keys import Layout
from blackbox.storage.store import RedisStore

Result = dict[str, object]
# The caller every request names, as a service sending to the intake does.
CALLER = b"bench"


def new_producer(stack: Stack) -> Producer:
    return Producer({"bootstrap.servers": stack.broker.bootstrap, "linger.ms": 5,
                     "queue.buffering.max.messages": 1_000_000})  # fmt: skip


def send(  # noqa: PLR0913, PLR0917 - a request's parts
    producer: Producer, intake: str, topic: str, message: object, countdown: float,
    caller: bytes | None = CALLER,
) -> None:  # fmt: skip
    """One request, as a caller's service sends it: with its `CALLER_SERVICE` header
    (None: without it, as the benchmarks sent them until
    November 2026)."""
    value = orjson.dumps({"topic": topic, "message": message, "countdown": countdown})
    produce_waiting(
        producer, intake, value, headers=None if caller is None else [(CALLER_HEADER, caller)]
    )


def warm_up(stack: Stack, producer: Producer) -> None:
    """Wait until the service delivers a probe: its intake has joined and is assigned."""
    probe = f"warmup-{uuid.uuid4().hex[:8]}"
    send(producer, stack.settings.intake_topic, probe, 0, 0)
    producer.flush(10)
    collector = Collector(stack.broker.bootstrap, probe)
    if not collector.collect(1, timeout=60).copies:
        raise SystemExit("the service never delivered the warm-up probe")
    collector.close()


def collector_for(stack: Stack, topic: str, count: int, timeout: float) -> CollectorProcess:
    """A collector process reading `topic` (created first, one partition) from now on."""
    clients.ensure_topics(stack.settings.kafka, [topic])
    return CollectorProcess(stack.broker.bootstrap, topic, count, timeout)


def service_lateness(stack: Stack) -> dict[str, dict[str, float | None]]:
    """The service's own part of the lateness from its metrics: until a message was handed
    to its producer (`send`: tells a late scheduler from a slow broker), and until the
    broker acknowledged it (`ack`: everything but the receiving consumer's fetch)."""
    return {
        name: between(reading) for name, reading in scrape(stack.settings.http_port or 0).items()
    }


def s1_burst(count: int = 20_000, ahead_s: float = 10.0) -> Result:
    with local_stack() as stack:
        with service_process(stack) as process:
            producer = new_producer(stack)
            warm_up(stack, producer)
            target = f"s1-{uuid.uuid4().hex[:8]}"
            collector = collector_for(stack, target, count, ahead_s + 60)
            due = now_ms() + int(ahead_s * 1000)
            for n in range(count):
                send(producer, stack.settings.intake_topic, target, n, (due - now_ms()) / 1000)
            producer.flush(30)
            client = redis.Redis.from_url(stack.redis.url)
            # CPU from the due instant to the last delivery: the firing alone.
            time.sleep(max(0.0, (due - now_ms()) / 1000))
            cpu_due, redis_due = cpu_seconds(process.pid), redis_cpu_seconds(client)
            got = collector.result(timeout=ahead_s + 70)
            cpu = cpu_seconds(process.pid) - cpu_due
            redis_cpu = redis_cpu_seconds(client) - redis_due
            client.close()
            service = service_lateness(stack)
        floor_topic = f"s1-floor-{uuid.uuid4().hex[:8]}"
        clients.ensure_topics(stack.settings.kafka, [floor_topic])
        floor = firing_floor(stack, floor_topic, count, orjson.dumps(count - 1))
    arrivals = [arrived for arrived, _ in got.first_copies()]
    instant = min((d for _, d in got.first_copies()), default=due)
    span_s = (max(arrivals) - min(arrivals)) / 1000 if arrivals else 0
    return {
        "scenario": "S1 burst", "shards": stack.layout.count, "messages": count,
        "delivered": len(got.copies),
        "lost": count - len(got.copies), "duplicated": got.duplicated(),
        "last_after_due_ms": max(arrivals) - instant if arrivals else None,
        "fire_rate_per_s": round(len(arrivals) / span_s) if span_s else None,
        "lateness_ms": summary(got.lateness_ms()),
        "service_send_lateness_ms": service["send"], "service_ack_lateness_ms": service["ack"],
        "service_cpu_us_per_fired": round(cpu / count * 1e6, 1),
        "redis_cpu_us_per_fired": round(redis_cpu / count * 1e6, 1),
        "floor": floor,
        "service_cpu_over_floor": round(cpu / count * 1e6 / floor["cpu_us_per_message"], 2),
    }  # fmt: skip


# On Tansu, S2's messages go to a new target topic every this many seconds of sending: its
# partition fetches cost more the longer the log (past about 8,000 record batches a reader
# polling every few ms stalls it for seconds), which would measure the broker's log, not
# the service. Apache Kafka has no such cost: there S2 sends to one topic.
TANSU_S2_TOPIC_SECONDS = 2
# One message in this many is matched by a probe produced straight to the target topic:
# the broker's own produce-to-consume lateness at this load, the floor under S2's.
S2_PROBE_EVERY = 100


def s2_steady(rate: int = 1000, seconds: int = 20) -> Result:
    count = rate * seconds
    rng = random.Random(2)
    topic_seconds = TANSU_S2_TOPIC_SECONDS if broker_name() == "tansu" else seconds
    with local_stack() as stack, service_process(stack) as process:
        producer = new_producer(stack)
        warm_up(stack, producer)
        client = redis.Redis.from_url(stack.redis.url)
        cpu, redis_cpu = cpu_seconds(process.pid), redis_cpu_seconds(client)
        run = uuid.uuid4().hex[:8]
        targets = [f"s2-{run}-{i}" for i in range(-(-seconds // topic_seconds))]
        clients.ensure_topics(stack.settings.kafka, targets)
        begins = time.time() + 3  # the collector is reading by then
        windows = [Window(t, begins + topic_seconds * i - 1,
                          begins + topic_seconds * (i + 1) + 10 + 5)  # countdowns <= 10 s
                   for i, t in enumerate(targets)]  # fmt: skip
        collector = CollectorProcess.following(stack.broker.bootstrap, windows, seconds + 60)
        prober = new_prober(stack.broker.bootstrap)
        time.sleep(max(0.0, begins - time.time()))
        start = time.monotonic()
        for n in range(count):
            # Pace the load: message n leaves at start + n / rate.
            lag = start + n / rate - time.monotonic()
            if lag > 0:
                producer.poll(lag)
            target = targets[n // (rate * topic_seconds)]
            send(producer, stack.settings.intake_topic, target, n, rng.uniform(2, 10))
            if n % S2_PROBE_EVERY == 0:
                probe(prober, target, n)
        producer.flush(30)
        prober.flush(30)
        got, probes = collector.result(timeout=seconds + 70).without_probes()
        # Intake's and firing's CPU together, from the first send to the last delivery.
        cpu, redis_cpu = cpu_seconds(process.pid) - cpu, redis_cpu_seconds(client) - redis_cpu
        client.close()
        service = service_lateness(stack)
    return {
        "scenario": "S2 steady", "broker": broker_name(), "shards": stack.layout.count,
        "rate_per_s": rate,
        "seconds": seconds, "messages": count,
        "target_topics": len(targets), "delivered": len(got.copies),
        "lost": count - len(got.copies), "duplicated": got.duplicated(),
        "lateness_ms": summary(got.lateness_ms()),
        "own_lateness_ms": summary(got.own_lateness_ms()),
        "service_send_lateness_ms": service["send"], "service_ack_lateness_ms": service["ack"],
        "broker_probe_ms": summary(probes),
        "service_cpu_us_per_message": round(cpu / count * 1e6, 1),
        "redis_cpu_us_per_message": round(redis_cpu / count * 1e6, 1),
    }  # fmt: skip


def s3_intake(count: int = 100_000) -> Result:
    with local_stack() as stack:
        producer = new_producer(stack)
        target = f"s3-{uuid.uuid4().hex[:8]}"
        for n in range(count):
            send(producer, stack.settings.intake_topic, target, n, 3600)
        producer.flush(60)
        client = redis.Redis.from_url(stack.redis.url)
        with service_process(stack) as process:
            storing = time_storing(client, stack.layout, count, process.pid)
            stored = due_count(client, stack.layout)
        client.close()
        elapsed, cpu, redis_cpu = storing.seconds, storing.service_cpu, storing.redis_cpu
        floor = intake_floor(stack, count)
    return {"scenario": "S3 intake", "shards": stack.layout.count, "messages": count,
            "stored": stored,
            "seconds": round(elapsed, 3), "records_per_s": round(count / elapsed),
            "service_cpu_us_per_record": round(cpu / count * 1e6, 1),
            "redis_cpu_us_per_record": round(redis_cpu / count * 1e6, 1),
            "floor": floor,
            "share_of_floor": round(count / elapsed / floor["records_per_s"], 2)}  # fmt: skip


def s4_capacity(count: int = 1_000_000, payload_bytes: int = 100, claims: int = 20) -> Result:
    with local_stack() as stack:
        client = redis.Redis.from_url(stack.redis.url)
        store = RedisStore(client, Layout(stack.settings.namespace), grace_seconds=604800)
        before = int(client.info("memory")["used_memory"])
        now = now_ms()
        _fill(store, count, payload_bytes, due_ms=now + 3_600_000)
        per_message = (int(client.info("memory")["used_memory"]) - before) / count
        timings = _claim_timings(store, claims, payload_bytes)
        client.flushall()
        floor = _layout_floor(client, count, payload_bytes)
        client.close()
    return {
        "scenario": "S4 capacity", "shards": 1, "pending": count, "payload_bytes": payload_bytes,
        "redis_bytes_per_message": round(per_message, 1),
        "redis_bytes_beyond_payload": round(per_message - payload_bytes, 1),
        "design_card_floor_beyond_payload": round(floor - payload_bytes, 1),
        "claim_1000_ms": {"p50": round(percentile(timings, 0.5), 3),
                          "max": round(max(timings), 3)},
    }  # fmt: skip


def _layout_floor(client: redis.Redis, count: int, payload_bytes: int) -> float:
    """Redis bytes per message of the design card's bare layout with the shortest names:
    the raw payload under a 4-6 character id with SET EX, the id in a sorted set. No
    encoding, no attempts or markers: what any store of this shape costs at least."""
    before = int(client.info("memory")["used_memory"])
    value = b"x" * payload_bytes
    for start in range(0, count, 10_000):
        pipe = client.pipeline(transaction=False)
        for n in range(start, min(start + 10_000, count)):
            member = f"{n:x}"
            pipe.set("{b}" + member, value, ex=3600)
            pipe.zadd("{b}:d", {member: n})
        pipe.execute()
    return (int(client.info("memory")["used_memory"]) - before) / count


# What an intake id carries on Apache Kafka: the intake topic's incarnation tag.
_TAG = "EhQ/z1Nx"


def _fill(store: RedisStore, count: int, payload_bytes: int, due_ms: int, start: int = 0) -> None:
    value = b"x" * payload_bytes
    now = now_ms()
    for offset in range(start, start + count, 10_000):
        offsets = range(offset, min(offset + 10_000, start + count))
        items = [(o, Schedule(intake_id("blackbox", 0, o, _TAG), "orders", value, due_ms))
                 for o in offsets]  # fmt: skip
        store.apply([IntakeSlice("blackbox", 0, offsets[-1], items, _TAG)], now)


def _claim_timings(store: RedisStore, claims: int, payload_bytes: int) -> list[float]:
    """Milliseconds one claim of 1,000 due ids takes, with the million still pending."""
    timings = []
    for round_ in range(claims):
        _fill(store, 1000, payload_bytes, due_ms=now_ms() - 1, start=10_000_000 + round_ * 1000)
        started = time.perf_counter()
        claim = store.claim_due(now_ms(), 1000, lease_ms=30_000)
        timings.append((time.perf_counter() - started) * 1000)
        assert len(claim.ids) == 1000
        store.ack(claim.ids, claim.token)
    return timings


SCENARIOS: dict[str, Callable[[], Result]] = {
    "s1": s1_burst, "s2": s2_steady, "s3": s3_intake, "s4": s4_capacity,
}  # fmt: skip


def table(result: Result) -> str:
    rows: list[tuple[str, object]] = []
    for name, value in result.items():
        if isinstance(value, dict):
            rows += [(f"{name} {k}", v) for k, v in value.items()]
        else:
            rows.append((name, value))
    return "\n".join(f"  {name:<36}{value}" for name, value in rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "names", nargs="*", metavar="NAME", help=f"any of {', '.join(SCENARIOS)} (default: all)"
    )
    args = parser.parse_args()
    unknown = set(args.names) - set(SCENARIOS)
    if unknown:
        parser.error(f"unknown scenarios {sorted(unknown)}; choose from {', '.join(SCENARIOS)}")
    for name in args.names or SCENARIOS:
        result = SCENARIOS[name]()
        print(orjson.dumps(result).decode(), flush=True)  # noqa: T201 - a benchmark prints figures
        print(table(result), flush=True)  # noqa: T201
    return 0


if __name__ == "__main__":
    sys.exit(main())
