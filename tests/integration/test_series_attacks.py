"""Hostile and careless series requests that once broke a replica or got a wrong answer:
each test pins one defect found by attacking a running service."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
import redis

from blackbox.clock import now_ms
from blackbox.dev.servers import RedisServer
from blackbox.envelope import CALLER_HEADER, Limits, parse
from blackbox.errors import DeadLetterReason, InvalidEnvelope
from blackbox.recurrence import InvalidRecurrence, Recurrence
from blackbox.schedule import Schedule, first_occurrence, scoped_id
from blackbox.storage.applying import Applied, Cancellation, Holding, IntakeSlice, Write
from blackbox.storage.keys import Layout
from blackbox.storage.store import Advance, RedisStore
from tests.kafkatools import unique

LIMITS = Limits(max_value_bytes=1_048_576, forbidden_topics=frozenset())
CALLER = [(CALLER_HEADER, b"svc")]
SERIES_ID = scoped_id(b"svc", "tick")


def _series_record(**fields: object) -> bytes:
    return orjson.dumps({"id": "tick", "topic": "orders", "message": "m", **fields})


def test_a_cron_too_long_to_store_is_refused_at_parsing() -> None:
    """Guarantee 4: a series record within the size limit either stores or is refused with
    a reason; its encoding never raises where the intake no longer catches it."""
    cron = ",".join(["0"] * 40_000) + " * * * *"
    try:
        request = parse(_series_record(cron=cron), CALLER, LIMITS)
        schedule = Schedule.from_envelope(request, "in:0:0", now_ms(), now_ms())  # type: ignore[arg-type]
    except InvalidEnvelope as e:
        assert e.reason is DeadLetterReason.INVALID_RECURRENCE
        return
    schedule.encode()


@pytest.mark.parametrize("zone", ["A" * 300, "Europe"])
def test_a_zone_name_too_long_or_naming_a_folder_is_an_unknown_timezone(zone: str) -> None:
    """Guarantee 4: any time zone text that names no zone is `unknown_timezone`."""
    with pytest.raises(InvalidEnvelope) as refused:
        parse(_series_record(every=60, timezone=zone), CALLER, LIMITS)
    assert refused.value.reason is DeadLetterReason.UNKNOWN_TIMEZONE


@pytest.mark.skipif(
    not Path("/usr/share/zoneinfo/right/Europe/Berlin").exists(),
    reason="the system's zoneinfo has no right/ zones",
)
def test_a_leap_second_zone_is_refused_or_keeps_the_zones_wall_clock() -> None:
    """Guarantee 8: a series in a zone fires at that zone's wall-clock time, or the zone is
    refused; it never fires an hour early."""
    winter_ms = 1_795_608_000_000  # 2026-11-25T12:00Z, standard time in Berlin
    try:
        right = Recurrence(timezone="right/Europe/Berlin", cron="0 9 * * *")
    except InvalidRecurrence:
        return
    assert right.first(winter_ms) == Recurrence(timezone="Europe/Berlin", cron="0 9 * * *").first(
        winter_ms
    )


@pytest.fixture
def store(redis_server: RedisServer) -> Iterator[RedisStore]:
    client = redis.Redis.from_url(redis_server.url)
    yield RedisStore(client, Layout(unique("ns")), grace_seconds=60)
    client.close()


def test_a_series_cancelled_while_in_flight_answers_cancelled_to_later_requests(
    store: RedisStore,
) -> None:
    """Guarantee 8: once a cancel ended a series whose occurrence is being produced, a
    repeated cancel and a pause both answer `cancelled`, as they do after the occurrence
    is settled; nothing claims the series is paused."""
    offsets = iter(range(100))

    def send(write: Write) -> Applied:
        offset = next(offsets)
        (code,) = store.apply([IntakeSlice("in", 0, offset, [(offset, write)])], now_ms())
        return code

    series = first_occurrence(Recurrence(every_ms=1000), now_ms())
    send(Schedule(SERIES_ID, "orders", b"v", series.occurrence_ms, b"svc", origin="in:0:0",
                  series=series))  # fmt: skip
    claim = store.claim_due(now_ms() + 5, 10, 30_000)
    assert claim.ids == [SERIES_ID]
    assert send(Cancellation(SERIES_ID)) is Applied.CANCELLED

    while_in_flight = [send(Cancellation(SERIES_ID)), send(Holding(SERIES_ID, b"svc", True))]
    store.advance([Advance(SERIES_ID, None)], claim.token, now_ms())

    assert while_in_flight == [Applied.CANCELLED, Applied.CANCELLED]
