"""What exporting spans costs per message: a traced burst with OTEL_* set and without.

    python -m benchmarks.tracing --runs 3

Each run starts the local stack and `blackbox run`, sends `--messages` requests carrying a
W3C traceparent, due together `--ahead` seconds later, and reads the service's CPU from
the first send to the last delivery (intake and firing: a receive and a fire span per
message when on). Runs alternate: without OTEL_* (off), then with
OTEL_EXPORTER_OTLP_ENDPOINT pointing at a sink in this process that takes every OTLP/HTTP
request and answers 200 (on; the SDK's defaults: every span sampled, batches of 512).
Prints each run and the medians; the difference is the cost of the spans per message.

    python -m benchmarks.tracing --hooks

The cost with tracing off, apart from the machine's drift: the hooks an untraced record
passes through (intake: context_of, logged, traced; firing: delivered_headers), called in a
loop in this process, against the same work without them (CPU ns per message).
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import orjson
from confluent_kafka import Producer

from benchmarks.collect import CollectorProcess
from benchmarks.producing import produce_waiting
from benchmarks.scenarios import new_producer, warm_up
from benchmarks.stack import Stack, cpu_seconds, local_stack, spawn_service
from blackbox import tracing
from blackbox.clock import now_ms
from blackbox.envelope import CALLER_HEADER, Header
from blackbox.intake import traces
from blackbox.kafka import clients
from blackbox.metrics import Metrics
from blackbox.schedule import Schedule


class Sink:
    """An OTLP/HTTP endpoint that counts the bytes it is sent and answers 200."""

    def __init__(self) -> None:
        self.received = 0
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                sink.received += len(self.rfile.read(int(self.headers["Content-Length"])))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *_: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"


def _parent(n: int) -> bytes:
    return f"00-{uuid.uuid4().hex}-{n + 1:016x}-01".encode()


@contextmanager
def _service(stack: Stack, otel: dict[str, str]) -> Iterator[int]:
    process = spawn_service({**stack.env, **otel}, stack.work / "service.log")
    try:
        yield process.pid
    finally:
        process.terminate()
        process.wait(15)


def traced_burst(messages: int, ahead_s: float, sink: Sink | None) -> dict[str, Any]:
    """One run: the service's CPU per message from the first send to the last delivery."""
    otel = {} if sink is None else {"OTEL_EXPORTER_OTLP_ENDPOINT": sink.endpoint,
                                    "OTEL_SERVICE_NAME": "blackbox-bench"}  # fmt: skip
    before = 0 if sink is None else sink.received
    with local_stack() as stack, _service(stack, otel) as pid:
        target = f"traced-{uuid.uuid4().hex[:8]}"
        clients.ensure_topics(stack.settings.kafka, [target])
        producer = new_producer(stack)
        warm_up(stack, producer)  # the intake joined and was assigned
        collector = CollectorProcess(stack.broker.bootstrap, target, messages, ahead_s + 90)
        cpu_start = cpu_seconds(pid)
        due = now_ms() + int(ahead_s * 1000)
        for n in range(messages):
            _send(producer, stack, target, n, (due - now_ms()) / 1000)
        producer.flush(30)
        got = collector.result(timeout=ahead_s + 100)
        cpu = cpu_seconds(pid) - cpu_start
    return {
        "tracing": "off" if sink is None else "on",
        "messages": messages,
        "delivered": len(got.copies),
        "service_cpu_us_per_message": round(cpu / messages * 1e6, 1),
        "exported_bytes_per_message": None
        if sink is None
        else round((sink.received - before) / messages, 1),
    }


def _send(producer: Producer, stack: Stack, target: str, n: int, countdown: float) -> None:
    value = orjson.dumps({"topic": target, "message": n, "countdown": max(0.0, countdown)})
    produce_waiting(producer, stack.settings.intake_topic, value,
                    headers=[("traceparent", _parent(n))])  # fmt: skip


def hooks_off(count: int = 1_000_000) -> dict[str, float]:
    """CPU ns per message of the trace hooks an untraced record passes with tracing off."""
    metrics, where = Metrics(), ("blackbox", 0, 1)
    headers: list[Header] = [(CALLER_HEADER, b"billing")]
    schedule = Schedule("@billing/x", "orders", b"{}", 1, caller=b"billing")

    def hooked() -> None:
        context = traces.context_of(headers, metrics)
        with traces.logged(context):
            traces.traced(schedule, context, where)
        tracing.delivered_headers(schedule, 1)

    def bare() -> None:
        list(schedule.headers)

    return {name: round(_ns_per_call(work, count), 1) for name, work in
            (("hooks", hooked), ("bare", bare))}  # fmt: skip


def _ns_per_call(work: Callable[[], None], count: int) -> float:
    start = time.process_time_ns()
    for _ in range(count):
        work()
    return (time.process_time_ns() - start) / count


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--hooks", action="store_true", help="the hooks' cost with tracing off")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--ahead", type=float, default=15.0, help="seconds to the due time")
    args = parser.parse_args()
    if args.hooks:
        for _ in range(args.runs):
            print(orjson.dumps(hooks_off()).decode(), flush=True)  # noqa: T201 - the output
        return 0
    sink = Sink()
    results: dict[str, list[float]] = {"off": [], "on": []}
    for _ in range(args.runs):
        for exporter in (None, sink):
            result = traced_burst(args.messages, args.ahead, exporter)
            print(orjson.dumps(result).decode(), flush=True)  # noqa: T201 - the benchmark's output
            results[result["tracing"]].append(result["service_cpu_us_per_message"])
    off, on = statistics.median(results["off"]), statistics.median(results["on"])
    print(f"service CPU per traced message, median of {args.runs}: off {off} µs, "  # noqa: T201
          f"on {on} µs, spans cost {round(on - off, 1)} µs")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
