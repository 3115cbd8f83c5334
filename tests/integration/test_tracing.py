"""W3C trace context from the producer to the delivered record, through every way in, and
spans exported to a real OTLP/HTTP endpoint when the OTEL_* variables ask.

The context is part of the message's identity for the consumer (guarantee 9: every
delivered byte traced to its source), and a malformed one is bad input that never stops or
dead-letters anything (guarantee 4).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from opentelemetry import trace
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from blackbox.client import Client
from blackbox.envelope import CALLER_HEADER
from tests.integration.conftest import ReaderFactory, ServiceFactory
from tests.kafkatools import Received, produce, unique, wait_until
from tests.otlp import Collector
from tests.process import BlackboxProcess

pytestmark = pytest.mark.integration

TRACE_ID, SPAN_ID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
PARENT = f"00-{TRACE_ID}-{SPAN_ID}-01".encode()
STATE, BAGGAGE = b"rojo=00f067aa0ba902b7,congo=t61rcWkgMzE", b"user=alice;p=1,order=42"
CONTEXT: list[tuple[str, bytes | None]] = [
    ("traceparent", PARENT),
    ("tracestate", STATE),
    ("baggage", BAGGAGE),
]
NONE: list[tuple[str, bytes | None]] = [("traceparent", None), ("tracestate", None),
                                        ("baggage", None)]  # fmt: skip
TOKEN = "tracing-test-token-0123456789"  # noqa: S105 - a test token
CALLER = "billing"


def context_of(record: Received) -> list[tuple[str, bytes | None]]:
    return [(n, record.headers.get(n)) for n in ("traceparent", "tracestate", "baggage")]


def as_text(headers: list[tuple[str, bytes | None]]) -> dict[str, str]:
    return {name: (value or b"").decode() for name, value in headers}


def envelope(topic: str, schedule_id: str, **fields: Any) -> bytes:
    """A JSON-mode request; `countdown` 0 unless a series' `every` or another is given."""
    timing = fields if "every" in fields or "countdown" in fields else {"countdown": 0, **fields}
    return orjson.dumps({"topic": topic, "message": "m", "id": schedule_id, **timing})


def send(env: dict[str, str], value: bytes, headers: list[tuple[str, bytes | None]]) -> None:
    produce(env["KAFKA_BOOTSTRAP_SERVERS"], env["BLACKBOX_INTAKE_TOPIC"], [value],
            [(CALLER_HEADER, CALLER.encode()), *headers])  # fmt: skip


def test_kafka_intake_delivers_the_context_byte_for_byte(
    start_service: ServiceFactory, env: dict[str, str], reader: ReaderFactory
) -> None:
    """A JSON record written by kcat (librdkafka, as a non-Python producer would) and a
    header-mode record carry traceparent, tracestate and baggage to the delivered record
    unchanged; a malformed traceparent is dropped and counted, the message delivered and
    nothing dead-lettered."""
    service = start_service()
    target = unique("traced")
    kcat = shutil.which("kcat")
    assert kcat is not None, "kcat is installed by make setup"
    flags = [f for name, value in as_text(CONTEXT).items() for f in ("-H", f"{name}={value}")]
    subprocess.run([kcat, "-P", "-b", env["KAFKA_BOOTSTRAP_SERVERS"], "-t",
                    env["BLACKBOX_INTAKE_TOPIC"], "-H", f"{CALLER_HEADER}={CALLER}", *flags],
                   input=envelope(target, "by-kcat"), check=True, timeout=30)  # fmt: skip
    etf1 = [("scheduler-epoch", b"0"), ("scheduler-target-topic", target.encode())]
    produce(env["KAFKA_BOOTSTRAP_SERVERS"], env["BLACKBOX_INTAKE_TOPIC"], [b"raw"],
            [*etf1, *CONTEXT], key=b"by-header")  # fmt: skip
    send(env, envelope(target, "malformed"), [("traceparent", b"00-not-a-trace"),
                                              ("baggage", BAGGAGE)])  # fmt: skip
    records = {r.header("blackbox-id"): r for r in reader(target).wait_count(3)}
    assert context_of(records["@billing/by-kcat"]) == CONTEXT
    assert context_of(records["@/by-header"]) == CONTEXT
    assert context_of(records["@billing/malformed"]) == [("traceparent", None),
                                                         ("tracestate", None),
                                                         ("baggage", BAGGAGE)]  # fmt: skip
    dropped = "blackbox_trace_headers_dropped_total"
    assert service.metrics.value(dropped, {"header": "traceparent"}) == 1
    assert reader(env["BLACKBOX_DLQ_TOPIC"]).read_to_end() == []


def test_an_update_keeps_the_context_of_the_request_that_made_it(
    start_service: ServiceFactory, env: dict[str, str], reader: ReaderFactory
) -> None:
    """A new version of an id is delivered with its own request's context, not the first
    version's; one sent without a context is delivered without one."""
    start_service()
    target = unique("updated")
    other = f"00-{'1' * 32}-{'2' * 16}-01".encode()
    send(env, envelope(target, "a", countdown=3600), CONTEXT)
    send(env, envelope(target, "a", countdown=0), [("traceparent", other)])
    send(env, envelope(target, "b", countdown=3600), CONTEXT)
    send(env, envelope(target, "b", countdown=0), [])
    records = {r.header("blackbox-id"): r for r in reader(target).wait_count(2)}
    assert context_of(records["@billing/a"]) == [("traceparent", other), ("tracestate", None),
                                                 ("baggage", None)]  # fmt: skip
    assert context_of(records["@billing/b"]) == NONE


def test_the_api_the_client_and_send_carry_their_context(
    start_service: ServiceFactory, env: dict[str, str], reader: ReaderFactory, tmp_path: Path
) -> None:
    """The API takes the HTTP request's own trace headers; `blackbox.client` the current
    OpenTelemetry context of the code that calls it; `blackbox send` TRACEPARENT, TRACESTATE
    and BAGGAGE from its environment: each arrives on the delivered record byte for byte."""
    service = start_service(BLACKBOX_API_TOKEN=TOKEN)
    target = unique("ways-in")
    assert service.endpoints is not None
    with httpx.Client(base_url=f"http://127.0.0.1:{service.endpoints.port}") as http:
        answer = http.post("/api/v1/schedules", json={"caller": CALLER, "envelope": {
            "topic": target, "message": "m", "countdown": 0, "id": "by-api"}},
            headers={"Authorization": f"Bearer {TOKEN}", **as_text(CONTEXT)})  # fmt: skip
        assert answer.status_code == 202, answer.text
    producer_span = trace.NonRecordingSpan(trace.SpanContext(
        int(TRACE_ID, 16), int(SPAN_ID, 16), is_remote=True,
        trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED)))  # fmt: skip
    with trace.use_span(producer_span), Client(
        {"bootstrap.servers": env["KAFKA_BOOTSTRAP_SERVERS"]}, caller=CALLER,
        intake_topic=env["BLACKBOX_INTAKE_TOPIC"],
    ) as client:  # fmt: skip
        client.send_later(target, "m", delay=0, id="by-client")
    environ = {**env, **{name.upper(): value for name, value in as_text(CONTEXT).items()}}
    sender = BlackboxProcess(environ, tmp_path / "send.log", "send", "--topic", target,
                             "--countdown", "0", "--id", "by-send", "--caller", CALLER,
                             '"m"')  # fmt: skip
    assert sender.wait(60) == 0, sender.output()
    records = {r.header("blackbox-id"): r for r in reader(target).wait_count(3)}
    assert context_of(records["@billing/by-api"]) == CONTEXT
    assert context_of(records["@billing/by-send"]) == CONTEXT
    assert context_of(records["@billing/by-client"]) == [("traceparent", PARENT),
                                                         ("tracestate", None),
                                                         ("baggage", None)]  # fmt: skip


@pytest.fixture
def collector() -> Iterator[Collector]:
    started = Collector()
    yield started
    started.close()


def _value(span: Span, key: str) -> Any:
    for a in span.attributes:
        if a.key == key:
            kind = a.value.WhichOneof("value")
            return getattr(a.value, kind)
    raise KeyError(key)


def test_spans_are_exported_to_an_otlp_endpoint_following_the_producers_trace(
    start_service: ServiceFactory,
    env: dict[str, str],
    reader: ReaderFactory,
    collector: Collector,
    tmp_path: Path,
) -> None:
    """With OTEL_* set, `blackbox run` exports a receive span (the producer's child, linked
    to it), a fire span in the producer's trace whose context the delivered record carries,
    fire spans of a series' occurrences each in a trace of its own linked to the series'
    context, and a dead-letter span; log lines of a traced record carry its ids."""
    otel = {"OTEL_EXPORTER_OTLP_ENDPOINT": collector.endpoint, "OTEL_SERVICE_NAME": "bb-test",
            "OTEL_BSP_SCHEDULE_DELAY": "100"}  # fmt: skip
    # A message the producer refuses as too large is dead-lettered when it fires.
    limits = {"KAFKA_PRODUCER_MESSAGE_MAX_BYTES": "2000", "BLACKBOX_MAX_ATTEMPTS": "1"}
    process = BlackboxProcess({**env, **otel, **limits}, tmp_path / "run.log", "run")
    target = unique("exported")
    try:
        send(env, envelope(target, "once"), CONTEXT)
        send(env, envelope(target, "tick", every=1, limit=2), CONTEXT)
        send(env, b"{not json", CONTEXT)
        send(env, envelope(target, "huge", message="x" * 5000), CONTEXT)
        records = reader(target).wait_count(3, timeout=60)
        wait_until(lambda: len(collector.named("send")) >= 5, 30, "fire and dead-letter spans")
    finally:
        code = process.terminate()
    assert code == 0, process.output()[-3000:]
    once = next(r for r in records if r.header("blackbox-id") == "@billing/once")
    fires: dict[str, list[Span]] = {}
    for span in collector.named(f"send {target}"):
        fires.setdefault(_value(span, "messaging.message.id"), []).append(span)
    (fire,) = fires["@billing/once"]
    assert fire.trace_id.hex() == TRACE_ID and fire.parent_span_id.hex() == SPAN_ID
    assert fire.kind == Span.SPAN_KIND_PRODUCER
    assert once.header("traceparent") == f"00-{TRACE_ID}-{fire.span_id.hex()}-01"
    assert (once.headers["tracestate"], once.headers["baggage"]) == (STATE, BAGGAGE)
    assert _value(fire, "messaging.system") == "kafka"
    assert _value(fire, "messaging.destination.name") == target
    assert _value(fire, "messaging.operation.type") == "send"
    assert _value(fire, "blackbox.attempt") == 1
    assert _value(fire, "blackbox.lateness_ms") >= 0
    ticks = fires["@billing/tick"]
    assert len(ticks) == 2
    for tick in ticks:
        assert tick.parent_span_id == b"" and tick.trace_id.hex() != TRACE_ID
        assert [(link.trace_id.hex(), link.span_id.hex()) for link in tick.links] == [
            (TRACE_ID, SPAN_ID)
        ]
    receives = collector.named("receive ")
    assert len(receives) == 3  # once, tick, huge
    assert all(r.trace_id.hex() == TRACE_ID and r.parent_span_id.hex() == SPAN_ID
               for r in receives)  # fmt: skip
    assert {_value(r, "messaging.operation.type") for r in receives} == {"receive"}
    dead = {_value(span, "error.type"): span
            for span in collector.named(f"send {env['BLACKBOX_DLQ_TOPIC']}")}  # fmt: skip
    assert set(dead) == {"invalid_json", "record_too_large"}, "refused at intake, at firing"
    assert all(span.trace_id.hex() == TRACE_ID for span in dead.values())
    assert _value(dead["record_too_large"], "messaging.message.id") == "@billing/huge"
    assert dead["record_too_large"].parent_span_id.hex() == SPAN_ID
    lines = [json.loads(line) for line in process.output().splitlines() if line.startswith("{")]
    refusals = [line for line in lines if line.get("event") == "dead_lettered"]
    (refused,) = [line for line in refusals if line.get("reason") == "invalid_json"]
    assert (refused["trace_id"], refused["span_id"]) == (TRACE_ID, SPAN_ID)


def test_without_otel_variables_the_sdk_is_never_imported(env: dict[str, str]) -> None:
    """Free when off: a service started and stopped with no OTEL_* set loads no tracing
    SDK and no exporter, and starting it imports nothing of OpenTelemetry. (Libraries
    import parts of it where it is installed: redis-py 8 the SDK's metrics package, FastAPI
    the API's logs; blackbox imports it only once spans are asked for.)"""
    script = (
        "import os, sys\n"
        "from blackbox.kafka import clients\n"
        "from blackbox.service import Service\n"
        "from blackbox.settings import Settings\n"
        "def loaded(): return {m for m in sys.modules if m.startswith('opentelemetry')}\n"
        "before = loaded()\n"
        "settings = Settings.from_env(os.environ)\n"
        "clients.ensure_topics(settings.kafka, settings.own_topics)\n"
        "service = Service(settings, environ=os.environ)\n"
        "service.start()\n"
        "service.stop()\n"
        "tracing = [m for m in loaded() if m.startswith(('opentelemetry.sdk.trace',\n"
        "           'opentelemetry.exporter'))]\n"
        "print(sorted(loaded() - before), tracing)\n"
    )
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    done = subprocess.run([sys.executable, "-c", script], env={**clean, **env},
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[] []"
