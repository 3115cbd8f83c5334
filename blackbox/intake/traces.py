"""An intake record's trace context: kept with its schedule, on its log lines, in its spans.

The record's own ``traceparent``, ``tracestate`` and ``baggage`` headers (tracecontext.py)
go with the schedule it asks for, replacing the message's headers of the same names; a
malformed one is dropped and counted (``blackbox_trace_headers_dropped``), the request
itself is taken as if it had none. Records without a context pay one pass over their
headers.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from contextlib import AbstractContextManager

import structlog

from blackbox import tracecontext, tracing
from blackbox.envelope import Header
from blackbox.metrics import Metrics
from blackbox.schedule import Schedule
from blackbox.storage.applying import Write

_UNTRACED = contextlib.nullcontext()


def context_of(headers: Sequence[Header] | None, metrics: Metrics) -> tracecontext.Carried:
    """The record's valid trace headers; the malformed ones counted."""
    if not headers:
        return tracecontext.NOTHING
    context = tracecontext.carried(headers)
    for name in context.dropped:
        metrics.trace_headers_dropped.labels(header=name).inc()
    return context


def traced(write: Write, context: tracecontext.Carried, where: tuple[str, int, int]) -> Write:
    """The write with the record's trace context: a schedule keeps it (an update the
    context of the record that made it); the receive span is recorded when spans are on."""
    if not context.headers or not isinstance(write, Schedule):
        return write
    write.headers = tracecontext.with_context(write.headers, context.headers)
    if tracing.active():
        tracing.received(*where, write.id, context.headers)
    return write


def logged(context: tracecontext.Carried) -> AbstractContextManager[object]:
    """Log lines written meanwhile carry the record's trace and span ids (the producer's);
    an untraced record enters a shared no-op (no generator per record on the hot path)."""
    parent = tracecontext.traceparent_of(context.headers) if context.headers else None
    if parent is None:
        return _UNTRACED
    trace_id, span_id = tracecontext.ids_of(parent)
    return structlog.contextvars.bound_contextvars(trace_id=trace_id, span_id=span_id)


def refused(dlq_topic: str, reason: str, headers: Sequence[Header] | None) -> None:
    """The dead-letter span of a refused record, when spans are on."""
    if tracing.active() and headers:
        tracing.dead_lettered(dlq_topic, reason, tracecontext.carried(headers).headers)
