"""Pending: read-only views of what is scheduled, for the HTTP API and its page.

Every view reads all shards and is bounded in the work it asks of Redis, whatever the number
pending: a listing reads at most `SCAN_BUDGET` ids of the listed caller per call from the
shards' merged order (a rare filter answers a partial page with a cursor rather than walking
a million ids at once; see listing.py for what positioning and reading ahead add), and the
counts are ZCARD/ZCOUNT calls, each O(log n), per shard in one pipeline.

A listing of one caller (all a token scoped to callers may make) walks every caller's ids,
but only the listed caller's count against its budget: where its page ends, and whether it
comes with a cursor, follow from that caller's own ids, so a scoped token cannot bisect when
others' ids fall due by watching its pages stop early. Other callers' own ids (`@caller/...`)
are passed over by their name, unread, an intake-derived id once the start of its payload
names another caller; `WALK_BUDGET` bounds the ids of any caller one call walks, the only
point where others' ids still shape a page.

A listing's cursor is sealed (cursors.py): it may stop on an id the token may not see,
and it names none. Whether an id is pending, and whose it is, is read from the head of its
payload alone (`owner`), so checking an id costs the same whatever its message's size.

A series (a recurring schedule) is one pending id: it is listed with the rest, its item
carrying its rule and next occurrences (computed from the stored rule, no Redis call), and
a listing of one kind (`Kind`) keeps series or one-off schedules alone.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import redis
import structlog
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from blackbox.api.cursors import Cursors, Position, key_name, redis_key
from blackbox.api.views import Bucket, Detail, Item, Kind, Page, State, Stats, detail_of, item_of
from blackbox.clock import now_ms
from blackbox.errors import CorruptSchedule
from blackbox.reference import is_reference
from blackbox.schedule import CALLER_WITHIN, Schedule, caller_from_prefix, split_scoped
from blackbox.storage import listing
from blackbox.storage.keys import Keys
from blackbox.storage.listing import Member
from blackbox.storage.store import RedisStore

log = structlog.get_logger("blackbox.api.pending")

# The most ids of the listed caller one listing call reads from Redis (a few ms at most at
# 1,000,000 pending).
SCAN_BUDGET = 1_000
# The most ids of any caller one listing call walks: another caller's own id costs its
# sorted-set read, an intake-derived id the read of its payload's first CALLER_WITHIN bytes
# (10,000 such: about 0.4 s on a loaded 2-core machine, as 1,000 heads read and decoded).
WALK_BUDGET = 10_000
# Ids read of one shard per round trip while a listing of one caller walks.
WALK_STEP = 1_000
# Ids read per round trip while listing.
SCAN_STEP = 200
# The fewest ids a page reads of each shard at first (more: a share of the page).
FIRST_READ = 8
# What a listing reads of each payload: its fields and the start of its message.
HEAD_BYTES = 2_048
# Stats: how many of the next due schedules are read to count them per target topic.
TOPIC_SAMPLE = 500
TOPICS_SHOWN = 20
MINUTE_MS, HOUR_MS, DAY_MS = 60_000, 3_600_000, 86_400_000
# Buckets ahead for the page's timeline: (width, how many).
BUCKETS = (("minute", MINUTE_MS, 60), ("hour", HOUR_MS, 48), ("day", DAY_MS, 30))


@dataclass(frozen=True, slots=True)
class Filter:
    """What a listing keeps; None (and Kind.ALL) keeps everything."""

    state: State = State.PENDING
    caller: str | None = None
    topic: str | None = None
    due_from_ms: int | None = None
    due_to_ms: int | None = None
    kind: Kind = Kind.ALL

    def keeps(self, schedule: Schedule) -> bool:
        return (
            self.of_caller(schedule)
            and (self.topic is None or schedule.topic == self.topic)
            and (self.due_from_ms is None or schedule.due_ms >= self.due_from_ms)
            and (self.due_to_ms is None or schedule.due_ms <= self.due_to_ms)
            and self._kind_kept(schedule)
        )

    def of_caller(self, schedule: Schedule | None) -> bool:
        """Whether an id read is the listed caller's (any is, where the listing names none).
        A listing's `scanned` counts only these: a token scoped to callers always names one,
        and learns nothing of how many ids others have or when theirs fall due."""
        if self.caller is None:
            return True
        caller = None if schedule is None else schedule.caller
        return caller is not None and caller.decode("utf-8", "replace") == self.caller

    def _kind_kept(self, schedule: Schedule) -> bool:
        return self.kind is Kind.ALL or (schedule.series is not None) == (self.kind is Kind.SERIES)


@dataclass(frozen=True, slots=True)
class Head:
    """A stored schedule read up to HEAD_BYTES (its value maybe cut short), and the size of
    its whole message."""

    schedule: Schedule
    size: int


class Pending:
    """The views over one store's due and in-flight sets, over all its shards."""

    def __init__(self, store: RedisStore) -> None:
        self.store = store
        self.client = store.client
        self.layout = store.layout
        self.cursors = Cursors(redis_key(self.client, key_name(self.layout)))
        # Members read of each shard per round trip: the first read of every shard, made
        # before the merge can pick any, stays within the budget.
        self.step = max(1, min(SCAN_STEP, SCAN_BUDGET // self.layout.count))
        # A listing of one caller walks past others' ids in longer reads (fewer round trips).
        self.walk_step = max(1, min(WALK_STEP, WALK_BUDGET // self.layout.count))

    def get(self, schedule_id: str) -> Detail | None:
        """One schedule with its message and headers; None unless it is pending."""
        keys = self.layout.keys_of(schedule_id)
        pipe = self.client.pipeline(transaction=False)
        pipe.get(keys.payload(schedule_id))
        pipe.zscore(keys.due, schedule_id)
        pipe.zscore(keys.in_flight, schedule_id)
        pipe.hget(keys.attempts, schedule_id)
        raw, due, flying, attempt = pipe.execute()
        if raw is None or (due is None and flying is None):
            return None
        state = State.IN_FLIGHT if flying is not None else State.PENDING
        if is_reference(raw) and self.store.reader is not None:  # index mode: read back
            raw = self.store.reader.resolve([schedule_id], [raw])[0]
            if raw is None:
                log.warning("store_record_missing", blackbox_id=schedule_id)
                return None
        return detail_of(Schedule.decode(schedule_id, raw), state, int(attempt or 0))

    def owner(self, schedule_id: str) -> tuple[bool, bytes | None]:
        """Whether `schedule_id` is pending (due or in flight), and its caller, read from
        the first CALLER_WITHIN bytes of its payload: one round trip of bounded size for any
        id, never the whole payload (its read time would tell another caller's id from a
        free one, where a long key or headers outrun a listing's head)."""
        keys = self.layout.keys_of(schedule_id)
        pipe = self.client.pipeline(transaction=False)
        pipe.getrange(keys.payload(schedule_id), 0, CALLER_WITHIN - 1)
        pipe.zscore(keys.due, schedule_id)
        pipe.zscore(keys.in_flight, schedule_id)
        raw, due, flying = pipe.execute()
        if not raw or (due is None and flying is None):
            return False, None
        try:
            return True, caller_from_prefix(raw)
        except CorruptSchedule:
            log.warning("schedule_unreadable", blackbox_id=schedule_id)
            return False, None

    def page(self, kept: Filter, cursor: str | None, limit: int) -> Page:
        """Up to `limit` schedules by due time (lease expiry in flight) from `cursor` on,
        over all shards, reading at most SCAN_BUDGET ids of the listed caller and walking at
        most WALK_BUDGET ids from their merged order."""
        names = self._sets(kept.state)
        starts = self._starts(names, kept, self.cursors.open(cursor) if cursor else None)
        step = self.step if kept.caller is None else self.walk_step
        members = listing.merged(self.client, names, starts, self._reads(limit, step))
        if kept.state is State.PENDING and kept.due_to_ms is not None:
            members = itertools.takewhile(lambda m: m[0] <= (kept.due_to_ms or 0), members)
        items: list[Item] = []
        walked, counted, last = 0, 0, None
        while counted < SCAN_BUDGET and walked < WALK_BUDGET:
            # The first read is the page's size; later ones are full: a filter drops ids.
            size = min(SCAN_STEP, WALK_BUDGET - walked, SCAN_STEP if walked else limit)
            chunk = list(itertools.islice(members, size))
            for (score, member), head, attempt in zip(chunk, *self._loaded(chunk, kept),
                                                      strict=True):  # fmt: skip
                walked, last = walked + 1, Position(score, member)
                schedule = None if head is None else head.schedule
                counted += kept.of_caller(schedule)
                if head is not None and kept.keeps(head.schedule):
                    items.append(item_of(head.schedule, kept.state, attempt, head.size))
                if len(items) >= limit or counted >= SCAN_BUDGET:
                    return Page(items, self.cursors.seal(last), counted)
            if len(chunk) < size:
                return Page(items, None, counted)
        return Page(items, None if last is None else self.cursors.seal(last), counted)

    def _reads(self, wanted: int, most: int) -> tuple[int, int]:
        """How many ids of each shard a view that wants `wanted` reads first: twice its share
        (ids spread evenly over the shards), at least FIRST_READ, at most `most`; and how
        many a shard the merge has taken all that was read of reads next: `most`."""
        return min(most, max(FIRST_READ, 2 * -(-wanted // self.layout.count))), most

    def _starts(self, names: list[str], kept: Filter, position: Position | None) -> list[int]:
        """The rank each shard's set is read from: just after the cursor's (score, id),
        else from the first due at or after `due_from_ms`, else from the start."""
        if position is not None:
            owner = self.layout.shard_of(position.id)
            return listing.ranks_after(self.client, names, owner, (position.score, position.id))
        if kept.state is State.PENDING and kept.due_from_ms is not None:
            return listing.first_ranks(self.client, names, kept.due_from_ms)
        return [0] * len(names)

    def _sets(self, state: State) -> list[str]:
        """Each shard's set of ids in `state`."""
        if state is State.PENDING:
            return [keys.due for keys in self.layout.shards]
        return [keys.in_flight for keys in self.layout.shards]

    def _loaded(
        self, members: Sequence[Member], kept: Filter
    ) -> tuple[list[Head | None], list[int]]:
        """The head of each member's schedule (None once gone or unreadable, or where the
        listing names a caller, another caller's, whose head is never read) and its
        attempts, in one round trip per Redis node."""
        wanted = list(range(len(members)))
        if kept.caller is not None:
            owners = self._owners([m for _, m in members])
            wanted = [i for i, owner in zip(wanted, owners, strict=True) if owner == kept.caller]
        heads, attempts = self._read([members[i][1] for i in wanted])
        loaded: list[Head | None] = [None] * len(members)
        tries = [0] * len(members)
        for index, head, attempt in zip(wanted, heads, attempts, strict=True):
            loaded[index], tries[index] = head, attempt
        return loaded, tries

    def _owners(self, ids: Sequence[str]) -> list[str | None]:
        """The caller of each id: a caller's own id names it; an intake-derived id's is read
        from the first CALLER_WITHIN bytes of its payload (one pipeline), never decoding
        the rest of another caller's schedule."""
        unnamed = [i for i in ids if split_scoped(i) is None]
        pipe = self.client.pipeline(transaction=False)
        for schedule_id in unnamed:
            pipe.getrange(self.layout.keys_of(schedule_id).payload(schedule_id), 0,
                          CALLER_WITHIN - 1)  # fmt: skip
        read = dict(zip(unnamed, pipe.execute() if unnamed else [], strict=True))
        return [_owner_of(i, read.get(i)) for i in ids]

    def _read(self, ids: Sequence[str]) -> tuple[list[Head | None], list[int]]:
        """The head of each id's schedule and its attempts (one pipeline)."""
        pipe = self.client.pipeline(transaction=False)
        self._queue_heads(pipe, ids)
        groups: dict[int, list[int]] = {}
        for index, schedule_id in enumerate(ids):
            groups.setdefault(self.layout.shard_of(schedule_id), []).append(index)
        for shard, indexes in groups.items():
            pipe.hmget(self.layout.shards[shard].attempts, [ids[i] for i in indexes])
        replies = pipe.execute() if ids else []
        attempts = [0] * len(ids)
        for indexes, reply in zip(groups.values(), replies[2 * len(ids) :], strict=True):
            for index, attempt in zip(indexes, reply, strict=True):
                attempts[index] = int(attempt or 0)
        return self._read_heads(ids, replies), attempts

    def _heads(self, ids: Sequence[str]) -> list[Head | None]:
        """The first HEAD_BYTES of each payload, decoded, with the message's whole size:
        a page of big messages costs Redis no more than a page of small ones."""
        if not ids:
            return []
        pipe = self.client.pipeline(transaction=False)
        self._queue_heads(pipe, ids)
        return self._read_heads(ids, pipe.execute())

    def _queue_heads(self, pipe: Any, ids: Sequence[str]) -> None:
        for i in ids:
            key = self.layout.keys_of(i).payload(i)
            pipe.getrange(key, 0, HEAD_BYTES - 1)
            pipe.strlen(key)

    def _read_heads(self, ids: Sequence[str], replies: Sequence[Any]) -> list[Head | None]:
        heads = [(replies[2 * n], int(replies[2 * n + 1])) for n in range(len(ids))]
        reader = self.store.reader
        if reader is not None and any(is_reference(raw) for raw, _ in heads):
            # Index mode: the page's references read back at once (a reference is whole
            # within a head); one whose record is missing is left out.
            found = reader.resolve(ids, [raw or None for raw, _ in heads])
            heads = [
                (whole, len(whole)) if is_reference(raw) and whole is not None
                else (b"" if is_reference(raw) else raw, size)
                for (raw, size), whole in zip(heads, found, strict=True)
            ]  # fmt: skip
        return [self._head(i, raw, size) for i, (raw, size) in zip(ids, heads, strict=True)]

    def _head(self, schedule_id: str, raw: bytes, stored: int) -> Head | None:
        if not raw:
            return None
        try:
            schedule = Schedule.decode(schedule_id, raw)
        except CorruptSchedule:
            if stored <= len(raw):
                log.warning("schedule_unreadable", blackbox_id=schedule_id)
                return None
            try:  # headers (or a series' rule) longer than the head: rare
                found = self.store.load(schedule_id)
            except CorruptSchedule:
                log.warning("schedule_unreadable", blackbox_id=schedule_id)
                return None
            return None if found is None else Head(found, len(found.value))
        return Head(schedule, len(schedule.value) + stored - len(raw))

    def stats(self) -> Stats:
        """Counts, due buckets ahead and the next due schedules per target topic, summed
        over the shards (one pipeline)."""
        now = now_ms()
        pipe = self.client.pipeline(transaction=False)
        for keys in self.layout.shards:
            self._counts(pipe, keys, now)
            for _, width, count in BUCKETS:
                for index in range(count):
                    start = now + index * width
                    pipe.zcount(keys.due, start, f"({start + width}")
        replies = pipe.execute()
        per_shard = len(replies) // self.layout.count
        rows = [replies[at : at + per_shard] for at in range(0, len(replies), per_shard)]
        # Per shard: due, in flight, overdue, its first due (not summed), then the buckets.
        sums = [sum(int(row[k]) for row in rows) for k in range(per_shard) if k != 3]
        pending, in_flight, overdue, *counts = sums
        buckets = _buckets(now, counts)
        topics = self._topics()
        return Stats(
            pending=pending, in_flight=in_flight, overdue=overdue,
            earliest_due_ms=_earliest(row[3] for row in rows), at_ms=now,
            per_minute=buckets[0], per_hour=buckets[1], per_day=buckets[2],
            per_topic=dict(topics.most_common(TOPICS_SHOWN)), topic_sample=topics.total(),
        )  # fmt: skip

    def _counts(self, pipe: Any, keys: Keys, now: int) -> None:
        pipe.zcard(keys.due)
        pipe.zcard(keys.in_flight)
        pipe.zcount(keys.due, "-inf", now)
        pipe.zrange(keys.due, 0, 0, withscores=True)

    def gauges(self) -> tuple[int, int | None]:
        """Overdue ids and the earliest due time: two O(log n) calls per shard, one pipeline."""
        now = now_ms()
        pipe = self.client.pipeline(transaction=False)
        for keys in self.layout.shards:
            pipe.zcount(keys.due, "-inf", now)
            pipe.zrange(keys.due, 0, 0, withscores=True)
        replies = pipe.execute()
        return sum(int(n) for n in replies[0::2]), _earliest(replies[1::2])

    def _topics(self) -> Counter[str]:
        """Target topics of the TOPIC_SAMPLE earliest due over all shards."""
        names = self._sets(State.PENDING)
        reads = self._reads(TOPIC_SAMPLE, TOPIC_SAMPLE)
        members = listing.merged(self.client, names, [0] * len(names), reads)
        heads = self._heads([m for _, m in itertools.islice(members, TOPIC_SAMPLE)])
        return Counter(h.schedule.topic for h in heads if h is not None)


def _owner_of(schedule_id: str, prefix: bytes | None) -> str | None:
    """The caller an id names, else the one its payload's `prefix` holds (None: none, or
    gone, or unreadable: the listing passes it over)."""
    scoped = split_scoped(schedule_id)
    if scoped is not None:
        return None if scoped[0] is None else scoped[0].decode("utf-8", "replace")
    try:
        caller = caller_from_prefix(prefix) if prefix else None
    except CorruptSchedule:
        return None
    return None if caller is None else caller.decode("utf-8", "replace")


def _earliest(firsts: Iterable[Any]) -> int | None:
    """The lowest score among each shard's first member (ZRANGE 0 0 WITHSCORES replies)."""
    scores = [int(first[0][1]) for first in firsts if first]
    return min(scores) if scores else None


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
