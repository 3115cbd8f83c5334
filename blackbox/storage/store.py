"""RedisStore: schedules in Redis, one method per Lua script.

A pending id lives in exactly one of two sorted sets: `due` (scored by due time) or
`in flight` (scored by the expiry of the lease of the replica firing it). Every move
between them is one script call, so any number of replicas may share one Redis.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import redis

from blackbox.errors import ConcurrentUpdate
from blackbox.schedule import Schedule
from blackbox.storage import scripts
from blackbox.storage.applying import Applied, Applying, IntakeScript, IntakeSlice, chunked
from blackbox.storage.connections import RedisClient, refresh_after
from blackbox.storage.keys import Layout
from blackbox.storage.watermarks import Watermarks

# Tries of a reschedule whose payload an intake update replaced between read and write.
RESCHEDULE_TRIES = 3
RESCHEDULE_CHANGED = 6  # reschedule.lua: the payload changed since it was read
# Payload bytes one claim takes at most, unless told (BLACKBOX_BATCH_BYTES).
DEFAULT_CLAIM_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Advance:
    """A fired (or passed over) occurrence of a series to settle: the series' next version
    (`next`) stored in the same step, or, with None, the series ends."""

    id: str
    next: Schedule | None


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
        self.intake = IntakeScript(_script(client, "intake", shared=True), layout,
                                   self.pool_of, self.ttl, ended_retention_seconds)  # fmt: skip
        self._claim = _script(client, "claim")
        self._ack = _script(client, "ack")
        self._advance = _script(client, "advance")
        self._retry = _script(client, "retry")
        self._release = _script(client, "release")
        self._reclaim = _script(client, "reclaim")
        self._cancel = _script(client, "cancel", shared=True)
        self._reschedule = _script(client, "reschedule", shared=True)

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
    def applying(self, now_ms: int = 0, known: Watermarks | None = None) -> Iterator[Applying]:
        """Intake slices sent part by part, their codes read at the end (`now_ms` sets the
        payloads' TTLs; `known`: the marks this process saw confirmed, see watermarks.py)."""
        applying = Applying(self.intake, now_ms, known)
        failed = True
        try:
            yield applying
            failed = False
        except BaseException as e:
            refresh_after(self.client, e)  # the next session finds the slots' new nodes
            raise
        finally:
            applying.release(failed)

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
        for chunk in chunked(ids):
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
        for chunk in chunked(items):
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
        for chunk in chunked(ids):
            moved += int(self._retry(keys=keys, args=[token, retry_at_ms, *chunk]))
        return moved

    def release(self, dues: Sequence[tuple[str, int]], token: float, shard: int = 0) -> int:
        """Hand claimed (id, due ms) of `shard` back to due untouched: their payloads were
        not due yet."""
        released = 0
        keys_of = self.layout.shards[shard]
        keys = [keys_of.in_flight, keys_of.due]
        for chunk in chunked(dues):
            args = [token, *(a for pair in chunk for a in pair)]
            released += int(self._release(keys=keys, args=args))
        return released

    def reclaim(self, now_ms: int, limit: int, shard: int = 0) -> int:
        """Return up to `limit` ids of `shard` whose lease expired by `now_ms` to due."""
        keys_of = self.layout.shards[shard]
        keys = [keys_of.in_flight, keys_of.due, keys_of.attempts]
        return int(self._reclaim(keys=keys, args=[now_ms, limit]))

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
        return Applied(int(self._cancel(keys=keys, args=args)))

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
                return Applied(code), moved if code == Applied.UPDATED else None
        raise ConcurrentUpdate(f"{schedule_id!r} changed {RESCHEDULE_TRIES} times while moved")
