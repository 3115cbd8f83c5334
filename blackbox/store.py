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
from importlib import resources
from typing import Any

import hiredis
import redis

from blackbox.errors import ConcurrentUpdate
from blackbox.keys import Keys
from blackbox.schedule import SCOPED_PREFIX, Schedule

# Bounds the work of one script call so Redis never blocks on one huge batch.
SCRIPT_CHUNK = 500
# Tries of a reschedule whose payload an intake update replaced between read and write.
RESCHEDULE_TRIES = 3
RESCHEDULE_CHANGED = 6  # reschedule.lua: the payload changed since it was read


@dataclass(frozen=True, slots=True)
class Cancellation:
    """A request to drop the pending schedule `id` (a caller's id)."""

    id: str


Write = Schedule | Cancellation


class Applied(enum.IntEnum):
    """What applying one intake request did (the codes the intake script returns)."""

    REPLAYED = 0
    SCHEDULED = 1
    UPDATED = 2
    CANCELLED = 3
    ALREADY_FIRED = 4
    NOT_FOUND = 5


_APPLIED = tuple(Applied)


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

    def chunks(self, previous: int = -1) -> Iterator[tuple[Sequence[tuple[int, Write]], int, int]]:
        """Bounded chunks in offset order, each with the watermark the chunk before it
        leaves (for the first, `previous`: -1 sets no condition) and the watermark it may
        move to."""
        parts = list(_chunks(self.items)) or [()]
        for index, chunk in enumerate(parts):
            mark = self.last_offset if index == len(parts) - 1 else chunk[-1][0]
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
    token: int
    next_due_ms: int | None
    at_ms: int = 0
    loaded: list[Loaded] = field(default_factory=list)  # per id, in the same order


def _lua(name: str) -> str:
    return resources.files("blackbox").joinpath("lua", f"{name}.lua").read_text("utf-8")


def _script(client: redis.Redis, name: str, *, shared: bool = False) -> Any:
    """Register a script; `shared` puts pending.lua's functions in front of it, after its
    shebang line (which must stay the first)."""
    text = _lua(name)
    if shared:
        shebang, rest = text.split("\n", 1) if text.startswith("#!") else ("", text)
        text = f"{shebang}\n{_lua('pending')}{rest}" if shebang else _lua("pending") + rest
    return client.register_script(text)


def _chunks(items: Sequence[Any], size: int = SCRIPT_CHUNK) -> Iterator[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


class Applying:
    """Intake script calls in flight on one connection: Redis runs each part while the
    intake parses the next, and every reply is read at the end. The store's session
    object: made by `RedisStore.applying`, which owns the connection.

    One connection keeps the calls in the order they were sent, and a partition's first
    chunk in a part waits for the watermark its previous part leaves (see intake.lua), so
    a later call never moves a watermark past one that failed.

    Calls are packed with hiredis directly: redis-py's pipeline checks each argument in
    Python (six or more per request) and its Script adds a SCRIPT EXISTS round trip. They
    are sent without redis-py's health check: its PING would read a reply of ours.
    """

    def __init__(self, store: RedisStore, connection: Any, now_ms: int) -> None:
        self._store = store
        self._connection = connection
        self._now_ms = now_ms
        self._calls: list[list[Any]] = []
        self._sizes: list[int] = []  # per call sent by send(): how many requests it carries
        self._marks: dict[str, int] = {}  # per partition: the watermark of the last call
        self._unread = 0
        # Once a call was refused for memory: per request, its code, or None where its call
        # was refused (see codes()).
        self.partial: list[Applied | None] = []

    @property
    def unread(self) -> int:
        """Replies not read yet: a connection released with any would answer its next user."""
        return self._unread

    def send(self, slices: Sequence[IntakeSlice]) -> None:
        """Send the slices' script calls; Redis runs them while the caller goes on."""
        calls = []
        for part in slices:
            for chunk, after, mark in part.chunks(self._marks.get(part.field, -1)):
                calls.append(self._store._intake_call(part, chunk, after, mark, self._now_ms))
                self._sizes.append(len(chunk))
                self._marks[part.field] = mark
        self.send_calls(calls)

    def send_calls(self, calls: list[list[Any]]) -> None:
        """Send prepared EVALSHA arguments (script SHA, key count, keys, arguments)."""
        packed = [hiredis.pack_command(("EVALSHA", *call)) for call in calls]
        self._connection.send_packed_command(packed, check_health=False)
        self._calls += calls
        self._unread += len(calls)

    def codes(self) -> list[Applied]:
        """What each request sent did, in the order sent. If Redis lost its script cache (a
        restart), the call that met it ran nothing and the chunks after it in its partition
        refuse to run: the script is loaded again and the calls resent from that one on.

        A Redis over `maxmemory` refuses a call whole (OutOfMemoryError, raised): the calls
        before it, and those of other partitions, may have run. `partial` then tells each
        request's code, None for those refused, so what ran can be answered: a re-read
        would skip it as applied already."""
        replies: list[list[int]] = []
        try:
            self._read_into(replies)
        except redis.exceptions.NoScriptError:
            self._connection.disconnect()  # the replies after it are left unread
            self._unread = 0
            self._store.client.script_load(self._store._intake.script)
            replies += self._store._run_intake(self._calls[len(replies) :])
        except redis.exceptions.OutOfMemoryError:
            self.partial = self._after_refusal(replies)
            raise
        return [_APPLIED[code] for codes in replies for code in codes]

    def _after_refusal(self, replies: list[list[int]]) -> list[Applied | None]:
        """Read the replies left after a refused call (None for each refused one) and give
        every request its code, None where its call was refused."""
        self._unread -= 1  # the refused call's reply was read
        read: list[list[int] | None] = [*replies, None]
        while self._unread:
            self._unread -= 1
            try:
                read.append(self._connection.read_response())
            except redis.ResponseError:  # refused too, or waiting for a refused one (a gap)
                read.append(None)
        return [
            code
            for reply, size in zip(read, self._sizes, strict=True)
            for code in ([None] * size if reply is None else [_APPLIED[c] for c in reply])
        ]

    def replies(self) -> list[list[int]]:
        """The raw replies of the calls sent, in order."""
        replies: list[list[int]] = []
        self._read_into(replies)
        return replies

    def _read_into(self, replies: list[list[int]]) -> None:
        while self._unread:
            replies.append(self._connection.read_response())
            self._unread -= 1


class RedisStore:
    """The due and in-flight sets of one namespace, and the payloads they point to."""

    def __init__(
        self,
        client: redis.Redis,
        keys: Keys,
        grace_seconds: int,
        ended_retention_seconds: int = 86_400,
    ) -> None:
        self.client = client
        self.keys = keys
        self.grace_seconds = grace_seconds
        self.ended_retention_seconds = ended_retention_seconds
        self._intake = _script(client, "intake", shared=True)
        # Lua measures strings in bytes: the tag's length to cut an id from its payload key.
        self._tag_bytes = len(keys.tag.encode("utf-8"))
        self._claim = _script(client, "claim")
        self._ack = _script(client, "ack")
        self._retry = _script(client, "retry")
        self._release = _script(client, "release")
        self._reclaim = _script(client, "reclaim")
        self._cancel = _script(client, "cancel", shared=True)
        self._reschedule = _script(client, "reschedule", shared=True)

    def apply(self, slices: Sequence[IntakeSlice], now_ms: int) -> list[Applied]:
        """Apply what each intake slice holds that is new (replays are no-ops).

        Returns one Applied per item, in the order of the slices and their items. Each
        chunk is one atomic script call that also moves its partition's watermark, so a
        partial failure leaves Redis consistent.
        """
        with self.applying(now_ms) as applying:
            applying.send(slices)
            return applying.codes()

    @contextmanager
    def applying(self, now_ms: int = 0) -> Iterator[Applying]:
        """Intake slices sent part by part on one connection, their codes read at the end
        (`now_ms` sets the payloads' TTLs)."""
        pool = self.client.connection_pool
        connection = pool.get_connection()
        applying = Applying(self, connection, now_ms)
        try:
            connection.check_health()  # type: ignore[no-untyped-call]  # while none of ours is unread
            yield applying
        except BaseException:
            connection.disconnect()  # type: ignore[no-untyped-call]
            raise
        finally:
            if applying.unread:  # replies left on the wire would answer the next user
                connection.disconnect()  # type: ignore[no-untyped-call]
            pool.release(connection)

    def _intake_call(
        self,
        part: IntakeSlice,
        chunk: Sequence[tuple[int, Write]],
        after: int,
        mark: int,
        now_ms: int,
    ) -> list[Any]:
        """The EVALSHA arguments of one chunk: the script's keys, then its arguments."""
        keys = [self.keys.due, self.keys.in_flight, self.keys.intake_marks, self.keys.attempts]
        args: list[Any] = [part.field, mark, self.ended_retention_seconds, self._tag_bytes, after]
        for offset, write in chunk:
            request = self._args(offset, write, now_ms)
            keys.append(self.keys.payload(write.id))
            if request[1] != "n":  # only a caller's id has an ended-marker
                keys.append(self.keys.ended(write.id))
            args += request
        return [self._intake.sha, len(keys), *keys, *args]

    def _run_intake(self, calls: list[list[Any]]) -> list[list[int]]:
        """Send chunks' EVALSHA calls at once on a connection of their own, read the replies."""
        with self.applying() as applying:
            applying.send_calls(calls)
            return applying.replies()

    def _args(self, offset: int, write: Write, now_ms: int) -> tuple[Any, ...]:
        if isinstance(write, Cancellation):
            return (offset, "c", 0, 0, b"")
        op = "u" if write.id.startswith(SCOPED_PREFIX) else "n"
        ttl = max(0, math.ceil((write.due_ms - now_ms) / 1000)) + self.grace_seconds
        return (offset, op, write.due_ms, ttl, write.encode())

    def claim_due(self, now_ms: int, limit: int, lease_ms: int) -> Claim:
        """Move up to `limit` ids due by `now_ms` to in flight, leased for `lease_ms`, with
        their payloads and past attempts, in one round trip."""
        token = now_ms + lease_ms
        keys = [self.keys.due, self.keys.in_flight, self.keys.attempts]
        args = [now_ms, limit, token, self.keys.payload(""), self.keys.ended("")]
        ids, next_due, payloads, attempts, ended = self._claim(keys=keys, args=args)
        loaded = [
            Loaded(id=i.decode("utf-8"), payload=p, attempts=int(a or 0), ended=e)
            for i, p, a, e in zip(ids, payloads, attempts, ended, strict=True)
        ]
        return Claim(
            ids=[item.id for item in loaded],
            loaded=loaded,
            token=token,
            next_due_ms=int(float(next_due)) if next_due else None,
            at_ms=now_ms,
        )

    def ack(self, ids: Sequence[str], token: int) -> int:
        """Forget ids that were delivered or dead-lettered; return how many were still ours."""
        acked = 0
        for chunk in _chunks(ids):
            keys = [self.keys.in_flight, self.keys.due, self.keys.attempts]
            for i in chunk:
                keys += [self.keys.payload(i), self.keys.ended(i)]
            args = [token, self.ended_retention_seconds, *chunk]
            acked += int(self._ack(keys=keys, args=args))
        return acked

    def retry(self, ids: Sequence[str], token: int, retry_at_ms: int) -> int:
        """Give failed ids back to due at `retry_at_ms`, counting the attempt."""
        moved = 0
        keys = [self.keys.in_flight, self.keys.due, self.keys.attempts]
        for chunk in _chunks(ids):
            moved += int(self._retry(keys=keys, args=[token, retry_at_ms, *chunk]))
        return moved

    def release(self, dues: Sequence[tuple[str, int]], token: int) -> int:
        """Hand claimed (id, due ms) back to due untouched: their payloads were not due yet."""
        released = 0
        keys = [self.keys.in_flight, self.keys.due]
        for chunk in _chunks(dues):
            args = [token, *(a for pair in chunk for a in pair)]
            released += int(self._release(keys=keys, args=args))
        return released

    def reclaim(self, now_ms: int, limit: int) -> int:
        """Return up to `limit` ids whose lease expired by `now_ms` to due."""
        keys = [self.keys.in_flight, self.keys.due, self.keys.attempts]
        return int(self._reclaim(keys=keys, args=[now_ms, limit]))

    def next_due_ms(self) -> int | None:
        """The earliest due time pending, or None when nothing is due."""
        first = self.client.zrange(self.keys.due, 0, 0, withscores=True)
        return int(first[0][1]) if first else None

    def counts(self) -> tuple[int, int]:
        """How many ids are due and in flight."""
        pipe = self.client.pipeline(transaction=False)
        pipe.zcard(self.keys.due)
        pipe.zcard(self.keys.in_flight)
        due, in_flight = pipe.execute()
        return int(due), int(in_flight)

    def load(self, schedule_id: str) -> Schedule | None:
        """The stored schedule of a pending id (due or in flight), None when there is none."""
        raw: bytes | None = self.client.get(self.keys.payload(schedule_id))  # type: ignore[assignment]
        return None if raw is None else Schedule.decode(schedule_id, raw)

    def cancel(self, schedule_id: str) -> Applied:
        """Cancel one id as an intake cancel record would (the same Lua function):
        CANCELLED, ALREADY_FIRED or NOT_FOUND."""
        keys = [self.keys.due, self.keys.in_flight, self.keys.attempts,
                self.keys.payload(schedule_id), self.keys.ended(schedule_id)]  # fmt: skip
        args = [schedule_id, self.ended_retention_seconds]
        return _APPLIED[int(self._cancel(keys=keys, args=args))]

    def reschedule(
        self, schedule_id: str, due_ms: int, now_ms: int
    ) -> tuple[Applied, Schedule | None]:
        """Move a pending id to `due_ms`: UPDATED with the schedule as now stored; else
        ALREADY_FIRED (in flight or fired), CANCELLED or NOT_FOUND, with None."""
        keys = [self.keys.due, self.keys.in_flight, self.keys.payload(schedule_id),
                self.keys.ended(schedule_id)]  # fmt: skip
        ttl = max(0, math.ceil((due_ms - now_ms) / 1000)) + self.grace_seconds
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
