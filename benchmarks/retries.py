"""Consumer retries on the defaults: how fast blackbox takes retry requests, and how the
delays it keeps compare with the policy asked for.

    python -m benchmarks.retries                       # 10,000 records, each failing twice,
                                                       # policy {"delays": [1, 3]}
    python -m benchmarks.retries --records 2000 --fails 1

N records (1 KB values, keyed, three headers) wait in a 3-partition topic; one worker
(`confluent_kafka.Consumer` in a group, `Client.retry` as the docs show it: a batch of up to
500 records handled, their retries flushed, then the offsets committed) fails each record
on its first `--fails` attempts. Printed: how fast the service took the retry requests
(`blackbox_retries_scheduled_total` over time, from the first request sent to the last one
scheduled) and its CPU per request; per attempt, the delay the policy asks for against the
one measured (the retried record's create time minus the failure's intake time, from its
`blackbox-retry-history`) and the lateness at the worker (read time minus due); records
that came back more often than they failed or not at all (must be 0).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter, defaultdict

import orjson
from confluent_kafka import Consumer, Message, Producer

from benchmarks.collect import summary
from benchmarks.scenarios import table
from benchmarks.stack import ServiceProcess, cpu_seconds, local_stack, wait_for
from blackbox import retries
from blackbox.client import Client
from blackbox.kafka import clients

Result = dict[str, object]
PARTITIONS = 3
BATCH = 500
CALLER = "bench-worker"


def _produce(bootstrap: str, topic: str, records: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5,
                         "partitioner": clients.JAVA_PARTITIONER})  # fmt: skip
    headers: list[tuple[str, str | bytes | None]] = [
        ("trace", b"\xff\xfe"), ("kind", b"order"), ("kind", b"again"),
    ]  # fmt: skip
    for n in range(records):
        producer.produce(topic, n.to_bytes(4, "big") + b"x" * 1020, f"k{n}".encode(),
                         headers=headers)  # fmt: skip
        producer.poll(0)
    producer.flush(60)


def _attempt(message: Message) -> int:
    raw = dict(message.headers() or []).get(retries.ATTEMPT_HEADER)
    return 1 if raw is None else int(raw)


class Worker:
    """Consumes the topic; fails each record on its first `fails` attempts."""

    def __init__(self, bootstrap: str, topic: str, intake: str, policy: dict[str, object],
                 fails: int) -> None:  # fmt: skip
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "workers",
                                  "enable.auto.commit": False,
                                  "auto.offset.reset": "earliest"})  # fmt: skip
        self.consumer.subscribe([topic])
        self.client = Client({"bootstrap.servers": bootstrap}, caller=CALLER, intake_topic=intake)
        self.policy, self.fails = policy, fails
        self.came: Counter[tuple[bytes, int]] = Counter()  # (key, attempt) -> times read
        self.delays: dict[int, list[float]] = defaultdict(list)  # attempt -> ms waited
        self.late: dict[int, list[float]] = defaultdict(list)  # attempt -> ms late at read
        self.first_retry_s: float | None = None

    def step(self) -> int:
        batch = [m for m in self.consumer.consume(BATCH, timeout=0.2) if m.error() is None]
        now_ms = time.time_ns() / 1e6
        for message in batch:
            attempt = _attempt(message)
            self.came[(message.key() or b"", attempt)] += 1
            if attempt > 1:
                self._measure(message, attempt, now_ms)
            if attempt <= self.fails:
                self.first_retry_s = self.first_retry_s or time.monotonic()
                self.client.retry(message, f"failed at {attempt}", policy=self.policy)
        if batch:
            self.client.flush()
            self.consumer.commit(asynchronous=False)
        return len(batch)

    def _measure(self, message: Message, attempt: int, now_ms: float) -> None:
        headers = dict(message.headers() or [])
        failed = orjson.loads(headers[retries.HISTORY_HEADER] or b"[]")[-1]["at_ms"]
        due = failed + _policy_delay_ms(self.policy, attempt - 1)
        self.delays[attempt].append(message.timestamp()[1] - failed)
        self.late[attempt].append(now_ms - due)

    def close(self) -> None:
        self.consumer.close()
        self.client.flush()


def _policy_delay_ms(policy: dict[str, object], failed: int) -> float:
    delays = policy["delays"]
    assert isinstance(delays, list)
    return float(delays[failed - 1]) * 1000


def run(records: int, fails: int, delays: list[float]) -> Result:
    policy: dict[str, object] = {"delays": delays}
    with local_stack() as stack:
        bootstrap, topic = stack.broker.bootstrap, "work"
        clients.ensure_topics(stack.settings.kafka, [topic], partitions=PARTITIONS)
        _produce(bootstrap, topic, records)
        service = ServiceProcess(stack.env, "all", stack.work / "service.log")
        try:
            wait_for(service.ready, 60, "the service ready")
            worker = Worker(bootstrap, topic, stack.settings.intake_topic, policy, fails)
            return _measured(service, worker, records)
        finally:
            service.stop()


def _measured(service: ServiceProcess, worker: Worker, records: int) -> Result:
    policy, fails = worker.policy, worker.fails
    expected = records * (fails + 1)
    cpu_before = cpu_seconds(service.pid)
    scheduled_at: float | None = None
    deadline = time.monotonic() + 600
    while sum(worker.came.values()) < expected and time.monotonic() < deadline:
        worker.step()
        if scheduled_at is None and service.metric(
                "blackbox_retries_scheduled_total") >= records * fails:  # fmt: skip
            scheduled_at = time.monotonic()
    cpu = cpu_seconds(service.pid) - cpu_before
    tail = time.monotonic() + 2  # anything more would be a copy
    while time.monotonic() < tail:
        worker.step()
    worker.close()
    taken = (scheduled_at or time.monotonic()) - (worker.first_retry_s or time.monotonic())
    copies = sum(n - 1 for n in worker.came.values() if n > 1)
    missing = expected - len(worker.came)
    per_attempt = {
        f"attempt {a} (policy {_policy_delay_ms(policy, a - 1):.0f} ms)": {
            "waited p50/p99/max ms": _triple(worker.delays[a]),
            "late at the worker p50/p99/max ms": _triple(worker.late[a]),
        }
        for a in sorted(worker.delays)
    }
    return {
        "records": records,
        "retry requests": records * fails,
        "requests scheduled per second": round(records * fails / taken) if taken > 0 else None,
        "service CPU per request, µs (whole run)": round(cpu / (records * fails) * 1e6),
        **per_attempt,
        "copies": copies,
        "missing": missing,
    }


def _triple(values: list[float]) -> str:
    s = summary(values)
    return " / ".join("-" if s[k] is None else f"{s[k]:.0f}" for k in ("p50", "p99", "max"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=10_000)
    parser.add_argument("--fails", type=int, default=2, help="attempts each record fails")
    parser.add_argument("--delays", type=float, nargs="+", default=[1.0, 3.0],
                        help="the policy's delays, seconds")  # fmt: skip
    args = parser.parse_args()
    if len(args.delays) < args.fails:
        parser.error("give a delay for each failure (--delays)")
    result = run(args.records, args.fails, args.delays)
    print(orjson.dumps(result).decode())  # noqa: T201 - a benchmark prints its figures
    print(table(result))  # noqa: T201
    return 0 if result["copies"] == 0 and result["missing"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
