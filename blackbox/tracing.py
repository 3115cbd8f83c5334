"""Spans, exported through the OpenTelemetry SDK and OTLP when the standard OTEL_* variables ask.

Off unless an ``OTEL_*`` variable is set (and ``OTEL_SDK_DISABLED`` / ``OTEL_TRACES_EXPORTER=
none`` do not say otherwise): then nothing here imports the SDK, and each hook is one check
of a module global. On, three short spans follow the messaging semantic conventions
(``messaging.system``, ``messaging.destination.name``, ``messaging.operation.type``,
``messaging.message.id`` = ``blackbox-id``); none lasts for a delay:

* ``receive <intake topic>`` (consumer): a request taken in, child of and linked to the
  producer's context;
* ``send <target topic>`` (producer): a message fired, child of the request's context (a
  series' occurrence: a new trace linked to the series' context, never its child), with the
  lateness and attempt; the delivered record carries its context, so the consumer's spans
  are its children;
* ``send <dead-letter topic>`` (producer): a refused request, child of its context.

The OpenTelemetry API is imported only once export is on (it comes with the SDK).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import structlog

from blackbox import tracecontext
from blackbox.clock import now_ms
from blackbox.envelope import Header
from blackbox.schedule import Schedule

log = structlog.get_logger("blackbox.tracing")
_DEFAULT_SERVICE = "blackbox"
_OFF = ("false", "none")
_state: dict[str, Any] = {"tracer": None, "provider": None}


def wanted(environ: Mapping[str, str]) -> bool:
    """Whether the environment asks for spans: any OTEL_* set, the SDK and traces not off."""
    if not any(name.startswith("OTEL_") for name in environ):
        return False
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    return environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() not in _OFF


def configure(environ: Mapping[str, str]) -> bool:
    """Start exporting spans if the environment asks (the SDK reads its own OTEL_*
    variables: endpoint, sampler, service name, batch sizes); True when on."""
    if not wanted(environ):
        return False
    try:
        provider = _provider(environ)
    except ImportError as e:  # installed without the otel extra
        log.warning("tracing_unavailable", error=str(e), hint="pip install 'blackbox[otel]'")
        return False
    install(provider)
    log.info("tracing_on", endpoint=environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"))
    return True


def install(provider: Any) -> None:
    """Record spans through `provider`: configure's, or a test's own (an in-memory one)."""
    _state["provider"], _state["tracer"] = provider, provider.get_tracer("blackbox")


def _provider(environ: Mapping[str, str]) -> Any:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # noqa: PLC0415
        OTLPSpanExporter,
    )
    from opentelemetry.sdk.resources import Resource  # noqa: PLC0415
    from opentelemetry.sdk.trace import TracerProvider  # noqa: PLC0415
    from opentelemetry.sdk.trace.export import BatchSpanProcessor  # noqa: PLC0415

    named = {} if environ.get("OTEL_SERVICE_NAME") else {"service.name": _DEFAULT_SERVICE}
    provider = TracerProvider(resource=Resource.create(named))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    return provider


def shutdown() -> None:
    """Export what is buffered and stop (at service stop)."""
    provider = _state["provider"]
    _state["provider"] = _state["tracer"] = None
    if provider is not None:
        provider.shutdown()


def active() -> bool:
    """Whether spans are exported."""
    return _state["tracer"] is not None


def received(
    topic: str, partition: int, offset: int, message_id: str, context: Sequence[Header]
) -> None:
    """The receive span of a request taken in (spans on only)."""
    tracer = _state["tracer"]
    if tracer is None:
        return
    attributes = _messaging(topic, "receive", message_id) | {
        "messaging.destination.partition.id": str(partition),
        "messaging.kafka.offset": offset,
    }
    _one_span(tracer, f"receive {topic}", "CONSUMER", attributes, context, parented=True)


def delivered_headers(schedule: Schedule, attempt: int) -> list[Header]:
    """The headers a schedule is delivered with: its own, trace context included; a
    series' occurrence never with the series' context as parent. With spans on, the fire
    span is recorded and its context replaces the stored parent."""
    tracer = _state["tracer"]
    if tracer is None:
        if schedule.series is None:
            return list(schedule.headers)
        return tracecontext.without_context(schedule.headers)
    return _fire(tracer, schedule, attempt, now_ms())


def _fire(tracer: Any, schedule: Schedule, attempt: int, now: int) -> list[Header]:
    from opentelemetry import trace  # noqa: PLC0415
    from opentelemetry.trace.propagation.tracecontext import (  # noqa: PLC0415
        TraceContextTextMapPropagator,
    )

    attributes = _messaging(schedule.topic, "send", schedule.id) | {
        "messaging.operation.name": "fire",
        "blackbox.lateness_ms": max(0, now - schedule.due_ms),
        "blackbox.attempt": attempt,
        "blackbox.due_ms": schedule.due_ms,
    }
    if schedule.series is not None:
        attributes["blackbox.occurrence_ms"] = schedule.series.occurrence_ms
    parented = schedule.series is None
    span = _one_span(tracer, f"send {schedule.topic}", "PRODUCER", attributes,
                     schedule.headers, parented=parented)  # fmt: skip
    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier, trace.set_span_in_context(span))
    injected = [(name, value.encode("ascii")) for name, value in carrier.items()]
    return [*tracecontext.without_context(schedule.headers), *injected]


def dead_lettered(
    topic: str, reason: str, context: Sequence[Header], message_id: str | None = None,
    *, parented: bool = True,
) -> None:  # fmt: skip
    """The span of a request refused, or a schedule given up when it fired, to the
    dead-letter topic (only with a context; a series' occurrence links to it, as it fires)."""
    tracer = _state["tracer"]
    if tracer is None or tracecontext.traceparent_of(context) is None:
        return
    attributes = _messaging(topic, "send", message_id) | {
        "messaging.operation.name": "dead_letter",
        "error.type": reason,
    }
    _one_span(tracer, f"send {topic}", "PRODUCER", attributes, context, parented=parented)


def _messaging(topic: str, operation: str, message_id: str | None) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "messaging.system": "kafka",
        "messaging.destination.name": topic,
        "messaging.operation.type": operation,
    }
    if message_id is not None:
        attributes["messaging.message.id"] = message_id
    return attributes


def _one_span(  # noqa: PLR0913 - a span's parts
    tracer: Any,
    name: str,
    kind: str,
    attributes: dict[str, Any],
    context: Sequence[Header],
    *,
    parented: bool,
) -> Any:
    """A span begun and ended now: child of the context's traceparent where `parented`,
    and linked to it in every case."""
    from opentelemetry import trace  # noqa: PLC0415
    from opentelemetry.context import Context  # noqa: PLC0415
    from opentelemetry.trace.propagation.tracecontext import (  # noqa: PLC0415
        TraceContextTextMapPropagator,
    )

    # Only a valid context (a message's own headers may name a traceparent of any bytes).
    valid = tracecontext.carried(context).headers
    carrier = {n: v.decode("ascii") for n, v in valid if v is not None and n != "baggage"}
    extracted = TraceContextTextMapPropagator().extract(carrier)
    linked = trace.get_current_span(extracted).get_span_context()
    links = [trace.Link(linked)] if linked.is_valid else []
    parent = extracted if parented else Context()
    span = tracer.start_span(
        name, context=parent, kind=trace.SpanKind[kind], attributes=attributes, links=links
    )
    span.end()
    return span
