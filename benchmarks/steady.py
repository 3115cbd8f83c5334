"""A steady stream at several rates: CPU per message of the service and of the broker, and
lateness, beside a plain relay (the floor) and, optionally, another checkout of blackbox.

    python -m benchmarks.steady                                  # 100, 1,000, 10,000/s
    python -m benchmarks.steady --rates 1000 --rounds 3          # alternated, 3 rounds
    python -m benchmarks.steady --rates 1000 --against /tmp/v010 # beside another release
    python -m benchmarks.steady --rates 1000 --burst 20000        # and 20,000 due at once
    python -m benchmarks.steady --rates 1000 --served             # and the broker's requests

Each run starts a fresh stack (Redis, Apache Kafka), waits until its subject is ready,
measures every process's CPU over an idle window, then sends `rate` messages a second for
`--seconds` (countdowns uniform in 2-10 s, as S2) and reads every delivery from outside.
Subjects, alternated run by run so the machine's drift falls on all alike:

- `service`: `blackbox run` of this checkout, on the defaults;
- `uncoalesced`: the same with a wake of firing at each due instant
  (BLACKBOX_FIRE_COALESCE_MS=0, as before December 2026);
- `oneshard`: the same on one shard (BLACKBOX_SHARDS=1) rather than the default 16;
- `anonymous`: the same, sent requests without the `CALLER_SERVICE` header (as every
  subject was until November 2026; the others send it, as a caller's service does);
- `relay`: the floor, a plain Kafka relay that consumes the intake topic and produces each
  record's message to its target at once, no Redis, with the service's client settings;
- `against`: `blackbox run` of the checkout `--against` names (a previous release);
- `store`: `blackbox run` of this checkout with a store topic (BLACKBOX_STORE_TOPIC);
- `index`: the same in index mode (BLACKBOX_STORAGE_MODE=index);
- `steps`: `blackbox run` of this checkout with its steps timed (`benchmarks.steps`).

With `--served`, the broker's own request metrics give what it served per message over
the same span (`broker_served_per_message`: requests by type, all clients', the load
generator's and the collector's included, and bytes in and out; `benchmarks.brokerrequests`
attaches to the broker's JVM for them, so leave it off when comparing the broker's CPU).

Figures per run, from the first record sent to the last delivered: CPU per message of the
subject, of the broker and of Redis, each net of what it spends idle over the same span
(startup and idle left out, as a capacity model plans), and raw; lateness at the consumer
(arrival - due; for the relay, arrival - the intake record's create time) and the
subject's own part (the delivered record's create time - due).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import redis
from confluent_kafka import Consumer, Producer

from benchmarks import brokerrequests, steps
from benchmarks.collect import CollectorProcess, Window, summary
from benchmarks.scenarios import CALLER, new_producer, send, warm_up
from benchmarks.stack import Stack, cpu_seconds, local_stack, redis_cpu_seconds, thread_cpu_seconds
from blackbox.kafka import clients

Result = dict[str, Any]
IDLE_SECONDS = 3.0
COUNTDOWNS_S = (2.0, 10.0)
RELAY_GROUP = "bench-relay"
# The settings each subject adds to the defaults.
SUBJECT_SETTINGS = {
    "uncoalesced": {"BLACKBOX_FIRE_COALESCE_MS": "0"},
    "oneshard": {"BLACKBOX_SHARDS": "1"},
    "store": {"BLACKBOX_STORE_TOPIC": "blackbox.store"},
    "index": {"BLACKBOX_STORE_TOPIC": "blackbox.store", "BLACKBOX_STORAGE_MODE": "index"},
}


@dataclass(frozen=True)
class Meters:
    """CPU seconds used so far by the subject, the broker and Redis."""

    subject: float
    broker: float
    redis: float
    at: float  # time.monotonic()

    def since(self, start: Meters) -> dict[str, float]:
        return {"subject": self.subject - start.subject, "broker": self.broker - start.broker,
                "redis": self.redis - start.redis, "span": self.at - start.at}  # fmt: skip


def meters(stack: Stack, pid: int, client: redis.Redis) -> Meters:
    return Meters(cpu_seconds(pid), cpu_seconds(_broker_pid(stack)), redis_cpu_seconds(client),
                  time.monotonic())  # fmt: skip


def _served(stack: Stack, wanted: bool) -> dict[str, int] | None:
    """What the broker served so far, when asked for (`--served`)."""
    return brokerrequests.counts(_broker_pid(stack)) if wanted else None


def _broker_pid(stack: Stack) -> int:
    broker = stack.broker.process
    assert broker is not None
    return broker.pid


def relay(bootstrap: str, intake: str) -> None:
    """The floor: consume the intake topic, produce each record's message to its target
    at once (no Redis, nothing held), with the client settings the service uses."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": RELAY_GROUP,
                         "auto.offset.reset": "earliest", "fetch.wait.max.ms": 100,
                         "enable.auto.offset.store": False})  # fmt: skip
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "acks": "all",
                         "enable.idempotence": True})  # fmt: skip
    consumer.subscribe([intake])
    try:
        while True:
            first = consumer.poll(0.5)
            if first is None:
                continue
            for record in [first, *consumer.consume(499, timeout=0)]:
                if record.error() is not None:
                    continue
                request = orjson.loads(record.value() or b"{}")
                stamp = str(record.timestamp()[1]).encode()
                ident = f"{record.partition()}-{record.offset()}".encode()
                headers: list[tuple[str, str | bytes | None]] = [
                    ("blackbox-id", ident),
                    ("blackbox-due-ms", stamp),
                ]
                producer.produce(request["topic"], orjson.dumps(request["message"]),
                                 headers=headers)  # fmt: skip
                consumer.store_offsets(record)
            producer.poll(0)
    finally:
        producer.flush(10)
        consumer.close()


@contextmanager
def subject_process(stack: Stack, subject: str, against: Path | None) -> Iterator[int]:
    """Start the subject in its own process; its pid once it delivers a warm-up probe."""
    env = {**os.environ, **stack.env, "PYTHONUNBUFFERED": "1"}
    env.pop("PYTHONPATH", None)
    cwd: Path | None = None
    if subject == "relay":
        command = [sys.executable, "-m", "benchmarks.steady", "--relay", stack.broker.bootstrap,
                   stack.settings.intake_topic]  # fmt: skip
    elif subject == "steps":
        command = [sys.executable, "-m", "benchmarks.steps", "--serve", str(steps_file(stack))]
    else:
        command = [sys.executable, "-m", "blackbox", "run"]
        if subject == "against":
            cwd = against
            env["PYTHONPATH"] = str(against)
    with (stack.work / f"{subject}.log").open("ab") as log:
        process = subprocess.Popen(command, env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT)
    try:
        warm_up(stack, new_producer(stack))
        yield process.pid
    finally:
        process.terminate()
        process.wait(20)


def caller_of(subject: str) -> bytes | None:
    """The CALLER_SERVICE header the subject's requests carry."""
    return None if subject == "anonymous" else CALLER


def steps_file(stack: Stack) -> Path:
    """Where subject `steps` writes its steps' totals."""
    return stack.work / "steps.json"


def one_run(
    subject: str, rate: int, seconds: int, against: Path | None, *, count_served: bool = False
) -> Result:
    count = rate * seconds
    rng = random.Random(rate)
    overrides = SUBJECT_SETTINGS.get(subject, {})
    with local_stack(**overrides) as stack, subject_process(stack, subject, against) as pid:
        client = redis.Redis.from_url(stack.redis.url)
        target = f"steady-{uuid.uuid4().hex[:8]}"
        clients.ensure_topics(stack.settings.kafka, [target])
        opens = time.time()
        window = Window(target, opens - 1, opens + IDLE_SECONDS + seconds + COUNTDOWNS_S[1] + 5)
        collector = CollectorProcess.following(stack.broker.bootstrap, [window], seconds + 90)
        served = _served(stack, count_served)  # the broker's JMX agent started before idle
        idle_start = meters(stack, pid, client)
        time.sleep(IDLE_SECONDS)  # the subject idle: what it costs per second doing nothing
        idle = meters(stack, pid, client).since(idle_start)
        producer = new_producer(stack)
        commands = client.info("commandstats")
        served = _served(stack, count_served)
        start = meters(stack, pid, client)
        threads_start = thread_cpu_seconds(pid)
        steps_start = steps.read(steps_file(stack))
        for n in range(count):
            lag = start.at + n / rate - time.monotonic()
            if lag > 0:
                producer.poll(lag)
            send(producer, stack.settings.intake_topic, target, n, rng.uniform(*COUNTDOWNS_S),
                 caller_of(subject))  # fmt: skip
        producer.flush(30)
        # The collector follows until its window closes: the meters are read after the
        # last delivery, and the idle rate over the whole span is taken off (net figures).
        got = collector.result(timeout=seconds + 120)
        used = meters(stack, pid, client).since(start)
        requests = brokerrequests.per_message(served, _served(stack, count_served), count)
        threads = _per_message(threads_start, thread_cpu_seconds(pid), count)
        calls = _calls_per_message(commands, client.info("commandstats"), count)
        client.close()
        timed = steps.per_message(steps_start, steps.read(steps_file(stack)), count)
    return {**_figures(subject, rate, seconds, count, got, used, idle),
            "subject_threads_cpu_us_per_message": threads,
            "redis_calls_per_message": calls,
            "broker_served_per_message": requests,
            **({"steps_per_message": timed} if subject == "steps" else {})}  # fmt: skip


def _per_message(before: dict[str, float], after: dict[str, float], count: int) -> dict[str, float]:
    """The subject's CPU per message over the run by thread name (raw: idle not taken off),
    most first."""
    used = {name: (spent - before.get(name, 0.0)) / count * 1e6 for name, spent in after.items()}
    return {n: round(u, 1) for n, u in sorted(used.items(), key=lambda x: -x[1]) if u > 0}


def burst_run(subject: str, count: int, against: Path | None, ahead_s: float = 10.0) -> Result:
    """`count` messages due at one instant `ahead_s` from the first send (as S1): how long
    after it the last arrived, and the CPU from the due instant to the last delivery."""
    overrides = SUBJECT_SETTINGS.get(subject, {})
    with local_stack(**overrides) as stack, subject_process(stack, subject, against) as pid:
        client = redis.Redis.from_url(stack.redis.url)
        target = f"burst-{uuid.uuid4().hex[:8]}"
        clients.ensure_topics(stack.settings.kafka, [target])
        collector = CollectorProcess(stack.broker.bootstrap, target, count, ahead_s + 90)
        producer = new_producer(stack)
        due = time.time() + ahead_s
        for n in range(count):
            send(producer, stack.settings.intake_topic, target, n, due - time.time(),
                 caller_of(subject))  # fmt: skip
        producer.flush(30)
        time.sleep(max(0.0, due - time.time()))  # the firing alone from here
        start = meters(stack, pid, client)
        got = collector.result(timeout=ahead_s + 100)
        used = meters(stack, pid, client).since(start)
        client.close()
    last = max((c[0][0] - c[0][1] for c in got.copies.values()), default=None)
    return {"scenario": "burst", "subject": subject, "messages": count,
            "delivered": len(got.copies), "lost": count - len(got.copies),
            "duplicated": got.duplicated(), "last_after_due_ms": last,
            "subject_cpu_us_per_message": round(used["subject"] / count * 1e6, 1),
            "redis_cpu_us_per_message": round(used["redis"] / count * 1e6, 1)}  # fmt: skip


def _calls_per_message(
    before: dict[str, Any], after: dict[str, Any], count: int
) -> dict[str, float]:
    """Redis commands per message over the run, by command (scripts count as one each)."""
    calls = {name.removeprefix("cmdstat_"): stats["calls"] - before.get(name, {}).get("calls", 0)
             for name, stats in after.items()}  # fmt: skip
    return {n: round(c / count, 3) for n, c in sorted(calls.items(), key=lambda x: -x[1]) if c}


def _figures(  # noqa: PLR0913, PLR0917 - one run's settings and readings
    subject: str, rate: int, seconds: int, count: int, got: Any, used: dict[str, float],
    idle: dict[str, float],
) -> Result:  # fmt: skip
    first_sent = min((c[0][1] for c in got.copies.values()), default=0)
    last_arrived = max((c[0][0] for c in got.copies.values()), default=0)
    span = max(used["span"], 1e-9)
    busy = (last_arrived - first_sent) / 1000 if got.copies else span
    per = {}
    for part in ("subject", "broker", "redis"):
        net = used[part] - idle[part] / idle["span"] * span
        per[f"{part}_cpu_us_per_message"] = round(max(net, 0.0) / count * 1e6, 1)
        per[f"{part}_cpu_us_per_message_raw"] = round(used[part] / count * 1e6, 1)
        per[f"{part}_idle_cores"] = round(idle[part] / idle["span"], 3)
    return {
        "scenario": "steady", "subject": subject, "rate_per_s": rate, "seconds": seconds,
        "messages": count, "delivered": len(got.copies), "lost": count - len(got.copies),
        "duplicated": got.duplicated(), "span_s": round(span, 1), "busy_s": round(busy, 1),
        "lateness_ms": summary(got.lateness_ms()),
        "own_lateness_ms": summary(got.own_lateness_ms()) if subject != "relay" else None,
        **per,
    }  # fmt: skip


def median_table(results: list[Result]) -> str:
    """Per subject and rate, the median of each figure over the rounds."""
    fields = ["subject_cpu_us_per_message", "broker_cpu_us_per_message",
              "redis_cpu_us_per_message", "lateness_ms.p50", "lateness_ms.p99",
              "own_lateness_ms.p50", "own_lateness_ms.p99", "lost", "duplicated",
              "broker_served_per_message.requests", "broker_served_per_message.Produce",
              "broker_served_per_message.Fetch"]  # fmt: skip
    keys = sorted({(r["rate_per_s"], r["subject"]) for r in results})
    lines = [f"  {'rate':>6} {'subject':<8} " + " ".join(f"{f:>28}" for f in fields)]
    for rate, subject in keys:
        runs = [r for r in results if (r["rate_per_s"], r["subject"]) == (rate, subject)]
        cells = []
        for name in fields:
            values = [v for v in (_field(r, name) for r in runs) if v is not None]
            cells.append(f"{round(statistics.median(values), 1):>28}" if values else f"{'-':>28}")
        lines.append(f"  {rate:>6} {subject:<8} " + " ".join(cells))
    return "\n".join(lines)


def _field(result: Result, name: str) -> Any:
    value: Any = result
    for part in name.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rates", type=int, nargs="+", default=[100, 1000, 10000])
    parser.add_argument("--seconds", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument(
        "--burst",
        type=int,
        default=0,
        metavar="N",
        help="also N messages due at one instant, per subject but the relay",
    )
    parser.add_argument(
        "--subjects",
        nargs="+",
        default=["service", "relay"],
        choices=["service", "anonymous", "relay", "against", "steps", *SUBJECT_SETTINGS],
    )
    parser.add_argument(
        "--served",
        action="store_true",
        help="also count what the broker served per message, from its own metrics over JMX "
        "(attaches to the broker's JVM: its CPU figures are then not comparable)",
    )
    parser.add_argument("--against", type=Path, help="another checkout's tree (subject 'against')")
    parser.add_argument("--relay", nargs=2, metavar=("BOOTSTRAP", "TOPIC"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.relay:
        relay(*args.relay)
        return 0
    subjects = list(args.subjects)
    if args.against is not None and "against" not in subjects:
        subjects.append("against")
    if "against" in subjects and args.against is None:
        parser.error("subject 'against' needs --against DIR")
    results = []
    for round_ in range(args.rounds):
        for rate in args.rates:
            for subject in subjects if round_ % 2 == 0 else reversed(subjects):
                result = one_run(subject, rate, args.seconds, args.against,
                                 count_served=args.served)  # fmt: skip
                results.append(result)
                print(orjson.dumps(result).decode(), flush=True)  # noqa: T201 - figures
        for subject in [s for s in subjects if s != "relay"] if args.burst else []:
            print(orjson.dumps(burst_run(subject, args.burst, args.against)).decode(),  # noqa: T201
                  flush=True)  # fmt: skip
    print(median_table(results), flush=True)  # noqa: T201
    return 0


if __name__ == "__main__":
    sys.exit(main())
