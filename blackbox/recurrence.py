"""Recurring schedules: when each occurrence of a series falls, and what firing one does.

Pure, no I/O. A series is a `Recurrence` (the rule the caller sent) plus where it stands
(the occurrence stored next, how many have fired, whether it is paused).

Calendar rules (``cron``) are read in the series' time zone, on its wall clock:

* a local time that does not exist (the clock springs forward over it) fires at the first
  instant after the gap: the day is not skipped, and several such times fire once;
* a local time that happens twice (the clock falls back) fires once, at its first
  occurrence; the hour repeated is not run again.

Interval rules (``every``) count real seconds from their anchor (``start``, else the time
the series was received): every 20 minutes stays 20 minutes apart across any change of
the clock. Each occurrence may be delayed by a ``jitter`` derived from the series id and
the occurrence, so computing it again gives the same instant.

The cron arithmetic is cronsim's (Debian cron's syntax: day-of-month OR day-of-week,
``L``, ``#``, an optional leading seconds field); the zone arithmetic is zoneinfo's.
"""

from __future__ import annotations

import enum
import functools
import hashlib
import itertools
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from cronsim import CronSim, CronSimError

# Missed occurrences older than this are not fired by `missed: all`, whatever the policy.
CATCH_UP_WINDOW_MS = 86_400_000
DEFAULT_GRACE_MS = 60_000
# The most jitter a series may ask for: a day.
MAX_JITTER_MS = 86_400_000
# The shortest interval: one occurrence per second at most, as cron's finest field.
MIN_EVERY_MS = 1000
# The longest cron text read: far beyond any real rule, and small enough to store.
MAX_CRON_CHARS = 1000
# Names the zone database answers that are no IANA zone: the host's own clock setting, a
# placeholder zone, a rules file.
_NOT_ZONES = frozenset({"localtime", "Factory", "posixrules"})
# Wall-clock candidates looked at for one occurrence: a cron rule maps at most a few
# (those falling in one gap or one repeated hour) onto instants already passed.
_MAX_CANDIDATES = 10_000
_MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_SECOND = timedelta(seconds=1)


class Missed(enum.StrEnum):
    """What firing does with occurrences that fell due while nothing could fire them."""

    SKIP = "skip"  # none of them: go on with the next one not missed
    ONCE = "once"  # the latest of them, then go on
    ALL = "all"  # each, oldest first, within CATCH_UP_WINDOW_MS


class InvalidRecurrence(ValueError):
    """A rule that cannot be followed; `timezone` marks an unknown time zone."""

    def __init__(self, detail: str, *, timezone: bool = False) -> None:
        super().__init__(detail)
        self.timezone = timezone


@dataclass(frozen=True, slots=True)
class Recurrence:
    """When a series' occurrences fall: a `cron` rule in `timezone`, or one every
    `every_ms` from `anchor_ms`; none before `start_ms` nor after `end_ms`, at most `limit`
    fired. An occurrence claimed more than `grace_ms` after its due time was missed."""

    timezone: str = "UTC"
    cron: str | None = None
    every_ms: int | None = None
    anchor_ms: int = 0
    start_ms: int | None = None
    end_ms: int | None = None
    limit: int | None = None
    jitter_ms: int = 0
    missed: Missed = Missed.ONCE
    grace_ms: int = DEFAULT_GRACE_MS

    def __post_init__(self) -> None:
        if (self.cron is None) == (self.every_ms is None):
            raise InvalidRecurrence("give one of cron and every")
        _zone(self.timezone)
        if self.cron is not None:
            if len(self.cron) > MAX_CRON_CHARS:
                raise InvalidRecurrence(f"cron is over {MAX_CRON_CHARS} characters")
            _check_cron(self.cron)
        if self.every_ms is not None and self.every_ms < MIN_EVERY_MS:
            raise InvalidRecurrence(f"every must be at least {MIN_EVERY_MS // 1000} s")
        if self.start_ms is not None and self.end_ms is not None and self.end_ms < self.start_ms:
            raise InvalidRecurrence("end is before start")
        if self.limit is not None and self.limit < 1:
            raise InvalidRecurrence("limit must be at least 1")
        if not 0 <= self.jitter_ms <= MAX_JITTER_MS:
            raise InvalidRecurrence(f"jitter must be 0-{MAX_JITTER_MS // 1000} s")
        if self.grace_ms < 0:
            raise InvalidRecurrence("grace must be >= 0")

    @property
    def zone(self) -> ZoneInfo:
        """The series' time zone, whose wall clock its times are shown on."""
        return _zone(self.timezone)

    # --- occurrences (nominal instants, epoch ms) ---

    def first(self, at_ms: int) -> int | None:
        """The first occurrence at or after `at_ms` (and `start`); None past `end`."""
        at_ms = max(at_ms, self.start_ms or at_ms)
        if self.every_ms is not None:
            steps = max(0, -(-(at_ms - self.anchor_ms) // self.every_ms))
            return self._within(self.anchor_ms + steps * self.every_ms)
        return self.after(at_ms - 1)

    def after(self, occurrence_ms: int) -> int | None:
        """The first occurrence strictly after `occurrence_ms`; None past `end`."""
        if self.every_ms is not None:
            if occurrence_ms < self.anchor_ms:
                return self.first(self.anchor_ms)
            return self.first(occurrence_ms + 1)
        floor = max(occurrence_ms, (self.start_ms or occurrence_ms + 1) - 1)
        zone = _zone(self.timezone)
        for wall in _cron(self.cron or "", _wall(floor, zone).replace(microsecond=0)):
            instant = _instant(wall, zone)
            if instant > floor:
                return self._within(instant)
        return None

    def before(self, at_ms: int) -> int | None:
        """The latest occurrence strictly before `at_ms` (at or after `start`), or None."""
        if self.every_ms is not None:
            steps = (at_ms - 1 - self.anchor_ms) // self.every_ms
            latest = self.anchor_ms + steps * self.every_ms
            found = latest if steps >= 0 else None
        else:
            found = self._cron_before(at_ms)
        if found is None or found < (self.start_ms or found):
            return None
        return (
            found if self.end_ms is None or found <= self.end_ms else self.before(self.end_ms + 1)
        )

    def _cron_before(self, at_ms: int) -> int | None:
        zone = _zone(self.timezone)
        ceiling = _wall(at_ms, zone)
        # In the second pass of a repeated hour the wall clock reads earlier than it did in
        # the first: look back from the later reading (what the clock showed before).
        repeated = at_ms - _ms(ceiling.replace(tzinfo=zone, fold=0))
        ceiling += timedelta(milliseconds=max(0, repeated))
        if ceiling.microsecond:
            ceiling = ceiling.replace(microsecond=0) + _SECOND
        for wall in _cron(self.cron or "", ceiling, reverse=True):
            instant = _instant(wall, zone)
            if instant < at_ms:
                return instant
        return None

    def _within(self, occurrence_ms: int) -> int | None:
        return None if self.end_ms is not None and occurrence_ms > self.end_ms else occurrence_ms

    def jitter_of(self, series_id: str, occurrence_ms: int) -> int:
        """The delay of one occurrence, 0-jitter ms, the same each time it is computed."""
        if not self.jitter_ms:
            return 0
        digest = hashlib.blake2b(f"{series_id}\0{occurrence_ms}".encode(), digest_size=8)
        return int.from_bytes(digest.digest()) % (self.jitter_ms + 1)

    def due_of(self, series_id: str, occurrence_ms: int) -> int:
        """When an occurrence falls due: its instant, its jitter added."""
        return occurrence_ms + self.jitter_of(series_id, occurrence_ms)

    def upcoming(self, after_ms: int, count: int, fired: int = 0) -> list[int]:
        """Up to `count` occurrences from `after_ms` on, within `limit` given `fired`."""
        left = count if self.limit is None else min(count, self.limit - fired)
        found: list[int] = []
        at = self.first(after_ms)
        while at is not None and len(found) < left:
            found.append(at)
            at = self.after(at)
        return found

    # --- stored form ---

    def to_json(self) -> dict[str, Any]:
        """The rule as stored and listed: only what differs from the defaults."""
        document: dict[str, Any] = {"timezone": self.timezone, "anchor_ms": self.anchor_ms}
        for name in ("cron", "every_ms", "start_ms", "end_ms", "limit"):
            if getattr(self, name) is not None:
                document[name] = getattr(self, name)
        document.update(jitter_ms=self.jitter_ms, missed=self.missed.value,
                        grace_ms=self.grace_ms)  # fmt: skip
        return document

    @classmethod
    def from_json(cls, document: dict[str, Any]) -> Recurrence:
        return cls(**{**document, "missed": Missed(document.get("missed", "once"))})


@dataclass(frozen=True, slots=True)
class Firing:
    """What one claim of a series does: deliver `deliver` (an occurrence, or nothing), then
    store `next` (or end the series: None), with `fired` occurrences delivered in all."""

    deliver: int | None
    next: int | None
    fired: int
    skipped: bool = False  # occurrences were passed over (missed, or paused)
    beyond_horizon: bool = False  # the series ended: its next occurrence lay too far ahead


def fire(  # noqa: PLR0913 - the series' state, by name
    rule: Recurrence,
    series_id: str,
    occurrence_ms: int,
    fired: int,
    now_ms: int,
    *,
    paused: bool = False,
    retried: bool = False,
    horizon_ms: int | None = None,
) -> Firing:
    """Decide what claiming the series' stored occurrence at `now_ms` does: an occurrence
    claimed more than `grace` after its due time (jitter included) was missed. One
    `retried` (claimed before: its delivery failed, or its replica died holding it) was
    chosen to fire already, and is delivered whatever the policy. A next occurrence due
    more than `horizon_ms` after `now_ms` (the caller's horizon) ends the series instead
    of being stored."""
    firing = _decide(rule, series_id, occurrence_ms, fired, now_ms, paused=paused,
                     retried=retried)  # fmt: skip
    if horizon_ms is None or firing.next is None:
        return firing
    if rule.due_of(series_id, firing.next) - now_ms <= horizon_ms:
        return firing
    return replace(firing, next=None, beyond_horizon=True)


def _decide(  # noqa: PLR0913 - the series' state, by name
    rule: Recurrence,
    series_id: str,
    occurrence_ms: int,
    fired: int,
    now_ms: int,
    *,
    paused: bool,
    retried: bool,
) -> Firing:
    """What `fire` does, whatever the horizon."""
    if paused:
        return Firing(None, rule.first(now_ms + 1), fired, skipped=True)
    cutoff = now_ms - rule.grace_ms
    due_ms = rule.due_of(series_id, occurrence_ms)
    if (
        retried
        or due_ms >= cutoff
        or (rule.missed is Missed.ALL and occurrence_ms >= now_ms - CATCH_UP_WINDOW_MS)
    ):
        return _delivered(rule, occurrence_ms, fired, rule.after(occurrence_ms))
    if rule.missed is Missed.ALL:  # older than the window: go on from its start
        return Firing(None, rule.first(now_ms - CATCH_UP_WINDOW_MS), fired, skipped=True)
    resume = rule.first(cutoff)
    if rule.missed is Missed.SKIP:
        return Firing(None, resume, fired, skipped=True)
    latest = rule.before(cutoff)
    if latest is None or latest < occurrence_ms:
        latest = occurrence_ms
    return _delivered(rule, latest, fired, resume, skipped=latest != occurrence_ms)


def _delivered(
    rule: Recurrence,
    occurrence_ms: int,
    fired: int,
    following: int | None,
    *,
    skipped: bool = False,
) -> Firing:
    done = fired + 1
    if rule.limit is not None and done >= rule.limit:
        following = None
    return Firing(occurrence_ms, following, done, skipped)


# --- wall clock and instants ---


def _zone(name: str) -> ZoneInfo:
    """An IANA zone by name. Only the database's list of zones is read: not the host's
    `localtime`, nor the `right/` (leap-second) and `posix/` copies, which zoneinfo would
    read with other offsets or which differ from host to host."""
    if not isinstance(name, str) or name not in _zones():
        raise InvalidRecurrence(f"unknown time zone {str(name)[:60]!r}", timezone=True)
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError) as e:
        raise InvalidRecurrence(f"unknown time zone {name[:60]!r}", timezone=True) from e


@functools.cache
def _zones() -> frozenset[str]:
    """The IANA zone names this machine's zone database holds (read once)."""
    return frozenset(available_timezones() - _NOT_ZONES) | {"UTC"}


def _cron(expression: str, start: datetime, *, reverse: bool = False) -> Iterator[datetime]:
    """Wall-clock times matching `expression` strictly after (`reverse`: before) `start`."""
    try:
        times = CronSim(_MACROS.get(expression.strip(), expression), start, reverse=reverse)
    except (CronSimError, ValueError, TypeError) as e:
        raise InvalidRecurrence(f"cron {expression[:80]!r}: {e}") from e
    return itertools.islice(times, _MAX_CANDIDATES)


# A deployment uses few rules, each by many series: a rule read once is not parsed again
# each time a stored series is decoded (at most 4,096 rules of 1,000 characters are kept).
@functools.lru_cache(maxsize=4096)
def _check_cron(expression: str) -> None:
    """Raise InvalidRecurrence unless `expression` is a cron rule cronsim reads."""
    _cron(expression, datetime(2000, 1, 1))


def _wall(instant_ms: int, zone: ZoneInfo) -> datetime:
    """The naive local time on the zone's clock at an instant."""
    moment = datetime.fromtimestamp(instant_ms // 1000, UTC) + timedelta(
        milliseconds=instant_ms % 1000
    )
    return moment.astimezone(zone).replace(tzinfo=None)


def _ms(moment: datetime) -> int:
    return (moment - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(milliseconds=1)


def _instant(wall: datetime, zone: ZoneInfo) -> int:
    """The instant a local time names: its first one when it happens twice, and the first
    instant after the gap when it does not exist."""
    first = _ms(wall.replace(tzinfo=zone, fold=0))
    if _wall(first, zone) == wall:
        return first
    # In a gap: fold=1 reads it with the offset after the change (an instant before the
    # change), fold=0 with the one before (after it). The change lies between, on a second.
    low, high = _ms(wall.replace(tzinfo=zone, fold=1)) // 1000, first // 1000
    while low < high:
        middle = (low + high) // 2
        if _wall(middle * 1000, zone) >= wall:
            high = middle
        else:
            low = middle + 1
    return low * 1000
