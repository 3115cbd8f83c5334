"""The local broker alone: does it slow down as a followed partition gains record batches?

    python -m benchmarks.broker_drift                    # 36,000 batches at 200/s, twice
    python -m benchmarks.broker_drift --batches 12000

No blackbox in the path. A producer configured as blackbox's (idempotent, acks=all, no
linger) sends one 100-byte record per batch to a fresh Tansu, first with nobody reading,
then with a reader following the partition's end the way blackbox's intake consumer
follows the intake topic. Every 30 s it prints the acknowledgement latency of what it sent
and the broker's CPU; then a JSON summary. The soak's intake topic gains one batch per
message (36,000 in its hour): this isolates what that does to the broker.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import orjson
from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition

from benchmarks.collect import percentile
from benchmarks.stack import cpu_seconds
from blackbox.dev.servers import TansuBroker, free_port, scratch_dir
from blackbox.kafka import clients

TOPIC = "drift"
ROW_SECONDS = 30


@dataclass
class _Acks:
    """Acknowledgement latencies (ms) since the last row."""

    latencies: list[float] = field(default_factory=list)

    def callback(self, sent: float) -> Callable[[KafkaError | None, Message], None]:
        def report(_error: KafkaError | None, _message: Message) -> None:
            self.latencies.append((time.monotonic() - sent) * 1000)

        return report


def _follow(bootstrap: str, stop: threading.Event) -> None:
    """Read the partition's end as blackbox's intake consumer does (fetch wait 100 ms)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "drift-reader",
                         "fetch.wait.max.ms": 100, "enable.auto.commit": False,
                         "isolation.level": "read_uncommitted"})  # fmt: skip
    consumer.assign([TopicPartition(TOPIC, 0, 0)])
    while not stop.is_set():
        consumer.consume(500, timeout=0.5)
    consumer.close()


def phase(batches: int, rate: int, *, reader: bool) -> list[dict[str, float]]:
    """Send `batches` one-record batches at `rate` a second to a fresh broker; the rows."""
    broker = TansuBroker(free_port(), scratch_dir("blackbox-drift-") / "tansu.log")
    broker.start()
    stop = threading.Event()
    try:
        clients.ensure_topics({"bootstrap.servers": broker.bootstrap}, [TOPIC])
        if reader:
            threading.Thread(target=_follow, args=(broker.bootstrap, stop), daemon=True).start()
        producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0,
                             "enable.idempotence": True, "acks": "all"})  # fmt: skip
        return _send(producer, broker, batches, rate, reader)
    finally:
        stop.set()
        broker.stop()


def _send(
    producer: Producer, broker: TansuBroker, batches: int, rate: int, reader: bool
) -> list[dict[str, float]]:
    assert broker.process is not None
    acks, rows = _Acks(), []
    start = time.monotonic()
    cpu_before, row_start = cpu_seconds(broker.process.pid), start
    for n in range(batches):
        lag = start + n / rate - time.monotonic()
        if lag > 0:
            time.sleep(lag)
        producer.produce(TOPIC, b"x" * 100, on_delivery=acks.callback(time.monotonic()))
        producer.poll(0)
        if (n + 1) % (rate * ROW_SECONDS) == 0 or n + 1 == batches:
            producer.flush(30)
            cpu, elapsed = cpu_seconds(broker.process.pid), time.monotonic() - row_start
            rows.append({
                "reader": reader, "batches": n + 1,
                "ack_p50_ms": round(percentile(acks.latencies, 0.5), 1),
                "ack_p99_ms": round(percentile(acks.latencies, 0.99), 1),
                "broker_cpu_percent": round(100 * (cpu - cpu_before) / elapsed),
            })  # fmt: skip
            print(rows[-1], flush=True)  # noqa: T201 - progress of a long run
            acks.latencies.clear()
            cpu_before, row_start = cpu, time.monotonic()
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batches", type=int, default=36_000)
    parser.add_argument("--rate", type=int, default=200, help="batches per second")
    args = parser.parse_args()
    alone = phase(args.batches, args.rate, reader=False)
    followed = phase(args.batches, args.rate, reader=True)
    print(orjson.dumps({"scenario": "broker drift", "alone": alone, "followed": followed}).decode())  # noqa: T201
    return 0


if __name__ == "__main__":
    sys.exit(main())
