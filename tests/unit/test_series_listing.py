"""How the API lists a series (guarantee 8): its rule in the envelope's own terms, and its
next occurrences as epoch ms, RFC 3339 UTC and RFC 3339 in its own zone, across a change of
the clock, within its limit, with its jitter; and which pending ids a listing of one kind
keeps."""

from __future__ import annotations

from dataclasses import asdict
from zoneinfo import ZoneInfo

import orjson

from blackbox import envelope
from blackbox.api.pending import Filter
from blackbox.api.views import Kind, local_text, rule_of, series_view, utc_text
from blackbox.envelope import CALLER_HEADER, Envelope, Limits
from blackbox.recurrence import Missed, Recurrence
from blackbox.schedule import Schedule, Series, first_occurrence

LIMITS = Limits(max_value_bytes=1_048_576, forbidden_topics=frozenset())
# 2027-03-26T00:00:00Z: Berlin springs forward (02:00 -> 03:00) on Sunday 2027-03-28.
BEFORE_SPRING_MS = 1_806_019_200_000


def test_next_occurrences_follow_the_zone_across_its_clock_change() -> None:
    """Guarantee 8: 02:30 in Berlin is listed at 01:30Z in winter, at the end of the gap
    (03:00 CEST, 01:00Z) on the day it does not exist, then at 00:30Z in summer."""
    rule = Recurrence(cron="30 2 * * *", timezone="Europe/Berlin")
    view = series_view("@billing/report", first_occurrence(rule, BEFORE_SPRING_MS))
    assert [o.utc for o in view.next] == [
        "2027-03-26T01:30:00Z", "2027-03-27T01:30:00Z", "2027-03-28T01:00:00Z",
        "2027-03-29T00:30:00Z", "2027-03-30T00:30:00Z",
    ]  # fmt: skip
    assert [o.occurrence_ms for o in view.next] == [
        1_806_024_600_000, 1_806_111_000_000, 1_806_195_600_000, 1_806_280_200_000,
        1_806_366_600_000,
    ]  # fmt: skip
    assert view.occurrence_ms == view.next[0].occurrence_ms
    assert (view.fired, view.paused) == (0, False)


def test_next_occurrences_are_also_shown_on_the_zones_own_clock() -> None:
    """Guarantee 8: a Berlin series' occurrences are listed beside their UTC instants at
    02:30 on Berlin's wall clock with its offset, +01:00 in winter and +02:00 in summer (and
    03:00 on the day 02:30 does not exist)."""
    rule = Recurrence(cron="30 2 * * *", timezone="Europe/Berlin")
    view = series_view("@billing/report", first_occurrence(rule, BEFORE_SPRING_MS))
    assert [o.local for o in view.next] == [
        "2027-03-26T02:30:00+01:00", "2027-03-27T02:30:00+01:00", "2027-03-28T03:00:00+02:00",
        "2027-03-29T02:30:00+02:00", "2027-03-30T02:30:00+02:00",
    ]  # fmt: skip


def test_local_text_is_rfc3339_with_the_zones_offset() -> None:
    """An instant on a zone's clock reads as RFC 3339 with that zone's offset (milliseconds
    only when there are some), and names the same instant as its UTC text."""
    new_york = ZoneInfo("America/New_York")
    assert local_text(BEFORE_SPRING_MS + 7, new_york) == "2027-03-25T20:00:00.007-04:00"
    assert local_text(0, ZoneInfo("UTC")) == "1970-01-01T00:00:00+00:00"


def test_only_the_runs_left_under_the_limit_are_listed() -> None:
    """With 2 of 3 runs fired, one occurrence is left to list; with all fired, none."""
    rule = Recurrence(every_ms=60_000, anchor_ms=BEFORE_SPRING_MS, limit=3)
    assert len(series_view("@a/s", Series(rule, BEFORE_SPRING_MS, fired=2)).next) == 1
    assert series_view("@a/s", Series(rule, BEFORE_SPRING_MS, fired=3)).next == []


def test_an_occurrence_is_due_at_its_own_jitter() -> None:
    """Each listed occurrence is due at its nominal instant plus the jitter firing adds."""
    rule = Recurrence(every_ms=3_600_000, anchor_ms=BEFORE_SPRING_MS, jitter_ms=600_000)
    view = series_view("@a/jittered", Series(rule, BEFORE_SPRING_MS, paused=True))
    delays = [o.due_ms - o.occurrence_ms for o in view.next]
    assert delays == [rule.jitter_of("@a/jittered", o.occurrence_ms) for o in view.next]
    assert all(0 <= d <= 600_000 for d in delays) and len(set(delays)) > 1
    assert view.paused


def test_a_listed_rule_sent_back_asks_for_the_same_rule() -> None:
    """The rule is listed in the envelope's terms (seconds, RFC 3339 UTC): sent back to the
    intake as it reads, it parses to the rule stored."""
    stored = Recurrence(cron="0 9 * * 1-5", timezone="America/New_York",
                        start_ms=BEFORE_SPRING_MS, end_ms=BEFORE_SPRING_MS + 86_400_500,
                        limit=10, jitter_ms=1_500, missed=Missed.ALL, grace_ms=30_000)  # fmt: skip
    listed = {k: v for k, v in asdict(rule_of(stored)).items() if v is not None}
    assert (listed["start"], listed["end"]) == ("2027-03-26T00:00:00Z", "2027-03-27T00:00:00.500Z")
    assert (listed["jitter"], listed["grace"], listed["missed"]) == (1.5, 30.0, "all")
    document = {"id": "r", "topic": "t", "message": "m", **listed}
    request = envelope.parse(orjson.dumps(document), [(CALLER_HEADER, b"c")], LIMITS)
    assert isinstance(request, Envelope)
    assert request.recurrence == stored


def test_utc_text_is_rfc3339_with_milliseconds_only_when_there_are_some() -> None:
    """Instants are written as RFC 3339 UTC ('Z'), as the intake reads them."""
    assert utc_text(0) == "1970-01-01T00:00:00Z"
    assert utc_text(BEFORE_SPRING_MS + 7) == "2027-03-26T00:00:00.007Z"


def test_a_listing_keeps_the_kind_it_asks_for() -> None:
    """kind=series keeps series alone, kind=one_off the rest, kind=all both."""
    rule = Recurrence(every_ms=60_000)
    one_off = Schedule("@a/once", "t", b"x", 1)
    series = Schedule("@a/many", "t", b"x", 1, series=Series(rule, 0))
    kept = {kind: [s.id for s in (one_off, series) if Filter(kind=kind).keeps(s)] for kind in Kind}
    assert kept == {Kind.ALL: ["@a/once", "@a/many"], Kind.ONE_OFF: ["@a/once"],
                    Kind.SERIES: ["@a/many"]}  # fmt: skip
