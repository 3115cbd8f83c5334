"""What a record costs produced at its own instant, against the same records produced in a
burst: the floor under a steady stream's firing, where each due instant is a wake-up.

    python -m benchmarks.paced [--rates 100 1000 10000] [--messages 3000]

On an Apache Kafka broker of its own, with the firing producer's settings (idempotent,
acks=all, linger 5 ms) and a delivery's headers, each rate produces `messages` records one
at a time at their instants (a sleep until each, as the waker sleeps), then the same count
at once. Printed per record: the process's CPU, its Python thread's and librdkafka's
threads', for the pacing alone (the sleeps, no produce), paced produces and the burst.
Then the same for Python work alone (parsing one intake request, `envelope.parse`): paced,
each right after a wake, against back to back. What a wake costs beyond its sleep is the
difference, less the pacing alone: the caches a sleeping thread finds cold.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable

from confluent_kafka import Producer

from benchmarks.stack import started_broker
from blackbox import envelope
from blackbox.kafka import clients

HEADERS = [("blackbox-id", b"@billing/invoice-42"), ("blackbox-due-ms", b"1795944143176"),
           ("blackbox-attempt", b"1"), ("CALLER_SERVICE", b"billing")]  # fmt: skip
REQUEST = b'{"topic": "invoices", "message": {"invoice": 42, "due": "2026-12-01"}, "countdown": 30}'
LIMITS = envelope.Limits(max_value_bytes=1_048_576, forbidden_topics=frozenset({"blackbox"}))


def _threads_cpu() -> dict[str, float]:
    """CPU seconds of this process's threads, summed by thread name."""
    found: dict[str, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as comm:
                name = comm.read().strip()
            with open(f"/proc/self/task/{task}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except FileNotFoundError:  # the thread ended meanwhile
            continue
        name = "python" if name.startswith("python") else name.rstrip("0123456789")
        found[name] = found.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return found


def _measured(count: int, run: Callable[[], None]) -> dict[str, float]:
    """µs of CPU per record of `run`, in all and by thread."""
    before, started = _threads_cpu(), time.process_time()
    run()
    spent, after = time.process_time() - started, _threads_cpu()
    by = {n: (after[n] - before.get(n, 0.0)) / count * 1e6 for n in after}
    return {"process": spent / count * 1e6, **{n: v for n, v in by.items() if v > 0.05}}


def _parse() -> None:
    envelope.parse(REQUEST, [("CALLER_SERVICE", b"billing")], LIMITS)


def _back_to_back(count: int, work: Callable[[], None]) -> Callable[[], None]:
    def run() -> None:
        for _ in range(count):
            work()

    return run


def _paced(count: int, rate: float, produce: Callable[[], None] | None) -> Callable[[], None]:
    def run() -> None:
        start = time.monotonic()
        for n in range(count):
            time.sleep(max(0.0, start + n / rate - time.monotonic()))
            if produce is not None:
                produce()

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", type=float, nargs="+", default=[100.0, 1000.0, 10000.0])
    parser.add_argument("--messages", type=int, default=3000)
    args = parser.parse_args()
    with started_broker() as broker:
        kafka = {"bootstrap.servers": broker.bootstrap}
        clients.ensure_topics(kafka, ["paced"])
        producer = Producer({**kafka, "enable.idempotence": True, "acks": "all",
                             "linger.ms": clients.FIRING_LINGER_MS})  # fmt: skip
        producer.produce("paced", b"warm")
        producer.flush(10)

        def produce() -> None:
            producer.produce("paced", b'{"invoice": 42}', b"invoice-42", headers=list(HEADERS),
                             on_delivery=lambda _e, _m: None)  # fmt: skip
            producer.poll(0)

        def burst() -> None:
            for _ in range(args.messages):
                produce()
            producer.flush(10)

        for rate in args.rates:
            for what, run in (("pacing alone", _paced(args.messages, rate, None)),
                              ("paced produce", _paced(args.messages, rate, produce)),
                              ("burst produce", burst)):  # fmt: skip
                figures = _measured(args.messages, run)
                producer.flush(10)
                shown = ", ".join(f"{n} {v:.1f}" for n, v in figures.items())
                print(f"{rate:>8g}/s  {what:<14} µs per record: {shown}", flush=True)  # noqa: T201
        for rate in args.rates:
            paced = _measured(args.messages, _paced(args.messages, rate, _parse))["process"]
            alone = _measured(args.messages, _paced(args.messages, rate, None))["process"]
            hot = _measured(args.messages, _back_to_back(args.messages, _parse))["process"]
            print(f"{rate:>8g}/s  parse a request µs: after a wake {paced - alone:.1f}, "  # noqa: T201
                  f"back to back {hot:.1f}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
