"""Recurring schedules on the real stack (guarantee 8): each occurrence delivered with its
own header, a limit ends the series, pause and resume hold it, a cancel ends it, and the
events topic tells each occurrence."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import orjson
import pytest

from blackbox.envelope import CALLER_HEADER
from tests.integration.conftest import ReaderFactory, ServiceFactory, settle
from tests.kafkatools import Received, TopicReader, now_ms, produce, unique, wait_until

pytestmark = pytest.mark.both_store_modes  # the storage-touching tests: both modes

CALLER = "billing"


def _send(env: dict[str, str], document: dict[str, Any]) -> None:
    produce(
        env["KAFKA_BOOTSTRAP_SERVERS"],
        env["BLACKBOX_INTAKE_TOPIC"],
        [orjson.dumps(document)],
        [(CALLER_HEADER, CALLER.encode())],
    )


def _outcomes(events: TopicReader, series_id: str) -> list[str]:
    found = []
    for record in sorted(events.records, key=lambda r: (r.partition, r.offset)):
        event = orjson.loads(record.value or b"{}")
        if event["id"] == series_id:
            found.append(event["outcome"])
    return found


def _occurrences(records: Sequence[Received]) -> list[int]:
    return [int(r.header("blackbox-occurrence-ms")) for r in records]


def test_an_every_second_series_delivers_exactly_its_limit(
    start_service: ServiceFactory, reader: ReaderFactory, env: dict[str, str]
) -> None:
    """Guarantee 8: `every: 1, limit: 3` delivers exactly three occurrences, one second
    apart, each under the series' id with its own occurrence; then `completed`."""
    service = start_service()
    target, events = reader(unique("series")), reader(env["BLACKBOX_EVENTS_TOPIC"])
    _send(env, {"id": "tick", "topic": target.topic, "message": "t", "every": 1, "limit": 3})

    records = target.wait_count(3, timeout=30)
    events.wait_for(lambda _: "completed" in _outcomes(events, "tick"))
    settle(service)

    occurrences = _occurrences(target.read_to_end())
    assert len(occurrences) == 3
    assert [b - a for a, b in itertools.pairwise(occurrences)] == [1000, 1000]
    assert {r.header("blackbox-id") for r in records} == {f"@{CALLER}/tick"}
    assert [r.value for r in records] == [b"t"] * 3
    assert _outcomes(events, "tick") == ["scheduled", "fired", "fired", "fired", "completed"]


def test_pause_holds_a_series_and_resume_skips_nothing_due_after_it(
    start_service: ServiceFactory, reader: ReaderFactory, env: dict[str, str]
) -> None:
    """Guarantee 8: a paused series delivers nothing; resumed, it delivers every occurrence
    due from then on; a cancel ends it."""
    start_service()
    target, events = reader(unique("held")), reader(env["BLACKBOX_EVENTS_TOPIC"])
    _send(env, {"id": "held", "topic": target.topic, "message": "h", "every": 1})
    target.wait_count(1, timeout=30)
    _send(env, {"id": "held", "pause": True})
    events.wait_for(lambda _: "paused" in _outcomes(events, "held"))
    paused_at = now_ms()
    # Long enough for three occurrences to fall due while paused.
    wait_until(lambda: now_ms() > paused_at + 3500, 10, "three occurrences paused")
    before_resume = len(target.read_to_end())
    _send(env, {"id": "held", "resume": True})
    events.wait_for(lambda _: "resumed" in _outcomes(events, "held"))
    resumed_at = now_ms()
    target.wait_count(before_resume + 3, timeout=30)
    _send(env, {"id": "held", "cancel": True})
    events.wait_for(lambda _: "cancelled" in _outcomes(events, "held"))

    records = target.read_to_end()
    held = [o for o in _occurrences(records) if paused_at + 1000 < o < resumed_at - 1000]
    after = sorted(o for o in _occurrences(records) if o > resumed_at + 1000)
    assert held == [], "nothing is delivered while paused"
    assert after == list(range(after[0], after[-1] + 1, 1000)), "no gap after resume"
    last = len(records)
    stop_at = now_ms()
    wait_until(lambda: now_ms() > stop_at + 2500, 10, "two periods after the cancel")
    assert len(target.read_to_end()) <= last + 1, "a cancelled series stops"


def test_bad_series_are_dead_lettered_with_their_reasons(
    start_service: ServiceFactory, reader: ReaderFactory, env: dict[str, str]
) -> None:
    """Guarantee 4: a bad cron, an unknown zone, an end before its start, a pause of a
    one-off schedule and a reschedule of a series each get a clear answer; the service
    goes on."""
    start_service()
    dlq, events = reader(env["BLACKBOX_DLQ_TOPIC"]), reader(env["BLACKBOX_EVENTS_TOPIC"])
    target = unique("bad")
    _send(env, {"id": "a", "topic": target, "message": "x", "cron": "61 * * * *"})
    _send(env, {"id": "b", "topic": target, "message": "x", "every": 60, "timezone": "Mars/X"})
    _send(env, {"id": "c", "topic": target, "message": "x", "every": 60,
                "start": "2027-01-02T00:00:00Z", "end": "2027-01-01T00:00:00Z"})  # fmt: skip
    _send(env, {"id": "d", "topic": target, "message": "x", "every": 60, "countdown": 5})
    _send(env, {"id": "e", "topic": target, "message": "x", "countdown": 600})
    _send(env, {"id": "e", "pause": True})
    _send(env, {"id": "f", "topic": target, "message": "x", "every": 3600, "start": 2_000_000_000})
    _send(env, {"id": "f", "reschedule": True, "countdown": 1})

    letters = dlq.wait_count(4, timeout=30)
    reasons = sorted(r.header("blackbox-dlq-reason") for r in letters)
    assert reasons == [
        "conflicting_fields", "invalid_recurrence", "invalid_recurrence", "unknown_timezone"
    ]  # fmt: skip
    events.wait_for(lambda _: "not_recurring" in _outcomes(events, "e"))
    # A series moves by its rule: a reschedule of one changes nothing.
    events.wait_for(lambda _: "recurring" in _outcomes(events, "f"))
    assert _outcomes(events, "f") == ["scheduled", "recurring"]
