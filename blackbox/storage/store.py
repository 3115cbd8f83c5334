"""RedisStore: schedules in Redis, one method per Lua script.

A pending id lives in exactly one of two sorted sets: `due` (scored by due time) or
`in flight` (scored by the expiry of the lease of the replica firing it). Every move
between them is one script call, so any number of replicas may share one Redis.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import hiredis
import redis

from blackbox.errors import ConcurrentUpdate
from blackbox.schedule import SCOPED_PREFIX, Schedule
from blackbox.storage import scripts
from blackbox.storage.connections import RedisClient, refresh_after
from blackbox.storage.keys import Layout

# Bounds the work of one script call so Redis never blocks on one huge batch.
SCRIPT_CHUNK = 500
# Tries of a reschedule whose payload an intake update replaced between read and write.
RESCHEDULE_TRIES = 3
RESCHEDULE_CHANGED = 6  # reschedule.lua: the payload changed since it was read
# Payload bytes one claim takes at most, unless told (BLACKBOX_BATCH_BYTES).
DEFAULT_CLAIM_BYTES = 16 * 1024 * 1024
# intake.lua's ops: a new id derived from the record, a caller's id stored or replaced, a
# cancel of a caller's id, a move of a caller's pending id to another due time, a caller's
# id stored only if neither pending nor ended lately, a pause and a resume of a series.
NEW, UPSERT, CANCEL, MOVE, ONCE, PAUSE, RESUME = "n", "u", "c", "m", "o", "p", "r"


@dataclass(frozen=True, slots=True)
class Cancellation:
    """A request to drop the pending schedule `id` (a caller's id)."""

    id: str


@dataclass(frozen=True, slots=True)
class Move:
    """A request to move the pending schedule `id` (a caller's id) to `due_ms`, its
    message kept."""

    id: str
    caller: bytes | None
    due_ms: int


@dataclass(frozen=True, slots=True)
class Holding:
    """A request to pause (`paused`) or resume the series `id` (a caller's id)."""

    id: str
    caller: bytes | None
    paused: bool


Write = Schedule | Cancellation | Move | Holding


@dataclass(frozen=True, slots=True)
class Advance:
    """A fired (or passed over) occurrence of a series to settle: the series' next version
    (`next`) stored in the same step, or, with None, the series ends."""

    id: str
    next: Schedule | None


class Applied(enum.IntEnum):
    """What applying one intake request did (the codes the intake script returns)."""

    REPLAYED = 0
    SCHEDULED = 1
    UPDATED = 2
    CANCELLED = 3
    ALREADY_FIRED = 4
    NOT_FOUND = 5
    ALREADY_PENDING = 7  # an if_absent request for an id pending already: nothing changed
    REREAD_PENDING = 8  # a re-read of a request applied before, its id still there: answered again
    NOT_RECURRING = 9  # a pause or resume of a one-off schedule: nothing changed
    PAUSED = 10
    RESUMED = 11
    RECURRING = 12  # a reschedule of a series: nothing changed (send the series again)


_APPLIED = {int(code): code for code in Applied}


@dataclass(frozen=True, slots=True)
class IntakeSlice:
    """The requests one part of an intake poll took from one partition, by offset.

    `last_offset` is the highest offset parsed so far in that partition, dead-lettered
    records included: every record up to it has been handled once this slice is stored.
    `incarnation` tags the topic's id (see incarnations.py): a topic created again under the
    same name has a watermark of its own. Empty where the broker gives topics no id.
    """

    topic: str
    partition: int
    last_offset: int
    items: Sequence[tuple[int, Write]]
    incarnation: str = ""

    @property
    def field(self) -> str:
        """The watermark's field: "topic:partition", then ":tag" of the incarnation."""
        where = f"{self.topic}:{self.partition}"
        return f"{where}:{self.incarnation}" if self.incarnation else where

    def chunks(
        self, items: Sequence[tuple[int, tuple[int, Write]]], previous: int = -1
    ) -> Iterator[tuple[Sequence[tuple[int, tuple[int, Write]]], int, int]]:
        """`items` (requests of this slice, each with a position kept for the caller) in
        bounded chunks in offset order, each with the watermark the chunk before it leaves
        (for the first, `previous`: -1 sets no condition) and the watermark it may move to:
        the last chunk moves it past every record of the slice."""
        parts = list(_chunks(items)) or [()]
        for index, chunk in enumerate(parts):
            mark = self.last_offset if index == len(parts) - 1 else chunk[-1][1][0]
            yield chunk, previous, mark
            previous = mark


# Not frozen: one is built per message on the hot path, and a frozen dataclass is
# several times slower to build. Treat it as immutable all the same.
@dataclass(slots=True)
class Loaded:
    """A claimed id with its stored payload (None once expired) and its past attempts."""

    id: str
    payload: bytes | None
    attempts: int
    ended: bytes | None = None


@dataclass(frozen=True, slots=True)
class Claim:
    """Ids moved to in flight by one claim, with what firing them needs, and the lease token
    to ack or retry them with."""

    ids: list[str]
    token: float
    next_due_ms: int | None
    at_ms: int = 0  # the claim took ids due by this time
    loaded: list[Loaded] = field(default_factory=list)  # per id, in the same order
    shard: int = 0
    more: bool = False  # it stopped at its limit (ids or bytes): more is due


def pending_counts(client: RedisClient, layout: Layout) -> tuple[int, int]:
    """How many ids are due and in flight, over every shard of `layout` (one round trip
    per Redis node)."""
    pipe = client.pipeline(transaction=False)
    for keys in layout.shards:
        pipe.zcard(keys.due)
        pipe.zcard(keys.in_flight)
    replies = [int(n) for n in pipe.execute()]
    return sum(replies[0::2]), sum(replies[1::2])


def _script(client: RedisClient, name: str, *, shared: bool = False) -> Any:
    """Register a script; `shared` puts pending.lua's functions in front of it, after its
    shebang line (which must stay the first)."""
    text = scripts.source(name)
    if shared:
        shebang, rest = text.split("\n", 1) if text.startswith("#!") else ("", text)
        text = (
            f"{shebang}\n{scripts.source('pending')}{rest}"
            if shebang
            else scripts.source("pending") + rest
        )
    return client.register_script(text)


def _chunks(items: Sequence[Any], size: int = SCRIPT_CHUNK) -> Iterator[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


@dataclass(slots=True)
class _Lane:
    """The script calls sent on one connection (one Redis node), in order, with the
    positions (in the order sent) of the requests each carries."""

    pool: Any
    connection: Any = None
    calls: list[list[Any]] = field(default_factory=list)
    positions: list[list[int]] = field(default_factory=list)
    read: int = 0  # replies read so far

    @property
    def unread(self) -> int:
        return len(self.calls) - self.read


class Applying:
    """Intake script calls in flight: Redis runs each part while the intake parses the
    next, and every reply is read at the end. The store's session object: made by
    `RedisStore.applying`, which owns the connections (one per Redis node: one, unless
    the store is a Redis Cluster).

    A slice's requests go to the shards their ids belong to, one call per shard and chunk;
    each shard keeps its own watermark of the partition. One connection per node keeps
    the calls in the order they were sent, and a shard's first chunk of a partition in a
    part waits for the watermark its previous part leaves (see intake.lua), so a later
    call never moves a watermark past one that failed.

    Calls are packed with hiredis directly: redis-py's pipeline checks each argument in
    Python (six or more per request) and its Script adds a SCRIPT EXISTS round trip. They
    are sent without redis-py's health check: its PING would read a reply of ours.
    """

    def __init__(self, store: RedisStore, now_ms: int) -> None:
        self._store = store
        self._now_ms = now_ms
        self._lanes: dict[int, _Lane] = {}  # by id() of the node's connection pool
        self._marks: dict[tuple[str, int], int] = {}  # per partition and shard: last mark
        self._codes: list[Applied | None] = []  # per request sent, once its reply is read
        # Once a call was refused for memory: per request, its code, or None where its call
        # was refused (see codes()).
        self.partial: list[Applied | None] = []

    @property
    def unread(self) -> int:
        """Replies not read yet: a connection released with any would answer its next user."""
        return sum(lane.unread for lane in self._lanes.values())

    def send(self, slices: Sequence[IntakeSlice]) -> None:
        """Send the slices' script calls; Redis runs them while the caller goes on."""
        sent: dict[int, tuple[list[list[Any]], list[list[int]]]] = {}
        for part in slices:
            for shard, items in self._by_shard(part):
                lane = self._lane(shard)
                calls, positions = sent.setdefault(id(lane), ([], []))
                previous = self._marks.get((part.field, shard), -1)
                for chunk, after, mark in part.chunks(items, previous):
                    calls.append(
                        self._store.intake_call(part, shard, chunk, (after, mark), self._now_ms)
                    )
                    positions.append([p for p, _ in chunk])
                    self._marks[(part.field, shard)] = mark
        for lane in self._lanes.values():
            if id(lane) in sent:
                self._send_calls(lane, *sent[id(lane)])

    def _by_shard(self, part: IntakeSlice) -> list[tuple[int, list[tuple[int, tuple[int, Write]]]]]:
        """The slice's requests by shard, each with its position in the order sent. With
        no request at all, shard 0 still moves its watermark past the slice."""
        groups: dict[int, list[tuple[int, tuple[int, Write]]]] = {}
        layout = self._store.layout
        for item in part.items:
            groups.setdefault(layout.shard_of(item[1].id), []).append((len(self._codes), item))
            self._codes.append(None)
        return list(groups.items()) or [(0, [])]

    def _lane(self, shard: int) -> _Lane:
        pool = self._store.pool_of(shard)
        lane = self._lanes.get(id(pool))
        if lane is None:
            lane = self._lanes[id(pool)] = _Lane(pool, pool.get_connection())
            lane.connection.check_health()  # while none of ours is unread
        return lane

    def _send_calls(self, lane: _Lane, calls: list[list[Any]], positions: list[list[int]]) -> None:
        """Send prepared EVALSHA arguments (script SHA, key count, keys, arguments)."""
        packed = [hiredis.pack_command(("EVALSHA", *call)) for call in calls]
        lane.connection.send_packed_command(packed, check_health=False)
        lane.calls += calls
        lane.positions += positions

    def codes(self) -> list[Applied]:
        """What each request sent so far did, in the order sent. If Redis lost its script
        cache (a restart), the call that met it ran nothing and the chunks after it in its
        partition refuse to run: the script is loaded again and the calls resent from that
        one on.

        A Redis over `maxmemory` refuses a call whole (OutOfMemoryError, raised): the calls
        before it, and those of other partitions and shards, may have run. `partial` then
        tells each request's code, None for those refused, so what ran can be answered: a
        re-read would skip it as applied already."""
        refused: redis.exceptions.OutOfMemoryError | None = None
        for lane in self._lanes.values():
            refused = self._read(lane) or refused
        if refused is not None:
            self.partial = list(self._codes)
            raise refused
        return [code for code in self._codes if code is not None]

    def _read(self, lane: _Lane) -> redis.exceptions.OutOfMemoryError | None:
        """Read the lane's replies into the codes; the refusal for memory met, if any (the
        calls after it read as None)."""
        refused = None
        while lane.unread:
            try:
                reply = lane.connection.read_response()
            except redis.exceptions.NoScriptError:
                self._resend(lane)
                continue
            except redis.exceptions.OutOfMemoryError as e:
                refused, reply = e, None
            except redis.ResponseError:
                if refused is None:  # not a gap left by a refused call: a real error
                    raise
                reply = None
            self._take(lane, reply)
        return refused

    def _take(self, lane: _Lane, reply: list[int] | None) -> None:
        """Record one call's reply (None: refused) for the requests it carried."""
        positions = lane.positions[lane.read]
        codes: list[Applied | None] = (
            [None] * len(positions) if reply is None else [_APPLIED[code] for code in reply]
        )
        for position, code in zip(positions, codes, strict=True):
            self._codes[position] = code
        lane.read += 1

    def _resend(self, lane: _Lane) -> None:
        """Load the intake script on the lane's node again and resend its calls from the
        one that met NOSCRIPT, on a fresh connection (the replies after it are dropped)."""
        lane.connection.disconnect()
        lane.pool.release(lane.connection)
        left, left_positions = lane.calls[lane.read :], lane.positions[lane.read :]
        lane.calls, lane.positions = lane.calls[: lane.read], lane.positions[: lane.read]
        lane.connection = lane.pool.get_connection()
        lane.connection.send_command("SCRIPT", "LOAD", self._store.intake_script)
        if lane.connection.read_response() is None:
            raise redis.ResponseError("SCRIPT LOAD answered nothing")
        self._send_calls(lane, left, left_positions)

    def release(self, failed: bool) -> None:
        """Give the connections back; one with replies left unread, or after a failure, is
        closed first (its replies would answer its next user)."""
        for lane in self._lanes.values():
            if failed or lane.unread:
                lane.connection.disconnect()
            lane.pool.release(lane.connection)


class RedisStore:
    """The due and in-flight sets of every shard of one namespace, and the payloads they
    point to. Calls about one id go to its shard; claims name the shard they take from."""

    def __init__(
        self,
        client: RedisClient,
        layout: Layout,
        grace_seconds: int,
        ended_retention_seconds: int = 86_400,
    ) -> None:
        self.client = client
        self.layout = layout
        self.grace_seconds = grace_seconds
        self.ended_retention_seconds = ended_retention_seconds
        self._intake = _script(client, "intake", shared=True)
        # Lua measures strings in bytes: the tag's length to cut an id from its payload key.
        self._tag_bytes = [len(keys.tag.encode("utf-8")) for keys in layout.shards]
        self._claim = _script(client, "claim")
        self._ack = _script(client, "ack")
        self._advance = _script(client, "advance")
        self._retry = _script(client, "retry")
        self._release = _script(client, "release")
        self._reclaim = _script(client, "reclaim")
        self._cancel = _script(client, "cancel", shared=True)
        self._reschedule = _script(client, "reschedule", shared=True)

    @property
    def shards(self) -> int:
        return self.layout.count

    @property
    def intake_script(self) -> str:
        """The intake script's text, to load on a node that lost its script cache."""
        return str(self._intake.script)

    def pool_of(self, shard: int) -> Any:
        """The connection pool of the Redis node serving `shard`."""
        key = self.layout.shards[shard].due
        if isinstance(self.client, redis.RedisCluster):
            node = self.client.get_node_from_key(key)  # type: ignore[no-untyped-call]
            return self.client.get_redis_connection(node).connection_pool
        return self.client.connection_pool

    def apply(self, slices: Sequence[IntakeSlice], now_ms: int) -> list[Applied]:
        """Apply what each intake slice holds that is new (replays are no-ops).

        Returns one Applied per item, in the order of the slices and their items. Each
        chunk is one atomic script call that also moves its partition's watermark in its
        shard, so a partial failure leaves Redis consistent.
        """
        with self.applying(now_ms) as applying:
            applying.send(slices)
            return applying.codes()

    @contextmanager
    def applying(self, now_ms: int = 0) -> Iterator[Applying]:
        """Intake slices sent part by part, their codes read at the end (`now_ms` sets the
        payloads' TTLs)."""
        applying = Applying(self, now_ms)
        failed = True
        try:
            yield applying
            failed = False
        except BaseException as e:
            refresh_after(self.client, e)  # the next session finds the slots' new nodes
            raise
        finally:
            applying.release(failed)

    def intake_call(
        self,
        part: IntakeSlice,
        shard: int,
        chunk: Sequence[tuple[int, tuple[int, Write]]],
        marks: tuple[int, int],
        now_ms: int,
    ) -> list[Any]:
        """The EVALSHA arguments of one chunk of one shard: the script's keys, then its
        arguments. `marks`: the watermark the chunk before leaves, and the one this moves to."""
        after, mark = marks
        keys_of = self.layout.shards[shard]
        keys = [keys_of.due, keys_of.in_flight, keys_of.intake_marks, keys_of.attempts]
        args: list[Any] = [part.field, mark, self.ended_retention_seconds,
                           self._tag_bytes[shard], after]  # fmt: skip
        for _, (offset, write) in chunk:
            request = self._args(offset, write, now_ms)
            keys.append(keys_of.payload(write.id))
            if request[1] != NEW:  # only a caller's id has an ended-marker
                keys.append(keys_of.ended(write.id))
            args += request
        return [self._intake.sha, len(keys), *keys, *args]

    def _args(self, offset: int, write: Write, now_ms: int) -> tuple[Any, ...]:
        if isinstance(write, Cancellation):
            return (offset, CANCEL, 0, 0, b"")
        if isinstance(write, Holding):
            return (offset, PAUSE if write.paused else RESUME, 0, 0, b"")
        if isinstance(write, Move):
            return (offset, MOVE, write.due_ms, self.ttl(write.due_ms, now_ms), b"")
        op = UPSERT if write.id.startswith(SCOPED_PREFIX) else NEW
        if write.if_absent and op == UPSERT:
            op = ONCE
        return (offset, op, write.due_ms, self.ttl(write.due_ms, now_ms), write.encode())

    def ttl(self, due_ms: int, now_ms: int) -> int:
        """Seconds a payload due at `due_ms` is kept from `now_ms`: to its due time, then
        the grace firing has to deliver it."""
        return max(0, math.ceil((due_ms - now_ms) / 1000)) + self.grace_seconds

    def claim_due(  # noqa: PLR0913 - the claim script's arguments, each named
        self, now_ms: int, limit: int, lease_ms: int, shard: int = 0, *,
        due_by_ms: int | None = None, max_bytes: int = DEFAULT_CLAIM_BYTES,
    ) -> Claim:  # fmt: skip
        """Move up to `limit` ids of `shard` due by `due_by_ms` (default: `now_ms`), and
        of at most `max_bytes` of payload (one at least), to in flight, leased for
        `lease_ms` from `now_ms` under a token no other claim holds, with their payloads
        and past attempts, in one round trip."""
        due_by = now_ms if due_by_ms is None else due_by_ms
        keys_of = self.layout.shards[shard]
        keys = [keys_of.due, keys_of.in_flight, keys_of.attempts, keys_of.lease_counter]
        args = [due_by, limit, now_ms + lease_ms, keys_of.payload(""), keys_of.ended(""),
                max_bytes]  # fmt: skip
        ids, next_due, payloads, attempts, ended, token = self._claim(keys=keys, args=args)
        loaded = [
            Loaded(id=i.decode("utf-8"), payload=p, attempts=int(a or 0), ended=e)
            for i, p, a, e in zip(ids, payloads, attempts, ended, strict=True)
        ]
        next_due_ms = int(float(next_due)) if next_due else None
        return Claim(
            ids=[item.id for item in loaded],
            loaded=loaded,
            token=float(token),
            next_due_ms=next_due_ms,
            at_ms=due_by,
            shard=shard,
            more=len(loaded) >= limit or (next_due_ms is not None and next_due_ms <= due_by),
        )

    def ack(self, ids: Sequence[str], token: float, shard: int = 0) -> int:
        """Forget ids of `shard` that were delivered or dead-lettered; return how many were
        still ours."""
        acked = 0
        keys_of = self.layout.shards[shard]
        for chunk in _chunks(ids):
            keys = [keys_of.in_flight, keys_of.due, keys_of.attempts]
            for i in chunk:
                keys += [keys_of.payload(i), keys_of.ended(i)]
            args = [token, self.ended_retention_seconds, *chunk]
            acked += int(self._ack(keys=keys, args=args))
        return acked

    def advance(self, items: Sequence[Advance], token: float, now_ms: int, shard: int = 0) -> int:
        """Settle fired occurrences of series in `shard`: each one's next version stored, or
        the series ended, in the step that forgets this one; how many were still ours."""
        settled = 0
        keys_of = self.layout.shards[shard]
        for chunk in _chunks(items):
            keys = [keys_of.in_flight, keys_of.due, keys_of.attempts]
            args: list[Any] = [token, self.ended_retention_seconds]
            for item in chunk:
                keys += [keys_of.payload(item.id), keys_of.ended(item.id)]
                following = item.next
                if following is None:
                    args += [item.id, "", 0, b""]
                else:
                    ttl = self.ttl(following.due_ms, now_ms)
                    args += [item.id, following.due_ms, ttl, following.encode()]
            settled += int(self._advance(keys=keys, args=args))
        return settled

    def retry(self, ids: Sequence[str], token: float, retry_at_ms: int, shard: int = 0) -> int:
        """Give failed ids of `shard` back to due at `retry_at_ms`, counting the attempt."""
        moved = 0
        keys_of = self.layout.shards[shard]
        keys = [keys_of.in_flight, keys_of.due, keys_of.attempts]
        for chunk in _chunks(ids):
            moved += int(self._retry(keys=keys, args=[token, retry_at_ms, *chunk]))
        return moved

    def release(self, dues: Sequence[tuple[str, int]], token: float, shard: int = 0) -> int:
        """Hand claimed (id, due ms) of `shard` back to due untouched: their payloads were
        not due yet."""
        released = 0
        keys_of = self.layout.shards[shard]
        keys = [keys_of.in_flight, keys_of.due]
        for chunk in _chunks(dues):
            args = [token, *(a for pair in chunk for a in pair)]
            released += int(self._release(keys=keys, args=args))
        return released

    def reclaim(self, now_ms: int, limit: int, shard: int = 0) -> int:
        """Return up to `limit` ids of `shard` whose lease expired by `now_ms` to due."""
        keys_of = self.layout.shards[shard]
        keys = [keys_of.in_flight, keys_of.due, keys_of.attempts]
        return int(self._reclaim(keys=keys, args=[now_ms, limit]))

    def next_due_ms(self) -> int | None:
        """The earliest due time pending in any shard, or None when nothing is due."""
        pipe = self.client.pipeline(transaction=False)
        for keys_of in self.layout.shards:
            pipe.zrange(keys_of.due, 0, 0, withscores=True)
        firsts = [int(first[0][1]) for first in pipe.execute() if first]
        return min(firsts) if firsts else None

    def counts(self) -> tuple[int, int]:
        """How many ids are due and in flight, over all shards."""
        return pending_counts(self.client, self.layout)

    def load(self, schedule_id: str) -> Schedule | None:
        """The stored schedule of a pending id (due or in flight), None when there is none."""
        key = self.layout.keys_of(schedule_id).payload(schedule_id)
        raw: bytes | None = self.client.get(key)  # type: ignore[assignment]
        return None if raw is None else Schedule.decode(schedule_id, raw)

    def cancel(self, schedule_id: str) -> Applied:
        """Cancel one id as an intake cancel record would (the same Lua function):
        CANCELLED, ALREADY_FIRED or NOT_FOUND."""
        keys_of = self.layout.keys_of(schedule_id)
        keys = [keys_of.due, keys_of.in_flight, keys_of.attempts,
                keys_of.payload(schedule_id), keys_of.ended(schedule_id)]  # fmt: skip
        args = [schedule_id, self.ended_retention_seconds]
        return _APPLIED[int(self._cancel(keys=keys, args=args))]

    def reschedule(
        self, schedule_id: str, due_ms: int, now_ms: int
    ) -> tuple[Applied, Schedule | None]:
        """Move a pending id to `due_ms`: UPDATED with the schedule as now stored; else
        ALREADY_FIRED (in flight or fired), CANCELLED or NOT_FOUND, with None."""
        keys_of = self.layout.keys_of(schedule_id)
        keys = [keys_of.due, keys_of.in_flight, keys_of.payload(schedule_id),
                keys_of.ended(schedule_id)]  # fmt: skip
        ttl = self.ttl(due_ms, now_ms)
        for _ in range(RESCHEDULE_TRIES):
            raw: bytes = self.client.get(keys[2]) or b""  # type: ignore[assignment]
            moved = Schedule.decode(schedule_id, raw) if raw else None
            if moved is not None:
                moved.due_ms = due_ms
            new = b"" if moved is None else moved.encode()
            code = int(self._reschedule(keys=keys, args=[schedule_id, due_ms, raw, new, ttl]))
            if code != RESCHEDULE_CHANGED:
                return _APPLIED[code], moved if code == Applied.UPDATED else None
        raise ConcurrentUpdate(f"{schedule_id!r} changed {RESCHEDULE_TRIES} times while moved")
