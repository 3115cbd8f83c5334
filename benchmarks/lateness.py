"""Lateness of delivery: N messages with countdowns spread over a window, measured by a
consumer in its own process from each record's arrival and its `blackbox-due-ms` header.

    python -m benchmarks.lateness --messages 1000 --min-countdown 2 --max-countdown 10
    python -m benchmarks.lateness --messages 200 --min-countdown 0 --max-countdown 0 --rate 20

With --rate the messages are sent one by one at that pace instead of all at once; with
countdown 0 that measures the intake path too (due is the record's own timestamp).

Prints one JSON line, then a table.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
import uuid

import orjson

from benchmarks.collect import summary
from benchmarks.scenarios import collector_for, new_producer, send, table, warm_up
from benchmarks.stack import local_stack, service_process


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=1000)
    parser.add_argument("--min-countdown", type=float, default=2.0)
    parser.add_argument("--max-countdown", type=float, default=10.0)
    parser.add_argument("--poll-interval", default="1.0", help="BLACKBOX_POLL_INTERVAL")
    parser.add_argument("--rate", type=float, default=0.0, help="messages/s (0: all at once)")
    args = parser.parse_args()
    with local_stack(BLACKBOX_POLL_INTERVAL=args.poll_interval) as stack, service_process(stack):
        producer = new_producer(stack)
        warm_up(stack, producer)
        target = f"bench-{uuid.uuid4().hex[:8]}"
        collector = collector_for(stack, target, args.messages, args.max_countdown + 60)
        rng = random.Random(1)
        start = time.monotonic()
        for n in range(args.messages):
            if args.rate:  # message n leaves at start + n / rate; poll() would return early
                time.sleep(max(0.0, start + n / args.rate - time.monotonic()))
                producer.poll(0)
            countdown = rng.uniform(args.min_countdown, args.max_countdown)
            send(producer, stack.settings.intake_topic, target, {"n": n}, countdown)
        producer.flush(30)
        got = collector.result(timeout=args.max_countdown + 70)
    result = {
        "benchmark": "lateness", "shards": stack.layout.count, "messages": args.messages,
        "countdown_s": [args.min_countdown, args.max_countdown],
        "poll_interval_s": float(args.poll_interval), "rate_per_s": args.rate or None,
        "delivered": len(got.copies),
        "lost": args.messages - len(got.copies), "duplicated": got.duplicated(),
        "lateness_ms": summary(got.lateness_ms()),
    }  # fmt: skip
    print(orjson.dumps(result).decode())  # noqa: T201 - a benchmark prints its figures
    print(table(result))  # noqa: T201
    return 0 if result["lost"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
