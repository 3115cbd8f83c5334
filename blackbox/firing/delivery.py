"""The record a schedule is delivered as: its value and key, the sender's headers, and
blackbox's own, to de-duplicate by (etf1's too, for a header-mode schedule)."""

from __future__ import annotations

from blackbox import tracing
from blackbox.envelope import CALLER_HEADER
from blackbox.kafka.outbox import Record
from blackbox.schedule import Schedule, origin_topic, split_scoped


def delivery_record(schedule: Schedule, attempt: int) -> Record:
    """The record produced to the target topic for one attempt at `schedule`."""
    headers = tracing.delivered_headers(schedule, attempt)  # trace context too
    if schedule.caller is not None:
        headers.append((CALLER_HEADER, schedule.caller))
    if schedule.sent_ms is not None:
        headers += _etf1_headers(schedule)
    headers += [
        ("blackbox-id", schedule.id.encode()),
        ("blackbox-due-ms", str(schedule.due_ms).encode()),
        ("blackbox-attempt", str(attempt).encode()),
    ]
    if schedule.origin is not None:
        headers.append(("blackbox-version", schedule.origin.encode()))
    if schedule.series is not None:
        headers.append(("blackbox-occurrence-ms", str(schedule.series.occurrence_ms).encode()))
    return Record(schedule.topic, schedule.value, schedule.key, headers, schedule.partition)


def _etf1_headers(schedule: Schedule) -> list[tuple[str, bytes | None]]:
    """What etf1's scheduler adds: the schedule's timestamp (s), its key and its topic."""
    scoped = split_scoped(schedule.id)
    key = scoped[1] if scoped is not None else schedule.id
    topic = origin_topic(schedule.origin or schedule.id)
    return [
        ("scheduler-timestamp", str((schedule.sent_ms or 0) // 1000).encode()),
        ("scheduler-key", key.encode()),
        ("scheduler-topic", topic.encode()),
    ]
