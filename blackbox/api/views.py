"""Views: what the API answers and takes, as typed models (its OpenAPI document is made
from them), and how a stored schedule or series is shown in them (API, admin page, CLI).
Pure: no Redis, no broker."""

from __future__ import annotations

import base64
import enum
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from pydantic import BaseModel, ConfigDict, Field

from blackbox.recurrence import Recurrence
from blackbox.schedule import Schedule, Series, split_scoped

PREVIEW_CHARS = 80
# A series' occurrences shown from the one stored (the next to fire) on.
NEXT_OCCURRENCES = 5


@dataclass(frozen=True, slots=True)
class Occurrence:
    """One occurrence of a series: its nominal instant, as epoch ms, as RFC 3339 UTC and as
    RFC 3339 on the series' own wall clock with that zone's offset (`local`, e.g.
    2026-11-30T09:00:00+01:00 in Europe/Berlin), and when it falls due (its jitter added)."""

    occurrence_ms: int
    utc: str
    due_ms: int
    local: str


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


def local_text(at_ms: int, zone: ZoneInfo) -> str:
    """An instant as RFC 3339 on `zone`'s wall clock with its offset, with milliseconds only
    when it has some."""
    moment = (datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=at_ms)).astimezone(zone)
    return moment.isoformat(timespec="milliseconds" if at_ms % 1000 else "seconds")


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
    zone = rule.zone
    occurrences = [Occurrence(at, utc_text(at), rule.due_of(schedule_id, at), local_text(at, zone))
                   for at in upcoming]  # fmt: skip
    return SeriesView(rule_of(rule), series.occurrence_ms, series.fired, series.paused,
                      occurrences)  # fmt: skip


class State(enum.StrEnum):
    """Where a pending id is: waiting for its due time, or being produced right now."""

    PENDING = "pending"
    IN_FLIGHT = "in_flight"


class Kind(enum.StrEnum):
    """Which pending ids a listing keeps: every one, one-off schedules, or series."""

    ALL = "all"
    ONE_OFF = "one_off"
    SERIES = "series"


@dataclass(frozen=True, slots=True)
class Item:
    """One schedule in a listing; `series` is set for a recurring one."""

    blackbox_id: str
    caller: str | None
    id: str | None
    topic: str
    key: str | None
    due_ms: int
    attempt: int
    state: State
    size: int
    preview: str
    series: SeriesView | None = None


@dataclass(frozen=True, slots=True)
class HeaderView:
    """A header of the message to deliver: `value` when UTF-8 text, else `value_base64`."""

    name: str
    value: str | None
    value_base64: str | None


@dataclass(frozen=True, slots=True)
class Detail:
    """One schedule with its whole message."""

    item: Item
    value: str | None
    value_base64: str | None
    headers: list[HeaderView]


@dataclass(frozen=True, slots=True)
class Page:
    """A listing call's answer; `cursor` continues it (None at the end). A page may hold
    fewer items than asked while `cursor` is set: the call reached its read budget.
    `scanned` counts the ids the call read of the listed caller (of every caller where
    the listing names none, as only a token for every caller may)."""

    items: list[Item]
    cursor: str | None
    scanned: int


@dataclass(frozen=True, slots=True)
class Bucket:
    """How many pending ids fall due in [start_ms, start_ms + width)."""

    start_ms: int
    count: int


@dataclass(frozen=True, slots=True)
class Stats:
    """Counts for the page's charts and the gauges."""

    pending: int
    in_flight: int
    overdue: int
    earliest_due_ms: int | None
    at_ms: int
    per_minute: list[Bucket]
    per_hour: list[Bucket]
    per_day: list[Bucket]
    per_topic: dict[str, int]
    topic_sample: int


def _text(raw: bytes) -> str | None:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def preview(value: bytes) -> str:
    """The start of a message as text; binary shows as its size."""
    text = _text(value[: PREVIEW_CHARS * 4])
    if text is None:
        text = _text(value[: PREVIEW_CHARS * 4 - 3]) or f"<{len(value)} bytes binary>"
    return text[:PREVIEW_CHARS]


def item_of(schedule: Schedule, state: State, attempt: int, size: int | None = None) -> Item:
    scoped = split_scoped(schedule.id)
    caller = None if schedule.caller is None else schedule.caller.decode("utf-8", "replace")
    key = None if schedule.key is None else schedule.key.decode("utf-8", "replace")
    series = None if schedule.series is None else series_view(schedule.id, schedule.series)
    return Item(
        blackbox_id=schedule.id, caller=caller, id=None if scoped is None else scoped[1],
        topic=schedule.topic, key=key, due_ms=schedule.due_ms, attempt=attempt, state=state,
        size=len(schedule.value) if size is None else size, preview=preview(schedule.value),
        series=series,
    )  # fmt: skip


def detail_of(schedule: Schedule, state: State, attempt: int) -> Detail:
    text = _text(schedule.value)
    return Detail(
        item=item_of(schedule, state, attempt),
        value=text,
        value_base64=None if text is not None else base64.b64encode(schedule.value).decode(),
        headers=[_header(name, value) for name, value in schedule.headers],
    )


def _header(name: str, value: bytes | None) -> HeaderView:
    text = None if value is None else _text(value)
    binary = None if value is None or text is not None else base64.b64encode(value).decode()
    return HeaderView(name, text, binary)


class ErrorBody(BaseModel):
    error: str
    reason: str


class Answer(BaseModel):
    """What became of a cancel, a reschedule, a pause or a resume, as the events topic
    tells it."""

    outcome: str
    blackbox_id: str
    due_ms: int | None = None


class When(BaseModel):
    """A new due time: exactly one of `deliver_at` (RFC 3339 with an offset, or epoch
    seconds) and `countdown` (seconds from now)."""

    model_config = ConfigDict(extra="forbid")
    deliver_at: str | float | None = None
    countdown: float | None = None


class NewSchedule(BaseModel):
    """An intake envelope (as producers send it) and the CALLER_SERVICE to send it as.

    A one-off schedule: `topic`, `message` (or `message_base64`), `countdown` or
    `deliver_at`, optional `id`, `key`, `headers`. A series: an `id`, `topic`, `message`,
    and `cron` or `every` (seconds) instead of a due time, with optional `timezone` (IANA,
    default UTC), `start` and `end` (RFC 3339 or epoch seconds), `limit` (runs), `jitter`
    (seconds), `missed` (skip, once or all) and `grace` (seconds). Checked as the intake
    checks it."""

    model_config = ConfigDict(extra="forbid")
    caller: str | None = Field(default=None, min_length=1, max_length=255)
    envelope: dict[str, Any] = Field(examples=[
        {"topic": "invoices", "message": {"invoice": 42}, "countdown": 3600, "id": "inv-42"},
        {"id": "daily-report", "topic": "reports", "message": "run", "cron": "0 9 * * 1-5",
         "timezone": "Europe/Berlin", "missed": "once"},
    ])  # fmt: skip


class Created(BaseModel):
    """The id the schedule will have; its answer arrives on the events topic."""

    blackbox_id: str
    intake_topic: str


class LatenessBucket(BaseModel):
    le: str
    count: float


class Lateness(BaseModel):
    buckets: list[LatenessBucket]
