"""Spans when asked (the SDK's in-memory exporter here; tests/integration/test_tracing.py
has a real OTLP endpoint): the messaging conventions' names, the producer's trace continued,
a series' occurrences linked to it, never its children. Off, the headers are the stored ones."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from blackbox import tracecontext, tracing
from blackbox.envelope import Header
from blackbox.recurrence import Recurrence
from blackbox.schedule import Schedule, Series

TRACE_ID, SPAN_ID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
PARENT = f"00-{TRACE_ID}-{SPAN_ID}-01".encode()
CONTEXT: tuple[Header, ...] = (("traceparent", PARENT), ("tracestate", b"rojo=1"),
                               ("baggage", b"user=alice"))  # fmt: skip


def one_off(headers: tuple[Header, ...] = CONTEXT) -> Schedule:
    return Schedule("@billing/inv-1", "invoices", b"{}", 10_000, headers=(("x", b"1"), *headers))


def occurrence() -> Schedule:
    series = Series(Recurrence(every_ms=60_000), occurrence_ms=10_000, fired=3)
    return Schedule("@billing/daily", "reports", b"run", 10_000, headers=CONTEXT, series=series)


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.install(provider)
    yield exporter
    tracing.shutdown()


def only(exporter: InMemorySpanExporter) -> ReadableSpan:
    (span,) = exporter.get_finished_spans()
    return span


@pytest.mark.parametrize(
    ("environ", "wanted"),
    [
        ({}, False),
        ({"PATH": "/bin", "KAFKA_BOOTSTRAP_SERVERS": "k:9092"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
        ({"OTEL_SERVICE_NAME": "blackbox"}, True),
        ({"OTEL_SERVICE_NAME": "blackbox", "OTEL_SDK_DISABLED": "true"}, False),
        ({"OTEL_SERVICE_NAME": "blackbox", "OTEL_TRACES_EXPORTER": "none"}, False),
    ],
)
def test_spans_are_wanted_only_when_an_otel_variable_asks(
    environ: dict[str, str], wanted: bool
) -> None:
    """Free when off: no OTEL_* variable, no SDK; the SDK's own off switches are obeyed."""
    assert tracing.wanted(environ) is wanted


def test_off_a_schedule_is_delivered_with_its_stored_context() -> None:
    """The delivered headers are the stored ones, byte for byte; a series' occurrence
    carries no parent (traceparent, tracestate), only its baggage."""
    assert not tracing.active()
    assert tracing.delivered_headers(one_off(), attempt=1) == [("x", b"1"), *CONTEXT]
    assert tracing.delivered_headers(occurrence(), attempt=1) == [("baggage", b"user=alice")]


def test_the_fire_span_continues_the_producers_trace(spans: InMemorySpanExporter) -> None:
    """The fire span is the producer's child, with the conventions' attributes, lateness and
    attempt; the delivered record carries its context (same trace, its span) and the baggage."""
    delivered = dict(tracing.delivered_headers(one_off(), attempt=2))
    span = only(spans)
    assert span.name == "send invoices" and span.kind is SpanKind.PRODUCER
    assert f"{span.context.trace_id:032x}" == TRACE_ID
    assert span.parent is not None and f"{span.parent.span_id:016x}" == SPAN_ID
    assert [f"{link.context.span_id:016x}" for link in span.links] == [SPAN_ID]
    attributes = dict(span.attributes or {})
    assert attributes["messaging.system"] == "kafka"
    assert attributes["messaging.destination.name"] == "invoices"
    assert attributes["messaging.operation.type"] == "send"
    assert attributes["messaging.message.id"] == "@billing/inv-1"
    assert attributes["blackbox.attempt"] == 2
    assert isinstance(attributes["blackbox.lateness_ms"], int)
    assert delivered["traceparent"] == f"00-{TRACE_ID}-{span.context.span_id:016x}-01".encode()
    assert delivered["tracestate"] == b"rojo=1"
    assert delivered["baggage"] == b"user=alice"


def test_an_occurrence_links_to_the_series_context(spans: InMemorySpanExporter) -> None:
    """Each occurrence starts its own trace, linked to the series' context, never its child."""
    delivered = dict(tracing.delivered_headers(occurrence(), attempt=1))
    span = only(spans)
    assert span.parent is None
    assert f"{span.context.trace_id:032x}" != TRACE_ID
    assert [f"{link.context.trace_id:032x}" for link in span.links] == [TRACE_ID]
    parent = delivered["traceparent"]
    assert parent is not None and tracecontext.ids_of(parent)[0] == f"{span.context.trace_id:032x}"
    assert dict(span.attributes or {})["blackbox.occurrence_ms"] == 10_000


def test_receive_and_dead_letter_spans(spans: InMemorySpanExporter) -> None:
    """A request taken in: a consumer span, child of and linked to the producer's; one
    refused: a span for its dead letter, with the reason as error.type."""
    tracing.received("blackbox", 2, 41, "@billing/inv-1", CONTEXT)
    tracing.dead_lettered("blackbox-dlq", "invalid_json", CONTEXT)
    receive, dead = spans.get_finished_spans()
    assert receive.kind is SpanKind.CONSUMER and receive.name == "receive blackbox"
    assert f"{receive.context.trace_id:032x}" == TRACE_ID
    assert receive.parent is not None and f"{receive.parent.span_id:016x}" == SPAN_ID
    attributes = dict(receive.attributes or {})
    assert attributes["messaging.operation.type"] == "receive"
    assert attributes["messaging.destination.partition.id"] == "2"
    assert attributes["messaging.kafka.offset"] == 41
    assert [f"{link.context.span_id:016x}" for link in receive.links] == [SPAN_ID]
    assert dead.name == "send blackbox-dlq" and f"{dead.context.trace_id:032x}" == TRACE_ID
    assert dict(dead.attributes or {})["error.type"] == "invalid_json"


def test_a_messages_own_unreadable_traceparent_never_breaks_firing(
    spans: InMemorySpanExporter,
) -> None:
    """A message's own `headers` may name a traceparent of any bytes (a JSON envelope's):
    firing starts a new trace for it instead of failing, and delivers the fire span's."""
    schedule = one_off(headers=(("traceparent", "00-é".encode()),))
    delivered = dict(tracing.delivered_headers(schedule, attempt=1))
    span = only(spans)
    assert span.parent is None and span.links == ()
    parent = delivered["traceparent"]
    assert parent is not None
    assert tracecontext.ids_of(parent) == (f"{span.context.trace_id:032x}",
                                           f"{span.context.span_id:016x}")  # fmt: skip
