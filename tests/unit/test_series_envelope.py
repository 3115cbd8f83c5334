"""A series as a record asks for it and as Redis keeps it: parsing is exact about what is
wrong (guarantee 4) and the stored form keeps the rule and where the series stands
(guarantee 8)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from blackbox import envelope
from blackbox.envelope import CALLER_HEADER, Envelope, Hold, Limits
from blackbox.errors import CorruptSchedule, DeadLetterReason, InvalidEnvelope
from blackbox.recurrence import Missed, Recurrence, fire
from blackbox.schedule import Schedule, Series

LIMITS = Limits(max_value_bytes=1_048_576, forbidden_topics=frozenset({"blackbox"}))
HEADERS = [(CALLER_HEADER, b"billing")]
BASE = {"id": "report", "topic": "reports", "message": "go"}
# 2026-11-25T12:00:00Z, a Wednesday.
RECEIVED_MS = 1_795_608_000_000
_R = DeadLetterReason


def _parse(document: dict[str, Any]) -> envelope.Request:
    return envelope.parse(orjson.dumps(document), HEADERS, LIMITS)


def _refused(document: dict[str, Any]) -> InvalidEnvelope:
    with pytest.raises(InvalidEnvelope) as refused:
        _parse(document)
    return refused.value


def test_a_series_envelope_carries_its_whole_rule() -> None:
    """Guarantee 8: every field of a series is read, with its unit (seconds to ms)."""
    request = _parse({**BASE, "cron": "0 9 * * 1-5", "timezone": "Europe/Berlin",
                      "start": "2026-12-01T00:00:00Z", "end": 1_830_000_000, "limit": 10,
                      "jitter": 1.5, "missed": "all", "grace": 30})  # fmt: skip

    assert isinstance(request, Envelope)
    assert request.countdown_ms is None and request.at_ms is None
    assert request.recurrence == Recurrence(
        timezone="Europe/Berlin", cron="0 9 * * 1-5", start_ms=1_796_083_200_000,
        end_ms=1_830_000_000_000, limit=10, jitter_ms=1500, missed=Missed.ALL, grace_ms=30_000,
    )  # fmt: skip


def test_defaults_are_utc_once_and_a_minute_of_grace() -> None:
    """Guarantee 8: without options a series runs in UTC, fires the latest missed
    occurrence once, and counts an occurrence missed after 60 s."""
    request = _parse({**BASE, "every": 60})
    assert isinstance(request, Envelope) and request.recurrence is not None
    assert request.recurrence.every_ms == 60_000
    assert request.recurrence.timezone == "UTC"
    assert request.recurrence.missed is Missed.ONCE
    assert request.recurrence.grace_ms == 60_000
    assert request.recurrence.jitter_ms == 0


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"cron": "61 * * * *"}, _R.INVALID_RECURRENCE),
        ({"cron": "0 0 30 2 *"}, _R.INVALID_RECURRENCE),
        ({"cron": "0 9 * * *", "every": 60}, _R.CONFLICTING_FIELDS),
        ({"every": 60, "countdown": 5}, _R.CONFLICTING_FIELDS),
        ({"every": 60, "deliver_at": 1_900_000_000}, _R.CONFLICTING_FIELDS),
        ({"timezone": "Europe/Berlin", "countdown": 5}, _R.CONFLICTING_FIELDS),
        ({"limit": 3}, _R.MISSING_FIELD),
        ({"every": 60, "timezone": "Mars/Olympus_Mons"}, _R.UNKNOWN_TIMEZONE),
        ({"every": 60, "timezone": "../../etc/passwd"}, _R.UNKNOWN_TIMEZONE),
        ({"every": 60, "timezone": 1}, _R.WRONG_TYPE),
        ({"every": 0.5}, _R.INVALID_RECURRENCE),
        ({"every": -60}, _R.INVALID_RECURRENCE),
        ({"every": "60"}, _R.WRONG_TYPE),
        ({"every": True}, _R.WRONG_TYPE),
        ({"every": 60, "limit": 0}, _R.INVALID_RECURRENCE),
        ({"every": 60, "limit": 2.5}, _R.WRONG_TYPE),
        ({"every": 60, "missed": "sometimes"}, _R.INVALID_RECURRENCE),
        ({"every": 60, "jitter": 86_401}, _R.INVALID_RECURRENCE),
        ({"every": 60, "start": "tomorrow"}, _R.INVALID_RECURRENCE),
        ({"every": 60, "end": [1]}, _R.WRONG_TYPE),
        (
            {"every": 60, "start": "2027-01-02T00:00:00Z", "end": "2027-01-01T00:00:00Z"},
            _R.INVALID_RECURRENCE,
        ),
        ({"cron": 9}, _R.WRONG_TYPE),
    ],
)
def test_a_bad_series_is_refused_with_its_reason(fields: dict[str, Any], reason: _R) -> None:
    """Guarantee 4: each way a series can be wrong is dead-lettered with a reason from the
    closed set, naming the field."""
    refused = _refused({**BASE, **fields})
    assert refused.reason is reason, refused.detail
    assert refused.schedule_id == "report"


def test_a_series_needs_an_id() -> None:
    """Guarantee 8: a series must be addressable, to update, pause or cancel it."""
    document = {"topic": "reports", "message": "go", "every": 60}
    assert _refused(document).reason is _R.MISSING_FIELD


@pytest.mark.parametrize(("verb", "paused"), [("pause", True), ("resume", False)])
def test_pause_and_resume_name_the_series(verb: str, paused: bool) -> None:
    """Guarantee 8: {"id": X, "pause": true} and {"id": X, "resume": true} hold and release X."""
    assert _parse({"id": "report", verb: True}) == Hold("report", b"billing", paused)
    assert _refused({"id": "report", verb: "yes"}).reason is _R.WRONG_TYPE
    assert _refused({verb: True}).reason is _R.MISSING_FIELD


def test_a_series_is_stored_due_at_its_first_occurrence() -> None:
    """Guarantee 8: a weekday-09:00 Berlin series received on a Wednesday at 12:00 UTC is
    first due on Thursday 08:00 UTC, and its stored form keeps the rule."""
    request = _parse({**BASE, "cron": "0 9 * * 1-5", "timezone": "Europe/Berlin", "limit": 3})
    assert isinstance(request, Envelope)
    schedule = Schedule.from_envelope(request, "intake:0:7", RECEIVED_MS, RECEIVED_MS)

    assert schedule.due_ms == 1_795_680_000_000  # 2026-11-26T08:00:00Z
    assert schedule.series == Series(request.recurrence, 1_795_680_000_000)  # type: ignore[arg-type]
    assert Schedule.decode(schedule.id, schedule.encode()) == schedule


def test_an_interval_counts_from_its_start_or_from_when_it_was_received() -> None:
    """Guarantee 8: `every` is anchored at `start` when given, else at the record's time."""
    plain = _parse({**BASE, "every": 60})
    started = _parse({**BASE, "every": 60, "start": RECEIVED_MS // 1000 + 30})
    assert isinstance(plain, Envelope) and isinstance(started, Envelope)

    assert Schedule.from_envelope(plain, "i:0:1", RECEIVED_MS, RECEIVED_MS).due_ms == RECEIVED_MS
    later = Schedule.from_envelope(started, "i:0:1", RECEIVED_MS, RECEIVED_MS)
    assert later.due_ms == RECEIVED_MS + 30_000


def test_a_series_whose_end_has_passed_is_refused() -> None:
    """Guarantee 4: a series with no occurrence left is dead-lettered, not stored."""
    request = _parse({**BASE, "every": 60, "start": 1_700_000_000, "end": 1_700_000_100})
    assert isinstance(request, Envelope)
    with pytest.raises(InvalidEnvelope) as refused:
        Schedule.from_envelope(request, "i:0:1", RECEIVED_MS, RECEIVED_MS)
    assert refused.value.reason is _R.INVALID_RECURRENCE


def test_the_paused_bit_is_the_flags_byte_the_scripts_flip() -> None:
    """Guarantee 8: pause sets bit 64 of byte 9 in place (intake.lua); the rest decodes alike."""
    rule = Recurrence(every_ms=60_000, anchor_ms=RECEIVED_MS)
    running = Schedule("@billing/r", "reports", b"go", RECEIVED_MS, b"billing", origin="i:0:1",
                       series=Series(rule, RECEIVED_MS, fired=2))  # fmt: skip
    raw = bytearray(running.encode())
    assert raw[0] == 2 and raw[9] & 32

    raw[9] |= 64
    held = Schedule.decode(running.id, bytes(raw))
    assert held.series == Series(rule, RECEIVED_MS, fired=2, paused=True)
    assert held.encode() == bytes(raw)


def test_a_corrupt_series_is_a_corrupt_schedule() -> None:
    """Guarantee 4: a stored series whose rule cannot be read is reported, not a crash."""
    rule = Recurrence(every_ms=60_000)
    schedule = Schedule("@/r", "t", b"v", 1, origin="i:0:1", series=Series(rule, 1))
    raw = schedule.encode().replace(b'"every_ms":60000', b'"every_ms":"x"  ')
    assert len(raw) == len(schedule.encode())

    with pytest.raises(CorruptSchedule):
        Schedule.decode("@/r", raw)


def test_an_occurrence_claimed_before_fires_whatever_the_missed_policy() -> None:
    """Guarantee 8: an occurrence whose replica died holding it (or whose delivery failed)
    comes back after the lease, later than a short grace: it was chosen to fire, so even
    `missed: skip` delivers it rather than skip it."""
    rule = Recurrence(every_ms=1000, anchor_ms=0, grace_ms=2000, missed=Missed.SKIP)
    late = 40_000  # claimed 30 s (a lease) after its due time, then reclaimed

    assert fire(rule, "@s/r", 10_000, 3, late).deliver is None
    retried = fire(rule, "@s/r", 10_000, 3, late, retried=True)
    assert (retried.deliver, retried.next, retried.fired) == (10_000, 11_000, 4)
