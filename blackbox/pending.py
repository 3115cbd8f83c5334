"""Pending: read-only views of what is scheduled, for the HTTP API and its page.

Every view is bounded in the work it asks of Redis, whatever the number pending: a listing
reads at most `SCAN_BUDGET` ids per call (a rare filter answers a partial page with a
cursor rather than walking a million ids at once), and the counts are ZCARD/ZCOUNT calls,
each O(log n).
"""

from __future__ import annotations

import base64
import binascii
import enum
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import redis
import structlog
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from blackbox.clock import now_ms
from blackbox.errors import BadCursor, CorruptSchedule
from blackbox.schedule import Schedule, split_scoped
from blackbox.store import RedisStore

log = structlog.get_logger("blackbox.pending")

# The most ids one listing call reads from Redis (a few ms at most at 1,000,000 pending).
SCAN_BUDGET = 1_000
# Ids read per round trip while listing.
SCAN_STEP = 200
PREVIEW_CHARS = 80
# What a listing reads of each payload: its fields and the start of its message.
HEAD_BYTES = 2_048
# Stats: how many of the next due schedules are read to count them per target topic.
TOPIC_SAMPLE = 500
TOPICS_SHOWN = 20
MINUTE_MS, HOUR_MS, DAY_MS = 60_000, 3_600_000, 86_400_000
# Buckets ahead for the page's timeline: (width, how many).
BUCKETS = (("minute", MINUTE_MS, 60), ("hour", HOUR_MS, 48), ("day", DAY_MS, 30))


class State(enum.StrEnum):
    """Where a pending id is: waiting for its due time, or being produced right now."""

    PENDING = "pending"
    IN_FLIGHT = "in_flight"


@dataclass(frozen=True, slots=True)
class Filter:
    """What a listing keeps; None keeps everything."""

    state: State = State.PENDING
    caller: str | None = None
    topic: str | None = None
    due_from_ms: int | None = None
    due_to_ms: int | None = None

    def keeps(self, schedule: Schedule) -> bool:
        caller = None if schedule.caller is None else schedule.caller.decode("utf-8", "replace")
        return (
            (self.caller is None or caller == self.caller)
            and (self.topic is None or schedule.topic == self.topic)
            and (self.due_from_ms is None or schedule.due_ms >= self.due_from_ms)
            and (self.due_to_ms is None or schedule.due_ms <= self.due_to_ms)
        )


@dataclass(frozen=True, slots=True)
class Position:
    """Where a listing stopped: the score and id of the last id it read."""

    score: int
    id: str

    def encode(self) -> str:
        raw = orjson.dumps([self.score, self.id])
        return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")

    @classmethod
    def decode(cls, cursor: str) -> Position:
        try:
            raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
            score, schedule_id = orjson.loads(raw)
        except (binascii.Error, ValueError, TypeError) as e:
            raise BadCursor(f"cursor {cursor[:40]!r} was not handed out by this API") from e
        if not isinstance(score, int) or not isinstance(schedule_id, str):
            raise BadCursor(f"cursor {cursor[:40]!r} was not handed out by this API")
        return cls(score, schedule_id)


@dataclass(frozen=True, slots=True)
class Item:
    """One schedule in a listing."""

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
    fewer items than asked while `cursor` is set: the call reached its read budget."""

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


@dataclass(frozen=True, slots=True)
class Head:
    """A stored schedule read up to HEAD_BYTES (its value maybe cut short), and the size of
    its whole message."""

    schedule: Schedule
    size: int


def item_of(schedule: Schedule, state: State, attempt: int, size: int | None = None) -> Item:
    scoped = split_scoped(schedule.id)
    caller = None if schedule.caller is None else schedule.caller.decode("utf-8", "replace")
    key = None if schedule.key is None else schedule.key.decode("utf-8", "replace")
    return Item(
        blackbox_id=schedule.id, caller=caller, id=None if scoped is None else scoped[1],
        topic=schedule.topic, key=key, due_ms=schedule.due_ms, attempt=attempt, state=state,
        size=len(schedule.value) if size is None else size, preview=preview(schedule.value),
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


class Pending:
    """The views over one store's due and in-flight sets."""

    def __init__(self, store: RedisStore) -> None:
        self.store = store
        self.client = store.client
        self.keys = store.layout.shards[0]

    def get(self, schedule_id: str) -> Detail | None:
        """One schedule with its message and headers; None unless it is pending."""
        pipe = self.client.pipeline(transaction=False)
        pipe.get(self.keys.payload(schedule_id))
        pipe.zscore(self.keys.due, schedule_id)
        pipe.zscore(self.keys.in_flight, schedule_id)
        pipe.hget(self.keys.attempts, schedule_id)
        raw, due, flying, attempt = pipe.execute()
        if raw is None or (due is None and flying is None):
            return None
        state = State.IN_FLIGHT if flying is not None else State.PENDING
        return detail_of(Schedule.decode(schedule_id, raw), state, int(attempt or 0))

    def page(self, kept: Filter, cursor: str | None, limit: int) -> Page:
        """Up to `limit` schedules by due time (lease expiry in flight) from `cursor` on,
        reading at most SCAN_BUDGET ids."""
        at, after = self._start(kept, Position.decode(cursor) if cursor else None)
        items: list[Item] = []
        scanned, last = 0, None
        while scanned < SCAN_BUDGET:
            members = self._members(kept.state, at)
            at += len(members)
            for (member, score), head, attempt in self._loaded(members):
                if kept.state is State.PENDING and score > (kept.due_to_ms or score):
                    return Page(items, None, scanned)
                scanned, last = scanned + 1, Position(score, member)
                if after is not None and (score, member) <= (after.score, after.id):
                    continue
                if head is not None and kept.keeps(head.schedule):
                    items.append(item_of(head.schedule, kept.state, attempt, head.size))
                if len(items) >= limit:
                    return Page(items, last.encode(), scanned)
            if len(members) < SCAN_STEP:
                return Page(items, None, scanned)
        return Page(items, None if last is None else last.encode(), scanned)

    def _start(self, kept: Filter, position: Position | None) -> tuple[int, Position | None]:
        """The rank to read from, and the position at and before which ids are skipped."""
        name = self._set(kept.state)
        if position is not None:
            rank: Any = self.client.zrank(name, position.id)
            if rank is not None:
                return int(rank) + 1, None
            return int(self.client.zcount(name, "-inf", f"({position.score}")), position
        if kept.state is State.PENDING and kept.due_from_ms is not None:
            return int(self.client.zcount(name, "-inf", f"({kept.due_from_ms}")), None
        return 0, None

    def _set(self, state: State) -> str:
        return self.keys.due if state is State.PENDING else self.keys.in_flight

    def _members(self, state: State, at: int) -> list[tuple[str, int]]:
        """A step of members with their scores, from rank `at`."""
        rows: Any = self.client.zrange(self._set(state), at, at + SCAN_STEP - 1, withscores=True)
        return [(m.decode("utf-8"), int(s)) for m, s in rows]

    def _loaded(
        self, members: Sequence[tuple[str, int]]
    ) -> Iterator[tuple[tuple[str, int], Head | None, int]]:
        """Each member with the head of its schedule (None once gone or unreadable) and
        its attempts."""
        if not members:
            return
        ids = [m for m, _ in members]
        attempts: Any = self.client.hmget(self.keys.attempts, ids)
        for member, head, attempt in zip(members, self._heads(ids), attempts, strict=True):
            yield member, head, int(attempt or 0)

    def _heads(self, ids: Sequence[str]) -> list[Head | None]:
        """The first HEAD_BYTES of each payload, decoded, with the message's whole size:
        a page of big messages costs Redis no more than a page of small ones."""
        pipe = self.client.pipeline(transaction=False)
        for i in ids:
            pipe.getrange(self.keys.payload(i), 0, HEAD_BYTES - 1)
            pipe.strlen(self.keys.payload(i))
        replies = pipe.execute()
        return [self._head(i, replies[2 * n], int(replies[2 * n + 1])) for n, i in enumerate(ids)]

    def _head(self, schedule_id: str, raw: bytes, stored: int) -> Head | None:
        if not raw:
            return None
        try:
            schedule = Schedule.decode(schedule_id, raw)
        except CorruptSchedule:
            if stored <= len(raw):
                log.warning("schedule_unreadable", blackbox_id=schedule_id)
                return None
            found = self.store.load(schedule_id)  # headers longer than the head: rare
            return None if found is None else Head(found, len(found.value))
        return Head(schedule, len(schedule.value) + stored - len(raw))

    def stats(self) -> Stats:
        """Counts, due buckets ahead and the next due schedules per target topic."""
        now = now_ms()
        pipe = self.client.pipeline(transaction=False)
        self._counts(pipe, now)
        for _, width, count in BUCKETS:
            for index in range(count):
                start = now + index * width
                pipe.zcount(self.keys.due, start, f"({start + width}")
        pending, in_flight, overdue, first, *counts = pipe.execute()
        buckets = _buckets(now, counts)
        topics = self._topics()
        return Stats(
            pending=int(pending), in_flight=int(in_flight), overdue=int(overdue),
            earliest_due_ms=int(first[0][1]) if first else None, at_ms=now,
            per_minute=buckets[0], per_hour=buckets[1], per_day=buckets[2],
            per_topic=dict(topics.most_common(TOPICS_SHOWN)), topic_sample=topics.total(),
        )  # fmt: skip

    def _counts(self, pipe: Any, now: int) -> None:
        pipe.zcard(self.keys.due)
        pipe.zcard(self.keys.in_flight)
        pipe.zcount(self.keys.due, "-inf", now)
        pipe.zrange(self.keys.due, 0, 0, withscores=True)

    def gauges(self) -> tuple[int, int | None]:
        """Overdue ids and the earliest due time: two O(log n) calls."""
        pipe = self.client.pipeline(transaction=False)
        pipe.zcount(self.keys.due, "-inf", now_ms())
        pipe.zrange(self.keys.due, 0, 0, withscores=True)
        overdue, first = pipe.execute()
        return int(overdue), int(first[0][1]) if first else None

    def _topics(self) -> Counter[str]:
        members: Any = self.client.zrange(self.keys.due, 0, TOPIC_SAMPLE - 1)
        heads = self._heads([m.decode("utf-8") for m in members])
        return Counter(h.schedule.topic for h in heads if h is not None)


def _buckets(now: int, counts: Sequence[int]) -> list[list[Bucket]]:
    rows, at = [], 0
    for _, width, count in BUCKETS:
        rows.append([Bucket(now + i * width, int(counts[at + i])) for i in range(count)])
        at += count
    return rows


class PendingGauges(Collector):
    """Exports the overdue count and the earliest due time at each scrape (the pending
    counts are `blackbox_pending_messages`, from the health probe)."""

    def __init__(self, pending: Pending) -> None:
        self.pending = pending

    def collect(self) -> Iterator[GaugeMetricFamily]:
        try:
            overdue, earliest = self.pending.gauges()
        except redis.RedisError as e:  # /ready says Redis is away; the scrape goes on
            log.info("pending_gauges_unavailable", error=str(e))
            return
        yield GaugeMetricFamily(
            "blackbox_overdue_messages", "Ids past their due time, not claimed yet.", overdue
        )
        if earliest is not None:
            yield GaugeMetricFamily(
                "blackbox_earliest_due_timestamp_seconds",
                "Due time of the earliest pending id (epoch seconds).",
                earliest / 1000,
            )

    def describe(self) -> Iterator[GaugeMetricFamily]:
        """Nothing: keeps registration from calling collect() (Redis may be away then)."""
        return iter(())
