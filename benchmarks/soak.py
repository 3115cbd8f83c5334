"""The soak: a steady rate for an hour, memory and lateness sampled every minute.

    python -m benchmarks.soak                     # 60 minutes at 10 messages/s
    python -m benchmarks.soak --minutes 10 --rate 200

The local Tansu broker keeps its log in memory and slows down as it grows: past about
40,000 records in a topic it could no longer take 200 records/s (it ran at 112% CPU taking
118/s, so records reached the intake tens of seconds late). The default rate keeps an hour
under that; against a real Kafka, raise it.

Run by hand or on demand, not in CI. Prints one row per minute (service RSS, Redis memory,
pending, deliveries and lateness of that minute) and a JSON summary comparing the first
and last minutes: memory should follow the pending data only, lateness should not drift.
"""

from __future__ import annotations

import argparse
import random
import sys
import threading
import time
import uuid
from dataclasses import dataclass

import orjson
import redis
from confluent_kafka import KafkaError, Producer

from benchmarks.collect import CollectorProcess, Deliveries, summary
from benchmarks.stack import Stack, local_stack, start_service
from blackbox import kafka
from blackbox.keys import Keys

Result = dict[str, object]


class _SteadySender(threading.Thread):
    """`count` envelopes at `rate` a second, with countdowns of 1-30 s."""

    def __init__(self, stack: Stack, target: str, rate: int, count: int) -> None:
        super().__init__(daemon=True)
        self.stack, self.target, self.rate, self.count = stack, target, rate, count
        self.accepted = self.sent = 0

    def _report(self, error: KafkaError | None, _message: object) -> None:
        if error is None:
            self.accepted += 1

    def run(self) -> None:
        producer = Producer({"bootstrap.servers": self.stack.broker.bootstrap, "linger.ms": 5})
        rng, start = random.Random(5), time.monotonic()
        while self.sent < self.count:
            lag = start + self.sent / self.rate - time.monotonic()
            if lag > 0:  # poll() returns at the first delivery report: sleep for the pace
                time.sleep(lag)
            producer.poll(0)
            value = {"topic": self.target, "message": self.sent, "countdown": rng.uniform(1, 30)}
            producer.produce(self.stack.settings.intake_topic, orjson.dumps(value),
                             on_delivery=self._report)  # fmt: skip
            self.sent += 1
        producer.flush(60)


@dataclass
class Sample:
    """One minute's readings."""

    minute: int
    at_ms: int
    service_rss_mb: float
    redis_mb: float
    pending: int
    sent: int


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _sample(minute: int, pid: int, client: redis.Redis, keys: Keys, sent: int) -> Sample:
    pending = int(client.zcard(keys.due)) + int(client.zcard(keys.in_flight))
    used = int(client.info("memory")["used_memory"]) / 2**20
    return Sample(minute, time.time_ns() // 1_000_000, round(_rss_mb(pid), 1), round(used, 1),
                  pending, sent)  # fmt: skip


def soak(minutes: int = 60, rate: int = 10) -> Result:
    with local_stack(appendfsync="everysec") as stack:
        target = f"soak-{uuid.uuid4().hex[:8]}"
        kafka.ensure_topics(stack.settings.kafka, [target])
        expected = minutes * 60 * rate
        collector = CollectorProcess(stack.broker.bootstrap, target, expected,
                                     timeout=minutes * 60 + 300)  # fmt: skip
        process = start_service(stack)
        client = redis.Redis.from_url(stack.redis.url)
        keys = Keys(stack.settings.namespace)
        sender = _SteadySender(stack, target, rate, expected)
        sender.start()
        samples = []
        start = time.monotonic()
        for minute in range(1, minutes + 1):
            time.sleep(max(0.0, start + minute * 60 - time.monotonic()))  # the sampling clock
            samples.append(_sample(minute, process.pid, client, keys, sender.sent))
            print(_row(samples[-1]), flush=True)  # noqa: T201 - progress of a long run
        sender.join()
        got = collector.result(timeout=300)
        alive = process.poll() is None
        process.terminate()
        process.wait(15)
        client.close()
    return _report(samples, got, sender, alive)


def _row(sample: Sample) -> str:
    return (f"minute {sample.minute:3d}  rss {sample.service_rss_mb:7.1f} MB  "
            f"redis {sample.redis_mb:7.1f} MB  pending {sample.pending:7d}  "
            f"sent {sample.sent:8d}")  # fmt: skip


def _report(samples: list[Sample], got: Deliveries, sender: _SteadySender, alive: bool) -> Result:
    by_minute: dict[int, list[int]] = {}
    first_ms = samples[0].at_ms - 60_000
    for arrived, due in got.first_copies():
        by_minute.setdefault(1 + (arrived - first_ms) // 60_000, []).append(arrived - due)
    minutes = [
        {**sample.__dict__, "delivered": len(by_minute.get(sample.minute, [])),
         "lateness_ms": summary(by_minute.get(sample.minute, []))}
        for sample in samples
    ]  # fmt: skip
    return {
        "scenario": "soak", "minutes": len(samples), "sent": sender.sent,
        "accepted": sender.accepted, "delivered": len(got.copies),
        "lost": sender.accepted - len(got.copies), "duplicated": got.duplicated(),
        "service_alive": alive,
        "rss_mb_first_last_max": [minutes[0]["service_rss_mb"], minutes[-1]["service_rss_mb"],
                                  max(s.service_rss_mb for s in samples)],
        "redis_mb_first_last": [minutes[0]["redis_mb"], minutes[-1]["redis_mb"]],
        "pending_first_last": [minutes[0]["pending"], minutes[-1]["pending"]],
        "lateness_p50_first_last": [minutes[0]["lateness_ms"]["p50"],
                                    minutes[-1]["lateness_ms"]["p50"]],
        "lateness_p99_first_last": [minutes[0]["lateness_ms"]["p99"],
                                    minutes[-1]["lateness_ms"]["p99"]],
        "per_minute": minutes,
    }  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=int, default=60)
    parser.add_argument("--rate", type=int, default=10, help="messages per second")
    args = parser.parse_args()
    result = soak(args.minutes, args.rate)
    print(orjson.dumps(result).decode(), flush=True)  # noqa: T201 - the figures
    return 1 if result["lost"] != 0 or not result["service_alive"] else 0


if __name__ == "__main__":
    sys.exit(main())
