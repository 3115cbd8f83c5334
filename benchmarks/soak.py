"""The soak: a steady rate for an hour, memory and lateness sampled every minute.

    python -m benchmarks.soak                     # 60 minutes at 10 messages/s
    python -m benchmarks.soak --minutes 10 --rate 200

The local Tansu broker keeps its log in memory and its fetches cost more the longer a
partition's log: a reader polling every few ms (as the lateness collector must) stalls it
once a topic holds about 8,000 record batches. So each minute's messages go to a target
topic of their own, the collector reads each topic only while its messages can arrive,
and at the end every topic is read to its end to count what was delivered. The intake
topic still grows for the whole run: past about 40,000 records it could no longer take
200 records/s, so the default rate keeps an hour under that. Against a real Kafka, raise it.

Run by hand or on demand, not in CI. Prints one row per minute (service RSS, Redis memory,
pending, records sent) and a JSON summary: what was sent, accepted, delivered (read back
from every target topic), lost and duplicated, and per minute the memory and the lateness
of what the collector saw live, beside the lateness of probes produced straight to the
target topics once a second (the local broker's own floor), and per minute the service's
own lateness histograms and each process's CPU. Memory should follow the pending data only;
the service's part of the lateness (send minus due) should not drift. The local broker's does:
`python -m benchmarks.broker_drift` shows it without blackbox.
"""

from __future__ import annotations

import argparse
import random
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass

import orjson
import redis
from confluent_kafka import KafkaError, Producer

from benchmarks.collect import (
    PROBE_PREFIX,
    CollectorProcess,
    Deliveries,
    Window,
    count_copies,
    new_prober,
    probe,
    summary,
)
from benchmarks.histograms import Histograms, between, scrape
from benchmarks.stack import Stack, cpu_seconds, local_stack, start_service
from blackbox.kafka import clients
from blackbox.storage.keys import Layout
from blackbox.storage.store import pending_counts

Result = dict[str, object]


class _SteadySender(threading.Thread):
    """`count` envelopes at `rate` a second, with countdowns of 1-30 s, each minute's to the
    next of `targets`."""

    def __init__(self, stack: Stack, targets: list[str], rate: int, count: int) -> None:
        super().__init__(daemon=True)
        self.stack, self.targets, self.rate, self.count = stack, targets, rate, count
        self.accepted = self.sent = 0

    def _report(self, error: KafkaError | None, _message: object) -> None:
        if error is None:
            self.accepted += 1

    def run(self) -> None:
        producer = Producer(
            {
                "bootstrap.servers": self.stack.broker.bootstrap,
                "linger.ms": 5,
                "enable.idempotence": True,
            }
        )  # a retry writes nothing twice
        prober = new_prober(self.stack.broker.bootstrap)
        rng, start = random.Random(5), time.monotonic()
        while self.sent < self.count:
            lag = start + self.sent / self.rate - time.monotonic()
            if lag > 0:  # poll() returns at the first delivery report: sleep for the pace
                time.sleep(lag)
            producer.poll(0)
            target = self.targets[min(self.sent // (60 * self.rate), len(self.targets) - 1)]
            value = {"topic": target, "message": self.sent, "countdown": rng.uniform(1, 30)}
            producer.produce(self.stack.settings.intake_topic, orjson.dumps(value),
                             on_delivery=self._report)  # fmt: skip
            if self.sent % self.rate == 0:
                probe(prober, target, self.sent // self.rate)
            self.sent += 1
        producer.flush(60)
        prober.flush(60)


@dataclass
class Sample:
    """One minute's readings. The service's own lateness histograms, as this minute's
    mean and the bucket bound under which 99% fell: `send` until the message was handed to
    the producer, `ack` until the broker acknowledged it. CPU is each process's share of
    one core over the minute."""

    minute: int
    at_ms: int
    service_rss_mb: float
    redis_mb: float
    pending: int
    sent: int
    send_lateness_ms: dict[str, float | None]
    ack_lateness_ms: dict[str, float | None]
    cpu_percent: dict[str, float]


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


@dataclass
class _Readings:
    """Cumulative counters read at one instant: a minute's share is the difference."""

    at: float
    cpu_s: dict[str, float]
    histograms: Histograms


class _Sampler:
    """Reads the service, Redis and the processes' CPU once a minute."""

    def __init__(
        self, layout: Layout, pids: dict[str, int], port: int, client: redis.Redis
    ) -> None:
        self.layout, self.pids, self.port, self.client = layout, pids, port, client
        self.before = self._read()

    def _read(self) -> _Readings:
        cpu = {name: cpu_seconds(pid) for name, pid in self.pids.items()}
        return _Readings(time.monotonic(), cpu, scrape(self.port))

    def sample(self, minute: int, sent: int) -> Sample:
        pending = sum(pending_counts(self.client, self.layout))
        used = int(self.client.info("memory")["used_memory"]) / 2**20
        now, before = self._read(), self.before
        self.before = now
        share = {n: round(100 * (now.cpu_s[n] - before.cpu_s[n]) / (now.at - before.at), 1)
                 for n in self.pids}  # fmt: skip
        return Sample(
            minute, time.time_ns() // 1_000_000, round(_rss_mb(self.pids["service"]), 1),
            round(used, 1), pending, sent,
            between(now.histograms["send"], before.histograms["send"]),
            between(now.histograms["ack"], before.histograms["ack"]), share,
        )  # fmt: skip


# A minute's messages can arrive until its countdowns (at most 30 s) have run out; the
# collector reads its topic this long after the minute ends.
LATE_WINDOW_S = 90


def _windows(targets: list[str], start: float) -> list[Window]:
    return [Window(t, start + 60 * i - 5, start + 60 * (i + 1) + LATE_WINDOW_S)
            for i, t in enumerate(targets)]  # fmt: skip


def soak(minutes: int = 60, rate: int = 10) -> Result:
    with local_stack(appendfsync="everysec") as stack:
        run = uuid.uuid4().hex[:8]
        targets = [f"soak-{run}-{minute:03d}" for minute in range(1, minutes + 1)]
        clients.ensure_topics(stack.settings.kafka, targets)
        expected = minutes * 60 * rate
        planned = time.time() + 15  # when sending starts: the collector and service are up
        collector = CollectorProcess.following(stack.broker.bootstrap,
                                               _windows(targets, planned),
                                               timeout=minutes * 60 + 300)  # fmt: skip
        process = start_service(stack)
        client = redis.Redis.from_url(stack.redis.url)
        sender = _SteadySender(stack, targets, rate, expected)
        time.sleep(max(0.0, planned - time.time()))
        port = stack.settings.http_port or 0
        sampler = _Sampler(stack.layout, _pids(stack, process, collector), port, client)
        sender.start()
        samples = []
        start = time.monotonic()
        for minute in range(1, minutes + 1):
            time.sleep(max(0.0, start + minute * 60 - time.monotonic()))  # the sampling clock
            samples.append(sampler.sample(minute, sender.sent))
            print(_row(samples[-1]), flush=True)  # noqa: T201 - progress of a long run
        sender.join()
        got = collector.result(timeout=LATE_WINDOW_S + 300)
        alive = process.poll() is None
        copies = sum((count_copies(stack.broker.bootstrap, t) for t in targets), Counter[str]())
        copies = Counter({i: n for i, n in copies.items() if not i.startswith(PROBE_PREFIX)})
        process.terminate()
        process.wait(15)
        client.close()
    return _report(samples, got, copies, sender, alive)


def _pids(stack: Stack, service: subprocess.Popen[bytes], collector: CollectorProcess
          ) -> dict[str, int]:  # fmt: skip
    """The processes whose CPU each minute reports."""
    broker, store = stack.broker.process, stack.redis.process
    assert broker is not None and store is not None
    return {"service": service.pid, "broker": broker.pid, "redis": store.pid,
            "collector": int(collector.process.pid or 0)}  # fmt: skip


def _row(sample: Sample) -> str:
    cpu = " ".join(f"{n} {c:5.1f}%" for n, c in sample.cpu_percent.items())
    return (f"minute {sample.minute:3d}  rss {sample.service_rss_mb:7.1f} MB  "
            f"redis {sample.redis_mb:7.1f} MB  pending {sample.pending:7d}  "
            f"sent {sample.sent:8d}  send mean {sample.send_lateness_ms['mean']} ms  "
            f"ack mean {sample.ack_lateness_ms['mean']} ms  cpu {cpu}")  # fmt: skip


def _report(
    samples: list[Sample], got: Deliveries, copies: Counter[str], sender: _SteadySender, alive: bool
) -> Result:
    """`copies` counts what the target topics hold; `got` is what the collector saw live."""
    by_minute: dict[int, list[int]] = {}
    probes: dict[int, list[int]] = {}
    first_ms = samples[0].at_ms - 60_000
    for key, ((arrived, due), *_) in got.copies.items():
        into = probes if key.startswith(PROBE_PREFIX) else by_minute
        into.setdefault(1 + (arrived - first_ms) // 60_000, []).append(arrived - due)
    minutes = [
        {**sample.__dict__, "delivered": len(by_minute.get(sample.minute, [])),
         "lateness_ms": summary(by_minute.get(sample.minute, [])),
         "broker_probe_ms": summary(probes.get(sample.minute, []))}
        for sample in samples
    ]  # fmt: skip
    return {
        "scenario": "soak", "minutes": len(samples), "sent": sender.sent,
        "accepted": sender.accepted, "delivered": len(copies),
        "lost": sender.accepted - len(copies), "duplicated": copies.total() - len(copies),
        "seen_live": len(got.copies) - sum(len(p) for p in probes.values()),
        "service_alive": alive,
        "rss_mb_first_last_max": [minutes[0]["service_rss_mb"], minutes[-1]["service_rss_mb"],
                                  max(s.service_rss_mb for s in samples)],
        "redis_mb_first_last": [minutes[0]["redis_mb"], minutes[-1]["redis_mb"]],
        "pending_first_last": [minutes[0]["pending"], minutes[-1]["pending"]],
        "lateness_p50_first_last": [minutes[0]["lateness_ms"]["p50"],
                                    minutes[-1]["lateness_ms"]["p50"]],
        "lateness_p99_first_last": [minutes[0]["lateness_ms"]["p99"],
                                    minutes[-1]["lateness_ms"]["p99"]],
        "broker_probe_p99_first_last": [minutes[0]["broker_probe_ms"]["p99"],
                                        minutes[-1]["broker_probe_ms"]["p99"]],
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
