"""Applying: the intake's writes to Redis, sent part by part while the intake parses on.

What an intake request becomes in Redis (`Write`: a schedule stored, a cancel, a move, a
pause or resume), the slice of one partition's requests one part carries, and the session
(`Applying`) that sends each slice's script calls per node and reads what each did
(`Applied`). The store lends a session what it needs (`IntakeScript`); nothing here reads
or writes Redis otherwise.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import hiredis
import redis
import structlog

from blackbox.schedule import SCOPED_PREFIX, Schedule, owner_of
from blackbox.storage.keys import Layout
from blackbox.storage.watermarks import Watermarks

log = structlog.get_logger("blackbox.storage.applying")
# Bounds the work of one script call so Redis never blocks on one huge batch.
SCRIPT_CHUNK = 500
# The most chunks one grouped call carries, requests or none (a chunk that only moves a
# watermark costs a read and a write): 16 shards of 4 partitions.
GROUPS_PER_CALL = 64
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
    # Index mode: the reference to the moved version's store record, which Redis keeps in
    # place of what it held (intake/keeping.py); empty: Redis rewrites the due time only.
    stored: bytes = b""


@dataclass(frozen=True, slots=True)
class Holding:
    """A request to pause (`paused`) or resume the series `id` (a caller's id)."""

    id: str
    caller: bytes | None
    paused: bool


Write = Schedule | Cancellation | Move | Holding


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
    # Shards whose mark must move past the slice though no request of it goes there: those
    # of requests refused after parsing (over a quota), so a re-read finds them handled.
    passed: frozenset[int] = frozenset()

    @property
    def field(self) -> str:
        """The watermark's field: "topic:partition", then ":tag" of the incarnation."""
        return watermark_field(self.topic, self.partition, self.incarnation)

    def chunks(
        self, items: Sequence[tuple[int, tuple[int, Write]]], previous: int = -1
    ) -> Iterator[tuple[Sequence[tuple[int, tuple[int, Write]]], int, int]]:
        """`items` (requests of this slice, each with a position kept for the caller) in
        bounded chunks in offset order, each with the watermark the chunk before it leaves
        (for the first, `previous`: -1 sets no condition) and the watermark it may move to:
        the last chunk moves it past every record of the slice."""
        parts = list(chunked(items)) or [()]
        for index, chunk in enumerate(parts):
            mark = self.last_offset if index == len(parts) - 1 else chunk[-1][1][0]
            yield chunk, previous, mark
            previous = mark


class IntakeScript:
    """intake.lua on the store's Redis, and what its calls are built from: where each shard
    lives and how long a payload is kept (the store's rule)."""

    def __init__(
        self,
        script: Any,
        layout: Layout,
        pool_of: Callable[[int], Any],
        ttl: Callable[[int, int], int],
        ended_retention_seconds: int,
    ) -> None:
        self.script = script  # redis-py's Script: its SHA, and its text to load again
        self.layout = layout
        self.pool_of = pool_of  # the connection pool of the node serving a shard
        self.ttl = ttl  # seconds a payload due at (due ms) is kept from (now ms)
        self.ended_retention_seconds = ended_retention_seconds
        # Whether each caller's ids are kept in an owned set (a policy sets quotas), and
        # which set a caller's (percent-encoded, as in its ids) go to (quotas.py).
        self.counting = False
        self.bucket_of: Callable[[str], str] = str
        # Whether a caller's id stored anew just after it ended is noted in its shard's
        # restate set, to be written to the store topic again (intake/restating.py).
        self.restating = False
        # Lua measures strings in bytes: the tag's length to cut an id from its payload key.
        self.tag_bytes = [len(keys.tag.encode("utf-8")) for keys in layout.shards]
        # Whether one call may carry the chunks of several shards (intake.lua's grouped
        # form): on one Redis, not on a cluster (a call's keys must share a slot there).
        self.grouping = False

    @property
    def text(self) -> str:
        """The script's text, to load on a node that lost its script cache."""
        return str(self.script.script)

    def evalsha(self, keys: list[Any], args: list[Any]) -> list[Any]:
        """The EVALSHA arguments of a call with these keys and arguments."""
        return [self.script.sha, len(keys), *keys, *args]

    def grouped(self, calls: Sequence[tuple[list[Any], list[Any]]]) -> list[Any]:
        """The EVALSHA arguments of one call carrying several chunks' (keys, arguments),
        each of another shard or partition (intake.lua's grouped form)."""
        keys: list[Any] = []
        args: list[Any] = ["*", len(calls)]
        for chunk_keys, chunk_args in calls:
            args += [len(chunk_keys), len(chunk_args)]
        for chunk_keys, chunk_args in calls:
            keys += chunk_keys
            args += chunk_args
        return self.evalsha(keys, args)

    def chunk_call(
        self,
        part: IntakeSlice,
        shard: int,
        chunk: Sequence[tuple[int, tuple[int, Write]]],
        marks: tuple[int, int],
        now_ms: int,
    ) -> tuple[list[Any], list[Any]]:
        """The keys and arguments of one chunk of one shard: the script's keys, then its
        arguments. `marks`: the watermark the chunk before leaves, and the one this moves to."""
        after, mark = marks
        keys_of = self.layout.shards[shard]
        keys = [keys_of.due, keys_of.in_flight, keys_of.intake_marks, keys_of.attempts,
                keys_of.owners]  # fmt: skip
        if self.restating:
            keys.append(keys_of.restate)
        counting = self.counting
        flags = ("1" if counting else "0") + ("1" if self.restating else "0")
        args: list[Any] = [part.field, mark, self.ended_retention_seconds,
                           self.tag_bytes[shard], after, flags]  # fmt: skip
        for _, (offset, write) in chunk:
            request = self._args(offset, write, now_ms)
            keys.append(keys_of.payload(write.id))
            if request[1] != NEW:  # only a caller's id has an ended-marker
                keys.append(keys_of.ended(write.id))
            if counting:
                owner = owner_of(write.id, getattr(write, "caller", None))
                keys.append(keys_of.owned(self.bucket_of(owner)))
            args += request
        return keys, args

    def _args(self, offset: int, write: Write, now_ms: int) -> tuple[Any, ...]:
        if isinstance(write, Cancellation):
            return (offset, CANCEL, 0, 0, b"")
        if isinstance(write, Holding):
            return (offset, PAUSE if write.paused else RESUME, 0, 0, b"")
        if isinstance(write, Move):
            return (offset, MOVE, write.due_ms, self.ttl(write.due_ms, now_ms), write.stored)
        op = UPSERT if write.id.startswith(SCOPED_PREFIX) else NEW
        if write.if_absent and op == UPSERT:
            op = ONCE
        stored = write.encode() if write.stored is None else write.stored
        return (offset, op, write.due_ms, self.ttl(write.due_ms, now_ms), stored)


def watermark_field(topic: str, partition: int, incarnation: str = "") -> str:
    """A partition's field in every shard's watermarks hash (see IntakeSlice)."""
    where = f"{topic}:{partition}"
    return f"{where}:{incarnation}" if incarnation else where


def chunked(items: Sequence[Any], size: int = SCRIPT_CHUNK) -> Iterator[Sequence[Any]]:
    """`items` in runs of at most `size`: the most one script call carries."""
    for start in range(0, len(items), size):
        yield items[start : start + size]


@dataclass(frozen=True, slots=True)
class _Chunk:
    """One chunk's script keys and arguments, the positions of its requests (in the order
    sent) and the partition's watermark field and shard it moves."""

    keys: list[Any]
    args: list[Any]
    positions: list[int]
    where: tuple[str, int]


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

    A slice's requests go to the shards their ids belong to, a chunk per shard; each shard
    keeps its own watermark of the partition. On one Redis a call carries the chunks of
    many shards (up to SCRIPT_CHUNK requests), on a cluster a call carries one chunk (its
    keys must share a slot). One connection per node keeps the calls in the order they
    were sent, and a shard's first chunk of a partition in a part waits for the watermark
    its previous part leaves (see intake.lua), so a later call never moves a watermark
    past one that failed.

    Calls are packed with hiredis directly: redis-py's pipeline checks each argument in
    Python (six or more per request) and its Script adds a SCRIPT EXISTS round trip. They
    are sent without redis-py's health check: its PING would read a reply of ours.
    """

    def __init__(self, script: IntakeScript, now_ms: int, known: Watermarks | None = None) -> None:
        """`known`: the marks this process saw confirmed; shards lagging in it are moved
        along with the slices (watermarks.py), and what this session applies confirms more."""
        self._script = script
        self._now_ms = now_ms
        self._known = known
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
        sent: dict[int, list[_Chunk]] = {}
        for part in slices:
            for shard, items in self._by_shard(part):
                lane = self._lane(shard)
                previous = self._previous(part.field, shard)
                for chunk, after, mark in part.chunks(items, previous):
                    keys, args = self._script.chunk_call(
                        part, shard, chunk, (after, mark), self._now_ms
                    )
                    where = (part.field, shard)
                    chunks = sent.setdefault(id(lane), [])
                    chunks.append(_Chunk(keys, args, [p for p, _ in chunk], where))
                    self._marks[where] = mark
        for lane in self._lanes.values():
            if id(lane) in sent:
                self._send_calls(lane, *self._calls(sent[id(lane)]))

    def _calls(self, chunks: Sequence[_Chunk]) -> tuple[list[list[Any]], list[list[int]]]:
        """The EVALSHA arguments of one node's chunks, in order, with the positions of the
        requests each call carries. On one Redis, consecutive chunks of other shards (or
        partitions) go in one call (intake.lua's grouped form), up to SCRIPT_CHUNK requests
        and GROUPS_PER_CALL chunks, so a poll costs a call per node rather than per shard;
        a chunk of a shard and partition the call holds already starts the next call,
        after it in order."""
        calls: list[list[Any]] = []
        positions: list[list[int]] = []
        group: list[_Chunk] = []
        held: set[tuple[str, int]] = set()
        size = 0
        for chunk in chunks:
            if group and (
                not self._script.grouping
                or size + len(chunk.positions) > SCRIPT_CHUNK
                or len(group) >= GROUPS_PER_CALL
                or chunk.where in held
            ):
                self._close(group, calls, positions)
                group, held, size = [], set(), 0
            group.append(chunk)
            held.add(chunk.where)
            size += len(chunk.positions)
        if group:
            self._close(group, calls, positions)
        return calls, positions

    def _close(
        self, group: Sequence[_Chunk], calls: list[list[Any]], positions: list[list[int]]
    ) -> None:
        """Add one call carrying `group`'s chunks (the single form for one chunk), with the
        positions of its requests."""
        if len(group) == 1:
            calls.append(self._script.evalsha(group[0].keys, group[0].args))
        else:
            calls.append(self._script.grouped([(c.keys, c.args) for c in group]))
        positions.append([p for c in group for p in c.positions])

    def _previous(self, field: str, shard: int) -> int:
        """The mark a shard's first call of a partition must find: the one this session
        left, else the one Redis last confirmed to this process, else none (-1). A Redis
        found below it lost writes (a failover): the call refuses to run (BLACKBOX_GAP),
        rather than move the mark past requests it no longer holds."""
        mark = self._marks.get((field, shard))
        if mark is None and self._known is not None:
            mark = self._known.mark(field, shard)
        return -1 if mark is None else mark

    def _by_shard(self, part: IntakeSlice) -> list[tuple[int, list[tuple[int, tuple[int, Write]]]]]:
        """The slice's requests by shard, each with its position in the order sent. With
        no request at all, shard 0 still moves its watermark past the slice, and so does
        every shard whose mark lags (a call applying nothing)."""
        groups: dict[int, list[tuple[int, tuple[int, Write]]]] = {}
        layout = self._script.layout
        for item in part.items:
            groups.setdefault(layout.shard_of(item[1].id), []).append((len(self._codes), item))
            self._codes.append(None)
        for shard in part.passed:
            groups.setdefault(shard, [])
        if self._known is not None:
            for shard in self._known.lagging(part.field, part.last_offset, layout.count):
                groups.setdefault(shard, [])
        return list(groups.items()) or [(0, [])]

    def _lane(self, shard: int) -> _Lane:
        pool = self._script.pool_of(shard)
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
        if self._known is not None:
            self._known.confirm(self._marks)
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
            except redis.exceptions.ClusterCrossSlotError:
                # A Redis that keeps hash slots behind a plain URL (one node in cluster
                # mode, a proxy): a call's keys must share a slot there, as on a cluster.
                # Refused before it ran; the intake reads the poll again, a call per shard.
                self._script.grouping = False
                log.warning(
                    "intake_calls_per_shard",
                    reason="the Redis refused keys of several slots in one call",
                )
                raise
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
        lane.connection.send_command("SCRIPT", "LOAD", self._script.text)
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
