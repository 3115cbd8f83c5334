"""A Redis failover to a lagging replica, at the size of the report that found the loss:
`blackbox run` (the defaults) on a primary with an append-only replica behind an endpoint
that follows the primary, on Apache Kafka.

    python -m benchmarks.failover [--before 1000] [--during 1000] [--countdown 30]
                                  [--via endpoint|sentinel] [--sentinels 1]

`before` schedules are stored and replicated; the replication link is then held (a network
partition: tests/relay.py) while `during` more arrive and intake commits them; the primary
is killed (SIGKILL), the link cut, the replica promoted and the endpoint moved to it. Printed:
how many of each group were delivered, duplicates (and whether any came under another
`blackbox-id`), the records intake read again, how long firing stalled after the switch (a
probe due at once, sent every 100 ms from the switch on: the first one delivered), and the
cost of waiting for the replica's acknowledgement (`WAIT 1`) after a write of 100
schedules' size, measured on the same pair before the partition (the service does not
wait: see docs/RELIABILITY.md).

`--via sentinel`: REDIS_URL names a Redis Sentinel (`redis+sentinel://`, tests/sentinel.py:
quorum 1, down after 1 s) watching the pair instead of an endpoint. The same steps, but the
Sentinel promotes the replica itself; the switch is the instant it names the replica as the
primary, and the seconds from the kill to it are printed too. The replica is counted after
the link is cut, while it is still a replica, and the run stops if the Sentinel ever
re-pointed it at the primary past the link (`+fix-slave-config`: tests/replication.py,
WatchedRedis, says how that is avoided). `--sentinels 3`: three Sentinels with quorum 2, all
named in REDIS_URL; two must find the primary down and a majority elect the one that
promotes, as production runs them.
"""

from __future__ import annotations

import argparse
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import orjson
from confluent_kafka import Consumer, Producer, TopicPartition

from benchmarks.stack import ServiceProcess, started_broker, wait_for
from blackbox.dev.servers import scratch_dir
from blackbox.kafka import clients
from blackbox.settings import Settings
from blackbox.storage.connections import redis_client
from blackbox.storage.keys import Layout
from blackbox.storage.shardcount import DEFAULT_SHARDS
from blackbox.storage.store import pending_counts
from tests.replication import ReplicatedRedis, WatchedRedis
from tests.sentinel import SentinelProcess

PARTITIONS = 3
PROBE_EVERY = 0.1  # seconds between stall probes after the switch


def _send(
    producer: Producer, intake: str, target: str, bodies: list[str], countdown: float
) -> None:
    for body in bodies:
        envelope = {"topic": target, "message": body, "countdown": countdown}
        producer.produce(intake, orjson.dumps(envelope), headers=[("CALLER_SERVICE", b"bench")])
        producer.poll(0)
    assert producer.flush(30) == 0


def _committed_to_end(settings: Settings) -> bool:
    consumer = Consumer({**settings.kafka, "group.id": settings.group_id})
    try:
        asked = [TopicPartition(settings.intake_topic, p) for p in range(PARTITIONS)]
        committed = consumer.committed(asked, timeout=10)
        ends = [consumer.get_watermark_offsets(tp, timeout=10)[1] for tp in asked]
        return all(max(c.offset, 0) == end for c, end in zip(committed, ends, strict=True))
    finally:
        consumer.close()


class Deliveries:
    """The target topic read from its start on a thread: per body, each copy's blackbox-id
    and the instant it was read."""

    def __init__(self, settings: Settings, target: str) -> None:
        self.copies: dict[str, list[tuple[str, float]]] = {}
        self._stop = threading.Event()
        self._consumer = Consumer({**settings.kafka, "group.id": f"bench-{uuid.uuid4().hex}",
                                   "auto.offset.reset": "earliest"})  # fmt: skip
        self._consumer.subscribe([target])
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while not self._stop.is_set():
            message = self._consumer.poll(0.1)
            if message is None or message.error() is not None:
                continue
            headers = dict(message.headers() or [])
            body = (message.value() or b"").decode()
            found = headers.get("blackbox-id") or b""
            copy = (found.decode() if isinstance(found, bytes) else found, time.time())
            self.copies.setdefault(str(body), []).append(copy)

    def first(self, body: str) -> float | None:
        found = self.copies.get(body)
        return found[0][1] if found else None

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._consumer.close()


WAIT_ROUNDS = 500


def _percentiles(samples: list[float]) -> str:
    ordered = sorted(samples)
    p50, p99 = ordered[len(ordered) // 2], ordered[int(len(ordered) * 0.99)]
    return f"p50 {p50 * 1000:.2f} ms, p99 {p99 * 1000:.2f} ms"


def wait_cost(pair: ReplicatedRedis) -> tuple[str, str]:
    """A write of 100 schedules' size (100 SETs of 300 bytes, one round trip) alone, and
    the WAIT 1 for the replica's acknowledgement after it."""
    writes, waits = [], []
    with pair.client(pair.primary) as client:
        for round_ in range(WAIT_ROUNDS):
            pipe = client.pipeline(transaction=False)
            for n in range(100):
                pipe.set(f"bench:wait:{round_}:{n}", b"x" * 300, ex=60)
            started = time.perf_counter()
            pipe.execute()
            written = time.perf_counter()
            client.execute_command("WAIT", 1, 1000)
            waits.append(time.perf_counter() - written)
            writes.append(written - started)
    return _percentiles(writes), _percentiles(waits)


@dataclass(frozen=True)
class Switch:
    """The primary replaced: schedules on the replica when it was promoted, seconds the link
    was held, the instant (time.time()) clients could reach the new primary and, under a
    Sentinel, the seconds from the kill to the Sentinel naming it."""

    lagged: int
    held_for: float
    at: float
    named_after: float | None = None


def _switch(pair: ReplicatedRedis, count: Callable[[], int], held_at: float) -> Switch:
    if isinstance(pair, WatchedRedis):
        return _switch_by_sentinel(pair, count, held_at)
    lagged = count()
    pair.fail_over()
    switched = time.time()
    return Switch(lagged, time.monotonic() - held_at, switched)


def _switch_by_sentinel(pair: WatchedRedis, count: Callable[[], int], held_at: float) -> Switch:
    """Kill and cut, count the replica while it is still one (the Sentinel waits 1 s before
    it declares the primary down), then wait for the Sentinel to name it the primary."""
    pair.fail_over()
    killed, held_for = time.time(), time.monotonic() - held_at
    lagged = count()
    with pair.client(pair.replica) as client:
        if client.info("replication")["role"] != "slave":
            raise SystemExit("benchmark stopped: the replica was promoted before it was counted")
    wait_for(pair.promoted, 60, "the Sentinel naming the replica", every=0.02)
    switched = time.time()
    if fixed := pair.events("+fix-slave-config"):
        raise SystemExit(f"benchmark stopped: the Sentinel re-pointed the replica: {fixed}")
    return Switch(lagged, held_for, switched, switched - killed)


def _pair(via: str, work: Path, sentinels: int) -> ReplicatedRedis:
    return WatchedRedis(work, sentinels) if via == "sentinel" else ReplicatedRedis(work)


def run(  # noqa: PLR0913 - the run's sizes and Redis, each by name
    before: int, during: int, countdown: float, work: Path, *, via: str = "endpoint",
    sentinels: int = 1,
) -> dict[str, object]:  # fmt: skip
    with started_broker() as broker, _pair(via, work, sentinels) as pair:
        env = {"REDIS_URL": pair.url, "KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap,
               "BLACKBOX_LOG_FORMAT": "json"}  # fmt: skip
        settings = Settings.from_env(env)
        clients.ensure_topics(settings.kafka, settings.own_topics, partitions=PARTITIONS)
        target = f"failover-{uuid.uuid4().hex[:8]}"
        clients.ensure_topics(settings.kafka, [target])
        service = ServiceProcess(env, "all", work / "service.log")
        wait_for(service.ready, 60, "the service ready")
        deliveries = Deliveries(settings, target)
        producer = Producer({**settings.kafka, "enable.idempotence": True, "linger.ms": 5})
        layout = Layout(settings.namespace, DEFAULT_SHARDS)
        replica = redis_client(f"redis://127.0.0.1:{pair.replica.port}/0")
        write_cost, waited = wait_cost(pair)
        first = [f"before-{n}" for n in range(before)]
        _send(producer, settings.intake_topic, target, first, countdown)
        wait_for(lambda: pending_counts(replica, layout)[0] == before, 60, "replicated")
        pair.partition()
        held_at = time.monotonic()
        second = [f"during-{n}" for n in range(during)]
        _send(producer, settings.intake_topic, target, second, countdown)
        wait_for(lambda: _committed_to_end(settings), 60, "intake committed the lagging ones")
        switch = _switch(pair, lambda: pending_counts(replica, layout)[0], held_at)
        switched = switch.at
        probes: list[str] = []
        while time.time() - switched < 60:
            probe = f"probe-{len(probes)}"
            probes.append(probe)
            _send(producer, settings.intake_topic, target, [probe], 0)
            if any(deliveries.first(p) is not None for p in probes):
                break
            time.sleep(PROBE_EVERY)
        firsts = [t for p in probes if (t := deliveries.first(p)) is not None]
        stall = min(firsts) - switched if firsts else None
        everything = first + second
        deadline = time.monotonic() + countdown + 90  # what has not arrived by then is lost
        while time.monotonic() < deadline and any(deliveries.first(b) is None for b in everything):
            time.sleep(0.5)
        reread = service.metric("blackbox_intake_reread_records_total")
        alive = service.process.poll() is None
        service.stop()
        deliveries.close()
        result = _report(deliveries, first, second, switch, stall, reread, alive)
        result = {**result, **_named(pair, switch)}
        return {**result, "write of 100 schedules": write_cost, "WAIT 1 after it": waited}


def _report(  # noqa: PLR0913, PLR0917 - the run's readings, each named
    deliveries: Deliveries, first: list[str], second: list[str], switch: Switch,
    stall: float | None, reread: float, alive: bool,
) -> dict[str, object]:  # fmt: skip
    copies = deliveries.copies
    ids = Counter(len({i for i, _ in copies.get(b, [])}) for b in first + second)
    return {
        "replicated before the partition": len(first),
        "applied during it (link held s)": f"{len(second)} ({switch.held_for:.1f} s)",
        "on the replica when it was promoted": switch.lagged,
        "delivered of those before": sum(1 for b in first if b in copies),
        "delivered of those during": sum(1 for b in second if b in copies),
        "duplicate copies": sum(len(copies.get(b, [])) - 1 for b in first + second if b in copies),
        "bodies under more than one blackbox-id": sum(n for k, n in ids.items() if k > 1),
        "intake records read again": int(reread),
        "firing stall after the switch, s": None if stall is None else round(stall, 2),
        "service still running": alive,
    }


def _named(pair: ReplicatedRedis, switch: Switch) -> dict[str, object]:
    if switch.named_after is None or not isinstance(pair, WatchedRedis):
        return {}
    down_after = SentinelProcess.down_after_ms / 1000
    watching = f"{len(pair.sentinels)} Sentinel(s), quorum {pair.sentinel.quorum}"
    return {"kill to Sentinel naming the new master, s":
            f"{switch.named_after:.2f} ({watching}, down after {down_after:g} s)"}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=int, default=1000)
    parser.add_argument("--during", type=int, default=1000)
    parser.add_argument("--countdown", type=float, default=30.0)
    where = "how clients reach the primary: an endpoint that moves, or a Sentinel"
    parser.add_argument("--via", choices=("endpoint", "sentinel"), default="endpoint", help=where)
    parser.add_argument(
        "--sentinels",
        type=int,
        default=1,
        help="with --via sentinel: how many watch the pair (quorum: a majority)",
    )
    args = parser.parse_args()
    if args.sentinels < 1 or (args.sentinels > 1 and args.via != "sentinel"):
        parser.error("--sentinels takes 1 or more, and more than 1 only with --via sentinel")
    work = scratch_dir("blackbox-bench-")
    result = run(args.before, args.during, args.countdown, work, via=args.via,
                 sentinels=args.sentinels)  # fmt: skip
    for name, value in result.items():
        print(f"{name:>42}: {value}", flush=True)  # noqa: T201 - the benchmark's output


if __name__ == "__main__":
    main()
