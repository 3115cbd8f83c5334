"""When a series' occurrences fall and what firing one does (Guarantee 8).

Every expected instant is a literal worked out by hand from the zones' offsets (New York
-05:00/-04:00, Berlin +01:00/+02:00, Lord Howe +10:30/+11:00) at their 2026-2027 changes.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from blackbox.recurrence import InvalidRecurrence, Missed, Recurrence, fire

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MINUTE = 60_000
NY, BERLIN, LORD_HOWE = "America/New_York", "Europe/Berlin", "Australia/Lord_Howe"


def ms(text: str) -> int:
    """Epoch ms of a literal "YYYY-MM-DDTHH:MM:SS[.fff]Z"."""
    return (datetime.fromisoformat(text) - EPOCH) // timedelta(milliseconds=1)


def iso(instant: int | None) -> str | None:
    """The literal of an epoch-ms instant, whole seconds (None stays None)."""
    if instant is None:
        return None
    return f"{EPOCH + timedelta(milliseconds=instant):%Y-%m-%dT%H:%M:%S}Z"


def isos(instants: list[int]) -> list[str | None]:
    return [iso(instant) for instant in instants]


# (zone, cron, from, the occurrences from there on): daily, hourly and */20 on both sides
# of each change. A gap's times fire once at its end; a repeated hour fires once, first.
@pytest.mark.parametrize(
    ("zone", "cron", "start", "expected"),
    [
        # New York, 2026-03-08 02:00 EST -> 03:00 EDT (07:00Z)
        (NY, "30 2 * * *", "2026-03-07T00:00:00Z", ["2026-03-07T07:30:00Z",
         "2026-03-08T07:00:00Z", "2026-03-09T06:30:00Z"]),
        (NY, "30 * * * *", "2026-03-08T05:00:00Z", ["2026-03-08T05:30:00Z",
         "2026-03-08T06:30:00Z", "2026-03-08T07:00:00Z", "2026-03-08T07:30:00Z"]),
        (NY, "*/20 * * * *", "2026-03-08T06:30:00Z", ["2026-03-08T06:40:00Z",
         "2026-03-08T07:00:00Z", "2026-03-08T07:20:00Z", "2026-03-08T07:40:00Z"]),
        # New York, 2026-11-01 02:00 EDT -> 01:00 EST (06:00Z)
        (NY, "30 1 * * *", "2026-10-31T00:00:00Z", ["2026-10-31T05:30:00Z",
         "2026-11-01T05:30:00Z", "2026-11-02T06:30:00Z"]),
        (NY, "30 * * * *", "2026-11-01T04:00:00Z", ["2026-11-01T04:30:00Z",
         "2026-11-01T05:30:00Z", "2026-11-01T07:30:00Z", "2026-11-01T08:30:00Z"]),
        (NY, "*/20 * * * *", "2026-11-01T05:30:00Z", ["2026-11-01T05:40:00Z",
         "2026-11-01T07:00:00Z", "2026-11-01T07:20:00Z"]),
        # New York, 2027-03-14 (07:00Z): 02:00 to 03:00 fire once, at 07:00Z
        (NY, "0 2 * * *", "2027-03-13T00:00:00Z", ["2027-03-13T07:00:00Z",
         "2027-03-14T07:00:00Z", "2027-03-15T06:00:00Z"]),
        (NY, "15 * * * *", "2027-03-14T06:00:00Z", ["2027-03-14T06:15:00Z",
         "2027-03-14T07:00:00Z", "2027-03-14T07:15:00Z"]),
        (NY, "*/20 * * * *", "2027-03-14T06:50:00Z", ["2027-03-14T07:00:00Z",
         "2027-03-14T07:20:00Z"]),
        # New York, 2027-11-07 (06:00Z)
        (NY, "45 1 * * *", "2027-11-06T00:00:00Z", ["2027-11-06T05:45:00Z",
         "2027-11-07T05:45:00Z", "2027-11-08T06:45:00Z"]),
        (NY, "0 * * * *", "2027-11-07T04:30:00Z", ["2027-11-07T05:00:00Z",
         "2027-11-07T07:00:00Z", "2027-11-07T08:00:00Z"]),
        (NY, "*/20 * * * *", "2027-11-07T05:50:00Z", ["2027-11-07T07:00:00Z",
         "2027-11-07T07:20:00Z"]),
        # Berlin, 2026-03-29 02:00 CET -> 03:00 CEST (01:00Z)
        (BERLIN, "30 2 * * *", "2026-03-28T00:00:00Z", ["2026-03-28T01:30:00Z",
         "2026-03-29T01:00:00Z", "2026-03-30T00:30:00Z"]),
        (BERLIN, "30 * * * *", "2026-03-28T23:00:00Z", ["2026-03-28T23:30:00Z",
         "2026-03-29T00:30:00Z", "2026-03-29T01:00:00Z", "2026-03-29T01:30:00Z"]),
        (BERLIN, "*/20 * * * *", "2026-03-29T00:30:00Z", ["2026-03-29T00:40:00Z",
         "2026-03-29T01:00:00Z", "2026-03-29T01:20:00Z"]),
        # Berlin, 2026-10-25 03:00 CEST -> 02:00 CET (01:00Z)
        (BERLIN, "30 2 * * *", "2026-10-24T00:00:00Z", ["2026-10-24T00:30:00Z",
         "2026-10-25T00:30:00Z", "2026-10-26T01:30:00Z"]),
        (BERLIN, "30 * * * *", "2026-10-24T23:00:00Z", ["2026-10-24T23:30:00Z",
         "2026-10-25T00:30:00Z", "2026-10-25T02:30:00Z"]),
        (BERLIN, "*/20 * * * *", "2026-10-25T00:30:00Z", ["2026-10-25T00:40:00Z",
         "2026-10-25T02:00:00Z", "2026-10-25T02:20:00Z"]),
        # Berlin, 2027-03-28 (01:00Z): 02:00 and 03:00 are one instant, fired once
        (BERLIN, "0 2 * * *", "2027-03-27T00:00:00Z", ["2027-03-27T01:00:00Z",
         "2027-03-28T01:00:00Z", "2027-03-29T00:00:00Z"]),
        (BERLIN, "0 * * * *", "2027-03-27T23:30:00Z", ["2027-03-28T00:00:00Z",
         "2027-03-28T01:00:00Z", "2027-03-28T02:00:00Z"]),
        (BERLIN, "*/20 * * * *", "2027-03-28T00:45:00Z", ["2027-03-28T01:00:00Z",
         "2027-03-28T01:20:00Z"]),
        # Berlin, 2027-10-31 (01:00Z)
        (BERLIN, "15 2 * * *", "2027-10-30T00:00:00Z", ["2027-10-30T00:15:00Z",
         "2027-10-31T00:15:00Z", "2027-11-01T01:15:00Z"]),
        (BERLIN, "0 * * * *", "2027-10-30T23:30:00Z", ["2027-10-31T00:00:00Z",
         "2027-10-31T02:00:00Z"]),
        (BERLIN, "*/20 * * * *", "2027-10-31T00:50:00Z", ["2027-10-31T02:00:00Z",
         "2027-10-31T02:20:00Z"]),
        # Lord Howe, 2026-04-05 02:00 +11 -> 01:30 +10:30 (2026-04-04T15:00Z)
        (LORD_HOWE, "45 1 * * *", "2026-04-03T00:00:00Z", ["2026-04-03T14:45:00Z",
         "2026-04-04T14:45:00Z", "2026-04-05T15:15:00Z"]),
        (LORD_HOWE, "30 * * * *", "2026-04-04T13:00:00Z", ["2026-04-04T13:30:00Z",
         "2026-04-04T14:30:00Z", "2026-04-04T16:00:00Z"]),
        (LORD_HOWE, "*/20 * * * *", "2026-04-04T14:30:00Z", ["2026-04-04T14:40:00Z",
         "2026-04-04T15:30:00Z", "2026-04-04T15:50:00Z"]),
        # Lord Howe, 2026-10-04 02:00 +10:30 -> 02:30 +11 (2026-10-03T15:30Z)
        (LORD_HOWE, "15 2 * * *", "2026-10-02T00:00:00Z", ["2026-10-02T15:45:00Z",
         "2026-10-03T15:30:00Z", "2026-10-04T15:15:00Z"]),
        (LORD_HOWE, "15 * * * *", "2026-10-03T14:00:00Z", ["2026-10-03T14:45:00Z",
         "2026-10-03T15:30:00Z", "2026-10-03T16:15:00Z"]),
        (LORD_HOWE, "*/20 * * * *", "2026-10-03T15:00:00Z", ["2026-10-03T15:10:00Z",
         "2026-10-03T15:30:00Z", "2026-10-03T15:40:00Z", "2026-10-03T16:00:00Z"]),
        # Lord Howe, 2027-04-04 (2027-04-03T15:00Z)
        (LORD_HOWE, "30 1 * * *", "2027-04-02T00:00:00Z", ["2027-04-02T14:30:00Z",
         "2027-04-03T14:30:00Z", "2027-04-04T15:00:00Z"]),
        (LORD_HOWE, "0 * * * *", "2027-04-03T13:30:00Z", ["2027-04-03T14:00:00Z",
         "2027-04-03T15:30:00Z", "2027-04-03T16:30:00Z"]),
        (LORD_HOWE, "*/20 * * * *", "2027-04-03T14:50:00Z", ["2027-04-03T15:30:00Z",
         "2027-04-03T15:50:00Z"]),
        # Lord Howe, 2027-10-03 (2027-10-02T15:30Z)
        (LORD_HOWE, "0 2 * * *", "2027-10-01T00:00:00Z", ["2027-10-01T15:30:00Z",
         "2027-10-02T15:30:00Z", "2027-10-03T15:00:00Z"]),
        (LORD_HOWE, "30 * * * *", "2027-10-02T14:30:00Z", ["2027-10-02T15:00:00Z",
         "2027-10-02T15:30:00Z", "2027-10-02T16:30:00Z"]),
        (LORD_HOWE, "*/20 * * * *", "2027-10-02T15:20:00Z", ["2027-10-02T15:30:00Z",
         "2027-10-02T15:40:00Z"]),
    ],
)  # fmt: skip
def test_cron_across_clock_changes(zone: str, cron: str, start: str, expected: list[str]) -> None:
    """Guarantee 8: a cron series follows its zone's wall clock through each change: a time
    in a gap fires at the gap's end (once, however many fall in it), a repeated time fires
    at its first occurrence only."""
    rule = Recurrence(cron=cron, timezone=zone)
    assert isos(rule.upcoming(ms(start), len(expected))) == expected


# (zone, the occurrences from the anchor, the first, on): 20 real minutes, whatever the clock.
@pytest.mark.parametrize(
    ("zone", "expected"),
    [
        (NY, ["2026-03-08T06:50:00Z", "2026-03-08T07:10:00Z", "2026-03-08T07:30:00Z"]),
        (NY, ["2026-11-01T05:40:00Z", "2026-11-01T06:00:00Z", "2026-11-01T06:20:00Z",
              "2026-11-01T06:40:00Z", "2026-11-01T07:00:00Z"]),
        (NY, ["2027-03-14T06:45:00Z", "2027-03-14T07:05:00Z", "2027-03-14T07:25:00Z"]),
        (NY, ["2027-11-07T05:50:00Z", "2027-11-07T06:10:00Z", "2027-11-07T06:30:00Z",
              "2027-11-07T06:50:00Z", "2027-11-07T07:10:00Z"]),
        (BERLIN, ["2026-03-29T00:50:00Z", "2026-03-29T01:10:00Z", "2026-03-29T01:30:00Z"]),
        (BERLIN, ["2026-10-25T00:40:00Z", "2026-10-25T01:00:00Z", "2026-10-25T01:20:00Z",
                  "2026-10-25T01:40:00Z", "2026-10-25T02:00:00Z"]),
        (BERLIN, ["2027-03-28T00:50:00Z", "2027-03-28T01:10:00Z", "2027-03-28T01:30:00Z"]),
        (BERLIN, ["2027-10-31T00:30:00Z", "2027-10-31T00:50:00Z", "2027-10-31T01:10:00Z",
                  "2027-10-31T01:30:00Z", "2027-10-31T01:50:00Z"]),
        (LORD_HOWE, ["2026-04-04T14:40:00Z", "2026-04-04T15:00:00Z", "2026-04-04T15:20:00Z",
                     "2026-04-04T15:40:00Z"]),
        (LORD_HOWE, ["2026-10-03T15:10:00Z", "2026-10-03T15:30:00Z", "2026-10-03T15:50:00Z"]),
        (LORD_HOWE, ["2027-04-03T14:50:00Z", "2027-04-03T15:10:00Z", "2027-04-03T15:30:00Z"]),
        (LORD_HOWE, ["2027-10-02T15:20:00Z", "2027-10-02T15:40:00Z", "2027-10-02T16:00:00Z"]),
    ],
)  # fmt: skip
def test_every_counts_real_time_across_clock_changes(zone: str, expected: list[str]) -> None:
    """Guarantee 8: an `every` series stays 20 real minutes apart through each change, asked
    from before its anchor, from between two occurrences, and one by one."""
    anchor = ms(expected[0])
    rule = Recurrence(every_ms=20 * MINUTE, anchor_ms=anchor, timezone=zone)
    assert isos(rule.upcoming(anchor - 7 * MINUTE, len(expected))) == expected
    assert isos(rule.upcoming(anchor + 1, len(expected) - 1)) == expected[1:]
    assert iso(rule.after(ms(expected[-2]))) == expected[-1]


@pytest.mark.parametrize(
    ("zone", "cron", "at", "first", "before"),
    [
        # From the second 01:10 (01:15, 01:35, 02:45) of a repeated hour: not run again.
        (NY, "*/20 * * * *", "2026-11-01T06:10:00Z", "2026-11-01T07:00:00Z",
         "2026-11-01T05:40:00Z"),
        (NY, "30 * * * *", "2026-11-01T06:15:00Z", "2026-11-01T07:30:00Z",
         "2026-11-01T05:30:00Z"),
        (LORD_HOWE, "*/20 * * * *", "2026-04-04T15:05:00Z", "2026-04-04T15:30:00Z",
         "2026-04-04T14:40:00Z"),
        (BERLIN, "30 * * * *", "2026-10-25T01:45:00Z", "2026-10-25T02:30:00Z",
         "2026-10-25T00:30:00Z"),
        # At a gap's end and just after it.
        (NY, "30 * * * *", "2026-03-08T07:10:00Z", "2026-03-08T07:30:00Z",
         "2026-03-08T07:00:00Z"),
        (LORD_HOWE, "*/20 * * * *", "2026-10-03T15:35:00Z", "2026-10-03T15:40:00Z",
         "2026-10-03T15:30:00Z"),
        (BERLIN, "0 * * * *", "2027-03-28T01:00:00Z", "2027-03-28T01:00:00Z",
         "2027-03-28T00:00:00Z"),
    ],
)  # fmt: skip
def test_first_and_before_around_changes(
    zone: str, cron: str, at: str, first: str, before: str
) -> None:
    """Guarantee 8: first() (at or after) and before() (the latest strictly before) agree
    with the occurrences upcoming() lists, also asked from inside a repeated hour."""
    rule = Recurrence(cron=cron, timezone=zone)
    assert (iso(rule.first(ms(at))), iso(rule.before(ms(at)))) == (first, before)


@pytest.mark.parametrize(
    ("cron", "zone", "start", "expected"),
    [
        ("0 9 * * 1-5", BERLIN, "2026-11-28T12:00:00Z",  # a Saturday
         ["2026-11-30T08:00:00Z", "2026-12-01T08:00:00Z", "2026-12-02T08:00:00Z",
          "2026-12-03T08:00:00Z", "2026-12-04T08:00:00Z", "2026-12-07T08:00:00Z"]),
        ("0 9 * * 0", BERLIN, "2026-11-28T12:00:00Z",
         ["2026-11-29T08:00:00Z", "2026-12-06T08:00:00Z"]),
        ("0 9 * * 7", BERLIN, "2026-11-28T12:00:00Z",
         ["2026-11-29T08:00:00Z", "2026-12-06T08:00:00Z"]),
        ("0 9 * * sat,sun", NY, "2026-11-27T00:00:00Z",
         ["2026-11-28T14:00:00Z", "2026-11-29T14:00:00Z", "2026-12-05T14:00:00Z"]),
        # The 15th (a Wednesday) OR a Monday: both fields restricted.
        ("0 12 15 * 1", "UTC", "2026-07-01T00:00:00Z",
         ["2026-07-06T12:00:00Z", "2026-07-13T12:00:00Z", "2026-07-15T12:00:00Z",
          "2026-07-20T12:00:00Z"]),
        # A leading seconds field: second 30 of every 15th minute.
        ("30 */15 * * * *", BERLIN, "2026-06-01T10:00:31Z",
         ["2026-06-01T10:15:30Z", "2026-06-01T10:30:30Z"]),
        ("@daily", NY, "2026-03-07T12:00:00Z", ["2026-03-08T05:00:00Z", "2026-03-09T04:00:00Z"]),
        ("@hourly", BERLIN, "2026-10-25T00:10:00Z",
         ["2026-10-25T02:00:00Z", "2026-10-25T03:00:00Z"]),
        ("@weekly", "UTC", "2026-11-28T12:00:00Z",
         ["2026-11-29T00:00:00Z", "2026-12-06T00:00:00Z"]),
        ("@monthly", BERLIN, "2026-10-15T00:00:00Z",
         ["2026-10-31T23:00:00Z", "2026-11-30T23:00:00Z"]),
    ],
)  # fmt: skip
def test_debian_cron_syntax(cron: str, zone: str, start: str, expected: list[str]) -> None:
    """Guarantee 8: Debian cron's reading: 1-5 is Mon-Fri, 0 and 7 are Sunday, day-of-month
    OR day-of-week when both are restricted, an optional leading seconds field, macros."""
    rule = Recurrence(cron=cron, timezone=zone)
    assert isos(rule.upcoming(ms(start), len(expected))) == expected


def test_start_end_and_before() -> None:
    """Guarantee 8: no occurrence before start nor after end (end included); before() is
    strictly earlier, within start and end."""
    daily = Recurrence(cron="0 9 * * *", timezone=BERLIN, start_ms=ms("2026-06-03T07:00:00Z"),
                       end_ms=ms("2026-06-05T12:00:00Z"))  # fmt: skip
    assert isos(daily.upcoming(ms("2026-06-01T00:00:00Z"), 9)) == [
        "2026-06-03T07:00:00Z", "2026-06-04T07:00:00Z", "2026-06-05T07:00:00Z"]  # fmt: skip
    assert iso(daily.after(ms("2026-06-01T07:00:00Z"))) == "2026-06-03T07:00:00Z"
    assert daily.after(ms("2026-06-05T07:00:00Z")) is None
    assert daily.before(ms("2026-06-03T07:00:00Z")) is None
    assert iso(daily.before(ms("2026-06-04T07:00:00Z"))) == "2026-06-03T07:00:00Z"
    assert iso(daily.before(ms("2026-06-04T07:00:00.001Z"))) == "2026-06-04T07:00:00Z"
    assert iso(daily.before(ms("2026-07-01T00:00:00Z"))) == "2026-06-05T07:00:00Z"
    every = Recurrence(every_ms=10 * MINUTE, anchor_ms=ms("2026-06-01T00:00:00Z"),
                       end_ms=ms("2026-06-01T00:30:00Z"))  # fmt: skip
    assert isos(every.upcoming(ms("2026-06-01T00:00:00Z"), 9))[-2:] == [
        "2026-06-01T00:20:00Z", "2026-06-01T00:30:00Z"]  # fmt: skip
    assert every.first(ms("2026-06-01T00:30:00.001Z")) is None
    assert every.before(ms("2026-06-01T00:00:00Z")) is None
    assert iso(every.before(ms("2026-06-01T00:20:00Z"))) == "2026-06-01T00:10:00Z"
    assert iso(every.before(ms("2026-06-02T00:00:00Z"))) == "2026-06-01T00:30:00Z"


def test_limit() -> None:
    """Guarantee 8: after `limit` occurrences delivered the series completes (next None)."""
    rule = Recurrence(every_ms=10 * MINUTE, anchor_ms=ms("2026-06-01T00:00:00Z"), limit=3)
    assert isos(rule.upcoming(ms("2026-06-01T00:00:00Z"), 9, fired=1)) == [
        "2026-06-01T00:00:00Z", "2026-06-01T00:10:00Z"]  # fmt: skip
    on_time = ms("2026-06-01T00:10:00Z")
    assert iso(fire(rule, "s", on_time, 1, on_time).next) == "2026-06-01T00:20:00Z"
    assert firing(rule, "2026-06-01T00:10:00Z", "2026-06-01T00:10:00Z", 2) == (
        "2026-06-01T00:10:00Z", None, 3, False)  # fmt: skip
    once = Recurrence(cron="0 9 * * *", timezone=BERLIN, limit=1)
    assert firing(once, "2026-06-01T07:00:00Z", "2026-06-04T12:00:00Z", 0) == (
        "2026-06-04T07:00:00Z", None, 1, True)  # fmt: skip


def test_jitter_is_stable_and_bounded() -> None:
    """Guarantee 8: jitter is 0..jitter ms, the same each time for one id and occurrence,
    spread over occurrences and ids; no jitter asked, none given."""
    rule = Recurrence(every_ms=10 * MINUTE, jitter_ms=5 * MINUTE)
    occurrences = range(0, 500 * 10 * MINUTE, 10 * MINUTE)
    first = [rule.jitter_of("series-a", at) for at in occurrences]
    again = Recurrence(every_ms=10 * MINUTE, jitter_ms=5 * MINUTE)
    assert first == [again.jitter_of("series-a", at) for at in occurrences]
    assert all(0 <= jitter <= 5 * MINUTE for jitter in first)
    assert len(set(first)) > 450
    assert first != [rule.jitter_of("series-b", at) for at in occurrences]
    one = Recurrence(every_ms=10 * MINUTE, jitter_ms=1)
    assert {one.jitter_of("series-a", at) for at in occurrences} == {0, 1}
    none = Recurrence(every_ms=10 * MINUTE)
    assert {none.jitter_of("series-a", at) for at in occurrences} == {0}


def test_jitter_moves_the_due_time_missed_is_judged_by() -> None:
    """Guarantee 8: an occurrence is missed when occurrence + jitter is more than grace
    before now; the occurrence itself, not the jittered time, is delivered."""
    rule = Recurrence(every_ms=10 * MINUTE, jitter_ms=5 * MINUTE, missed=Missed.SKIP)
    at = ms("2026-06-01T00:30:00Z")
    jitter = rule.jitter_of("s", at)
    assert jitter > 0
    kept = fire(rule, "s", at, 0, at + 60_000 + jitter)
    assert (iso(kept.deliver), iso(kept.next), kept.skipped) == (
        "2026-06-01T00:30:00Z", "2026-06-01T00:40:00Z", False)  # fmt: skip
    assert fire(rule, "s", at, 0, at + 60_000 + jitter + 1).deliver is None


def firing(rule: Recurrence, stored: str, now: str, fired: int = 4) -> tuple[object, ...]:
    """(deliver, next, fired, skipped) of claiming `stored` at `now`, instants as literals."""
    result = fire(rule, "s", ms(stored), fired, ms(now))
    return iso(result.deliver), iso(result.next), result.fired, result.skipped


EVERY_10 = {"every_ms": 10 * MINUTE, "anchor_ms": ms("2026-05-01T00:00:00Z")}
DAILY_9 = {"cron": "0 9 * * *", "timezone": BERLIN}  # 07:00Z in June


@pytest.mark.parametrize(
    ("series", "missed", "stored", "now", "expected"),
    [
        # Every 10 min, claimed at 00:40:30 (grace 60 s): 00:00 to 00:30 missed, 00:40 not.
        (EVERY_10, Missed.SKIP, "2026-06-01T00:00:00Z", "2026-06-01T00:40:30Z",
         (None, "2026-06-01T00:40:00Z", 4, True)),
        (EVERY_10, Missed.ONCE, "2026-06-01T00:00:00Z", "2026-06-01T00:40:30Z",
         ("2026-06-01T00:30:00Z", "2026-06-01T00:40:00Z", 5, True)),
        (EVERY_10, Missed.ONCE, "2026-06-01T00:30:00Z", "2026-06-01T00:40:30Z",
         ("2026-06-01T00:30:00Z", "2026-06-01T00:40:00Z", 5, False)),
        (EVERY_10, Missed.ALL, "2026-06-01T00:00:00Z", "2026-06-01T00:40:30Z",
         ("2026-06-01T00:00:00Z", "2026-06-01T00:10:00Z", 5, False)),
        (EVERY_10, Missed.ALL, "2026-05-31T00:40:00Z", "2026-06-01T00:40:00Z",
         ("2026-05-31T00:40:00Z", "2026-05-31T00:50:00Z", 5, False)),  # 24 h old exactly
        (EVERY_10, Missed.ALL, "2026-05-31T00:30:00Z", "2026-06-01T00:35:30Z",
         (None, "2026-05-31T00:40:00Z", 4, True)),  # older than 24 h
        # Daily 09:00 Berlin, claimed on 2026-06-04 at 14:00 local: the 1st to the 4th missed.
        (DAILY_9, Missed.SKIP, "2026-06-01T07:00:00Z", "2026-06-04T12:00:00Z",
         (None, "2026-06-05T07:00:00Z", 4, True)),
        (DAILY_9, Missed.ONCE, "2026-06-01T07:00:00Z", "2026-06-04T12:00:00Z",
         ("2026-06-04T07:00:00Z", "2026-06-05T07:00:00Z", 5, True)),
        (DAILY_9, Missed.ALL, "2026-06-01T07:00:00Z", "2026-06-04T12:00:00Z",
         (None, "2026-06-04T07:00:00Z", 4, True)),
        (DAILY_9, Missed.ALL, "2026-06-04T07:00:00Z", "2026-06-04T12:00:00Z",
         ("2026-06-04T07:00:00Z", "2026-06-05T07:00:00Z", 5, False)),
        # Hourly :30 in New York, stored 00:30 EDT, claimed at 01:16 EST: 01:30 EDT is
        # the latest missed, 02:30 EST the next (no second 01:30).
        ({"cron": "30 * * * *", "timezone": NY}, Missed.ONCE, "2026-11-01T04:30:00Z",
         "2026-11-01T06:16:00Z", ("2026-11-01T05:30:00Z", "2026-11-01T07:30:00Z", 5, True)),
    ],
)  # fmt: skip
def test_missed_policies(
    series: dict[str, Any], missed: Missed, stored: str, now: str, expected: tuple[object]
) -> None:
    """Guarantee 8: skip delivers nothing and resumes at the first occurrence at or after
    now - grace; once delivers the latest missed; all the stored one, none older than 24 h."""
    assert firing(Recurrence(**series, missed=missed), stored, now) == expected


@pytest.mark.parametrize("missed", list(Missed))
def test_grace_boundary(missed: Missed) -> None:
    """Guarantee 8: claimed exactly grace after its due time an occurrence is on time, under
    every policy; 1 ms later it is missed (skip passes over it)."""
    rule = Recurrence(every_ms=10 * MINUTE, missed=missed)
    assert firing(rule, "2026-06-01T00:30:00Z", "2026-06-01T00:31:00Z") == (
        "2026-06-01T00:30:00Z", "2026-06-01T00:40:00Z", 5, False)  # fmt: skip
    late = firing(rule, "2026-06-01T00:30:00Z", "2026-06-01T00:31:00.001Z")
    delivered = None if missed is Missed.SKIP else "2026-06-01T00:30:00Z"
    assert late[:2] == (delivered, "2026-06-01T00:40:00Z")


@pytest.mark.parametrize(
    ("series", "stored", "now", "delivered", "following"),
    [
        (EVERY_10, "2026-06-01T00:00:00Z", "2026-06-01T00:35:30Z",
         ["2026-06-01T00:00:00Z", "2026-06-01T00:10:00Z", "2026-06-01T00:20:00Z",
          "2026-06-01T00:30:00Z"], "2026-06-01T00:40:00Z"),
        # Across New York's gap: 02:00-03:00 collapse into 03:00 EDT, delivered once.
        ({"cron": "*/20 * * * *", "timezone": NY}, "2026-03-08T06:40:00Z",
         "2026-03-08T07:30:30Z",
         ["2026-03-08T06:40:00Z", "2026-03-08T07:00:00Z", "2026-03-08T07:20:00Z"],
         "2026-03-08T07:40:00Z"),
    ],
)  # fmt: skip
def test_missed_all_catches_up_oldest_first(
    series: dict[str, Any], stored: str, now: str, delivered: list[str], following: str
) -> None:
    """Guarantee 8: `all` delivers each missed occurrence once, oldest first, one per claim."""
    rule = Recurrence(**series, missed=Missed.ALL)
    seen: list[str | None] = []
    at: int | None = ms(stored)
    while at is not None and at <= ms(now):
        result = fire(rule, "s", at, len(seen), ms(now))
        seen.append(iso(result.deliver))
        at = result.next
    assert (seen, iso(at)) == (delivered, following)


@pytest.mark.parametrize(
    ("series", "now", "following"),
    [
        (EVERY_10, "2026-06-01T00:30:00Z", "2026-06-01T00:40:00Z"),
        (EVERY_10, "2026-06-01T00:35:30Z", "2026-06-01T00:40:00Z"),
        ({"cron": "30 * * * *", "timezone": NY}, "2026-03-08T06:45:00Z", "2026-03-08T07:00:00Z"),
    ],
)
def test_paused(series: dict[str, Any], now: str, following: str) -> None:
    """Guarantee 8: a paused series delivers nothing and moves to the first occurrence after
    now, its count unchanged."""
    result = fire(Recurrence(**series), "s", ms("2026-03-01T00:00:00Z"), 2, ms(now), paused=True)
    assert (result.deliver, iso(result.next), result.fired, result.skipped) == (
        None, following, 2, True)  # fmt: skip


@pytest.mark.parametrize(
    ("fields", "zone_error"),
    [
        ({"cron": "61 * * * *"}, False),
        ({"cron": "* * * *"}, False),
        ({"cron": "0 9 * * 8"}, False),
        ({"cron": "0 0 30 2 *"}, False),  # 30 February never comes
        ({"cron": "@fortnightly"}, False),
        ({"cron": "0 0 * * *", "timezone": "Mars/Olympus"}, True),
        ({"every_ms": 60_000, "timezone": "../../etc/passwd"}, True),
        ({"cron": "0 0 * * *", "every_ms": 60_000}, False),
        ({}, False),
        ({"every_ms": 60_000, "start_ms": 2_000, "end_ms": 1_999}, False),
        ({"every_ms": 60_000, "limit": 0}, False),
        ({"every_ms": 999}, False),
        ({"every_ms": 60_000, "jitter_ms": 86_400_001}, False),
        ({"every_ms": 60_000, "jitter_ms": -1}, False),
        ({"every_ms": 60_000, "grace_ms": -1}, False),
    ],
)
def test_invalid_rules(fields: dict[str, Any], zone_error: bool) -> None:
    """Guarantees 4 and 8: a rule that cannot be followed is refused as InvalidRecurrence,
    an unknown time zone marked as such."""
    with pytest.raises(InvalidRecurrence) as refused:
        Recurrence(**fields)
    assert refused.value.timezone is zone_error


def test_bounds_of_valid_rules() -> None:
    """Guarantee 8: the bounds themselves are accepted: every 1 s, a day of jitter, limit 1,
    end equal to start."""
    edge = Recurrence(every_ms=1000, jitter_ms=86_400_000, limit=1, start_ms=5000, end_ms=5000)
    assert edge.upcoming(0, 3) == [5000]


def test_an_occurrence_beyond_the_horizon_ends_the_series() -> None:
    """Guarantee 8: a leap-day rule fires 2096-02-29, then its next occurrence (2104-02-29,
    eight years on: 2100 is no leap year) lies beyond a five-year horizon: the occurrence
    due is delivered and the series ends (`beyond_horizon`) instead of being stored. The
    four-year step before it stays within, and without a horizon nothing changes."""
    rule = Recurrence(cron="0 0 29 2 *")
    five_years = 5 * 365 * 86_400_000
    now = ms("2092-02-29T00:00:30Z")
    kept = fire(rule, "s", ms("2092-02-29T00:00:00Z"), 0, now, horizon_ms=five_years)
    assert (iso(kept.next), kept.beyond_horizon) == ("2096-02-29T00:00:00Z", False)
    now = ms("2096-02-29T00:00:30Z")
    ended = fire(rule, "s", ms("2096-02-29T00:00:00Z"), 1, now, horizon_ms=five_years)
    assert (iso(ended.deliver), ended.next, ended.fired, ended.beyond_horizon) == (
        "2096-02-29T00:00:00Z", None, 2, True)  # fmt: skip
    unbounded = fire(rule, "s", ms("2096-02-29T00:00:00Z"), 1, now)
    assert iso(unbounded.next) == "2104-02-29T00:00:00Z"


def test_the_horizon_counts_the_jitter_of_the_next_occurrence() -> None:
    """Guarantee 8: the horizon bounds the next occurrence's due time, jitter included (the
    time its payload is kept for), not only its nominal instant."""
    rule = Recurrence(every_ms=60_000, jitter_ms=30_000)
    jitter = rule.jitter_of("s", ms("2026-06-01T00:01:00Z"))
    assert jitter > 0
    now = ms("2026-06-01T00:00:00Z")
    ahead = 60_000 + jitter
    assert fire(rule, "s", now, 0, now, horizon_ms=ahead).next is not None
    assert fire(rule, "s", now, 0, now, horizon_ms=ahead - 1).beyond_horizon
