"""`FLUSHALL` under a steady stream (issue 50's 1,000/s): `blackbox run` (the defaults) on a
Redis of its own, on Apache Kafka, then the operator's repair.

    python -m benchmarks.redis_loss [--rate 1000] [--seconds 20] [--flush-at 10]
                                    [--action rebuild|reread]

Schedules go to the intake topic (3 partitions) at `rate` a second for `seconds`, half due
within a second (countdowns spread over 0-1 s), half in 30 s; `flush-at` seconds in, Redis is
flushed (`FLUSHALL`) and the stream goes on. From the flush, a watcher notes the instant each
sign of the hold first shows: intake stopped (`blackbox_intake_stopped_partitions`), firing
held (`blackbox_firing_held_for_lost_data`; either is `BlackboxRedisLostData`'s condition),
`/ready` 503 naming `held`, `blackbox_redis_gaps_total{kind="flushed"}`, and the error log
lines `intake_stopped_redis_lost_data` and `firing_held`. Once the stream ended and every
sign showed, the bodies delivered more than once so far are counted: the operator has not
acted yet. Then the operator: the service stopped, `blackbox rebuild --yes` run (timed) and
the service started again; or, with `--action reread`, the service restarted with
BLACKBOX_REDIS_LOSS=reread. Every body is read back from the target topic until all arrived
(or 60 s after the last due time) and Redis holds nothing pending, each copy counted.
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import orjson
import redis
from confluent_kafka import Consumer, Producer, TopicPartition
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.failover import Deliveries
from benchmarks.stack import ServiceProcess, started_broker, wait_for
from blackbox.dev.servers import RedisServer, free_port, scratch_dir
from blackbox.kafka import clients
from blackbox.settings import Settings
from blackbox.storage.keys import Layout
from blackbox.storage.shardcount import DEFAULT_SHARDS
from blackbox.storage.store import pending_counts

PARTITIONS = 3  # of the intake topic
LATE_COUNTDOWN = 30.0  # seconds: the half not due within a second
WATCH_EVERY = 0.02  # seconds between the watcher's looks
HOLD_DEADLINE = 30.0  # seconds after the stream ends for every sign of the hold to show
DELIVERY_DEADLINE = 60.0  # seconds after the last due time
LOG_LINES = {"intake_stopped_redis_lost_data": "log intake_stopped_redis_lost_data (error)",
             "firing_held": "log firing_held (error)"}  # fmt: skip
SIGNS = ("intake stopped", "firing held", "/ready 503 held", "gaps_total{kind=flushed}",
         *LOG_LINES.values())  # fmt: skip


@dataclass
class Stack:
    """The run's Redis, its service's environment and settings, the target topic."""

    redis: RedisServer
    env: dict[str, str]
    settings: Settings
    target: str
    work: Path

    @property
    def layout(self) -> Layout:
        return Layout(self.settings.namespace, DEFAULT_SHARDS)

    def pending(self) -> int:
        with redis.Redis.from_url(self.redis.url) as client:
            return sum(pending_counts(client, self.layout))


@contextmanager
def stack() -> Iterator[Stack]:
    """A Redis and a broker on free ports, the topics created."""
    work = scratch_dir("blackbox-bench-")
    (work / "redis").mkdir()
    server = RedisServer(free_port(), work / "redis")
    server.start()
    try:
        with started_broker() as broker:
            env = {"REDIS_URL": server.url, "KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap,
                   "BLACKBOX_LOG_FORMAT": "json"}  # fmt: skip
            settings = Settings.from_env(env)
            clients.ensure_topics(settings.kafka, settings.own_topics, partitions=PARTITIONS)
            target = f"flushed-{uuid.uuid4().hex[:8]}"
            clients.ensure_topics(settings.kafka, [target])
            yield Stack(server, env, settings, target, work)
    finally:
        server.stop()


@dataclass
class Watch:
    """The instant (time.time()) each sign of the hold first showed on `service`, looked at
    every WATCH_EVERY seconds from `start()` on."""

    service: ServiceProcess
    log: Path
    seen: dict[str, float] = field(default_factory=dict)
    _read_to: int = 0  # how far the log was read
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> None:
        threading.Thread(target=self._run, daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def complete(self) -> bool:
        return len(self.seen) == len(SIGNS)

    def _run(self) -> None:
        while not self._stop.is_set() and not self.complete():
            showing = self._showing()
            now = time.time()  # at the latest: the look took a few ms
            for sign in showing:
                self.seen.setdefault(sign, now)
            for sign, logged in self._logged():  # at the line's own time
                self.seen.setdefault(sign, logged)
            self._stop.wait(WATCH_EVERY)

    def _showing(self) -> list[str]:
        status, body = _ready(self.service.port)
        metrics = _samples(self.service._get("/metrics")[1])
        shown = {
            "intake stopped": metrics.get(("blackbox_intake_stopped_partitions", ""), 0) > 0,
            "firing held": metrics.get(("blackbox_firing_held_for_lost_data", ""), 0) > 0,
            "/ready 503 held": status == 503 and '"held"' in body,
            "gaps_total{kind=flushed}": metrics.get(("blackbox_redis_gaps_total", "flushed"), 0)
            > 0,
        }
        return [sign for sign, showing in shown.items() if showing]

    def _logged(self) -> list[tuple[str, float]]:
        """The signs among the error lines the service logged since the last look, each
        with the instant the line gives."""
        with self.log.open("rb") as log:
            log.seek(self._read_to)
            lines = log.read().split(b"\n")
        self._read_to += sum(len(line) + 1 for line in lines[:-1])  # a partial line: again
        return [found for line in lines[:-1] if (found := _error_event(line))]


def _ready(port: int) -> tuple[int, str]:
    """/ready's status and body, a 503's body too (what it says holds the service)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except (urllib.error.URLError, ConnectionError):
        return 0, ""


def _error_event(line: bytes) -> tuple[str, float] | None:
    """The sign a log line at error level shows, and the line's instant; else None."""
    try:
        entry = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None  # librdkafka's own lines
    if not isinstance(entry, dict) or entry.get("level") != "error":
        return None
    sign = LOG_LINES.get(entry.get("event", ""))
    return None if sign is None else (sign, datetime.fromisoformat(entry["timestamp"]).timestamp())


def _samples(text: str) -> dict[tuple[str, str], float]:
    """/metrics' samples by name and `kind` label (summed over other labels)."""
    found: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = (sample.name, sample.labels.get("kind", ""))
            found[key] = found.get(key, 0.0) + sample.value
    return found


def stream(
    stack: Stack, rate: int, seconds: int, flush_at: int, on_flush: Callable[[], None]
) -> tuple[list[str], float]:
    """Send `rate` schedules a second for `seconds`, flushing Redis `flush_at` seconds in
    (then `on_flush()`); the bodies sent and the instant of the flush."""
    producer = Producer({**stack.settings.kafka, "enable.idempotence": True, "linger.ms": 5})
    rng, bodies, flushed = random.Random(50), [], 0.0
    start = time.monotonic()
    for n in range(rate * seconds):
        lag = start + n / rate - time.monotonic()
        if lag > 0:
            producer.poll(lag)
        if n == rate * flush_at:
            with redis.Redis.from_url(stack.redis.url) as client:
                client.flushall()
            flushed = time.time()
            on_flush()
        body = f"m-{n}"
        countdown = rng.uniform(0, 1) if n % 2 else LATE_COUNTDOWN
        request = {"topic": stack.target, "message": body, "countdown": countdown}
        producer.produce(stack.settings.intake_topic, orjson.dumps(request),
                         headers=[("CALLER_SERVICE", b"bench")])  # fmt: skip
        bodies.append(body)
    assert producer.flush(30) == 0
    return bodies, flushed


def repair(stack: Stack, action: str, log: Path) -> tuple[ServiceProcess, float | None]:
    """The operator's act once the service holds; the service running again and the
    rebuild's seconds (None for a reread)."""
    if action == "reread":
        return ServiceProcess({**stack.env, "BLACKBOX_REDIS_LOSS": "reread"}, "all", log), None
    started = time.perf_counter()
    command = [sys.executable, "-m", "blackbox", "rebuild", "--yes"]
    done = subprocess.run(command, env={**os.environ, **stack.env}, capture_output=True,
                          check=False)  # fmt: skip
    took = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"benchmark stopped: the rebuild failed: {done.stderr.decode()[-2000:]}")
    return ServiceProcess(stack.env, "all", log), took


def _read_to_end(stack: Stack, deliveries: Deliveries) -> None:
    """Wait until the reader has every record the target topic holds."""
    consumer = Consumer({**stack.settings.kafka, "group.id": f"bench-{uuid.uuid4().hex}"})
    try:
        end = consumer.get_watermark_offsets(TopicPartition(stack.target, 0), timeout=10)[1]
    finally:
        consumer.close()
    wait_for(lambda: sum(len(c) for c in list(deliveries.copies.values())) >= end, 30,
             "the reader at the target topic's end")  # fmt: skip


def copies(deliveries: Deliveries) -> int:
    return sum(len(c) - 1 for c in list(deliveries.copies.values()))


def run(rate: int, seconds: int, flush_at: int, action: str) -> dict[str, object]:
    with stack() as s:
        log = s.work / "service.log"
        service = ServiceProcess(s.env, "all", log)
        wait_for(service.ready, 60, "the service ready")
        deliveries = Deliveries(s.settings, s.target)
        watch = Watch(service, log)
        bodies, flushed = stream(s, rate, seconds, flush_at, watch.start)
        last_due = time.monotonic() + LATE_COUNTDOWN
        until = time.monotonic() + HOLD_DEADLINE  # a sign that never shows is a figure
        while not watch.complete() and time.monotonic() < until:
            time.sleep(WATCH_EVERY)
        watch.stop()
        before_repair = copies(deliveries)
        delivered_before = len(deliveries.copies)
        service.stop()
        again, rebuilt = repair(s, action, log)
        restarted = time.time()
        wait_for(again.ready, 60, "the service ready after the repair")
        deadline = last_due + DELIVERY_DEADLINE
        while time.monotonic() < deadline and len(deliveries.copies) < len(bodies):
            time.sleep(0.2)
        all_in = time.time()
        wait_for(lambda: s.pending() == 0, 60, "nothing pending")
        _read_to_end(s, deliveries)
        again.stop()
        deliveries.close()
    return _report(bodies, deliveries, watch, flushed, before_repair, delivered_before, rebuilt,
                   all_in - restarted)  # fmt: skip


def _report(  # noqa: PLR0913, PLR0917 - the run's readings, each named
    bodies: list[str], deliveries: Deliveries, watch: Watch, flushed: float, before_repair: int,
    delivered_before: int, rebuilt: float | None, to_all: float,
) -> dict[str, object]:  # fmt: skip
    found = deliveries.copies
    return {
        "sent": len(bodies),
        "delivered before the operator acted": delivered_before,
        "copies before the operator acted": before_repair,
        **{f"flush to {sign}, s": _after(watch.seen.get(sign), flushed) for sign in SIGNS},
        "rebuild (its process, start to exit), s": None if rebuilt is None else round(rebuilt, 2),
        "restart to the last one delivered, s": round(to_all, 2),
        "delivered": sum(1 for b in bodies if b in found),
        "lost": sum(1 for b in bodies if b not in found),
        "copies": copies(deliveries),
        "bodies under more than one blackbox-id": sum(
            1 for b in bodies if len({i for i, _ in found.get(b, [])}) > 1
        ),
    }


def _after(instant: float | None, flushed: float) -> str:
    return "never" if instant is None else f"{instant - flushed:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=int, default=1000)
    parser.add_argument("--seconds", type=int, default=20)
    parser.add_argument("--flush-at", type=int, default=10)
    parser.add_argument("--action", choices=("rebuild", "reread"), default="rebuild")
    args = parser.parse_args()
    if not 0 < args.flush_at < args.seconds:
        parser.error("--flush-at falls within the stream's --seconds")
    result = run(args.rate, args.seconds, args.flush_at, args.action)
    print(f"{'rate, schedules/s':>48}: {args.rate} for {args.seconds} s, flushed at "  # noqa: T201
          f"{args.flush_at} s, then {args.action}")  # fmt: skip
    for name, value in result.items():
        print(f"{name:>48}: {value}", flush=True)  # noqa: T201 - the benchmark's output


if __name__ == "__main__":
    main()
