"""How a series is shown (API, admin page, CLI): its rule in the envelope's own terms and
its next occurrences, computed from the stored rule without a Redis call."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from blackbox.recurrence import Recurrence
from blackbox.schedule import Series

# A series' occurrences shown from the one stored (the next to fire) on.
NEXT_OCCURRENCES = 5


@dataclass(frozen=True, slots=True)
class Occurrence:
    """One occurrence of a series: its nominal instant, as epoch ms and RFC 3339 UTC, and
    when it falls due (its jitter added)."""

    occurrence_ms: int
    utc: str
    due_ms: int


@dataclass(frozen=True, slots=True)
class Rule:
    """A series' rule in the envelope's own terms (seconds; RFC 3339 UTC for start and end)."""

    cron: str | None
    every: float | None
    timezone: str
    start: str | None
    end: str | None
    limit: int | None
    jitter: float
    missed: str
    grace: float


@dataclass(frozen=True, slots=True)
class SeriesView:
    """Where a series stands: its rule, the occurrence stored (the next to fire), how many
    have fired, whether it is paused, and its next occurrences from the stored one on
    (within its limit and end; a paused series passes over those falling due while held)."""

    rule: Rule
    occurrence_ms: int
    fired: int
    paused: bool
    next: list[Occurrence]


def utc_text(at_ms: int) -> str:
    """An instant as RFC 3339 UTC, with milliseconds only when it has some."""
    moment = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=at_ms)
    fraction = f".{at_ms % 1000:03d}" if at_ms % 1000 else ""
    return moment.strftime("%Y-%m-%dT%H:%M:%S") + fraction + "Z"


def _seconds(ms: int | None) -> float | None:
    return None if ms is None else ms / 1000


def rule_of(rule: Recurrence) -> Rule:
    """A stored rule as a caller would write it in an envelope."""
    return Rule(
        cron=rule.cron, every=_seconds(rule.every_ms), timezone=rule.timezone,
        start=None if rule.start_ms is None else utc_text(rule.start_ms),
        end=None if rule.end_ms is None else utc_text(rule.end_ms), limit=rule.limit,
        jitter=rule.jitter_ms / 1000, missed=rule.missed.value, grace=rule.grace_ms / 1000,
    )  # fmt: skip


def series_view(schedule_id: str, series: Series, count: int = NEXT_OCCURRENCES) -> SeriesView:
    """A stored series as listed: its rule and its next `count` occurrences."""
    rule = series.rule
    upcoming = rule.upcoming(series.occurrence_ms, count, series.fired)
    occurrences = [Occurrence(at, utc_text(at), rule.due_of(schedule_id, at))
                   for at in upcoming]  # fmt: skip
    return SeriesView(rule_of(rule), series.occurrence_ms, series.fired, series.paused,
                      occurrences)  # fmt: skip
