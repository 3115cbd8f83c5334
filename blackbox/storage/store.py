"""RedisStore: schedules in Redis, one method per Lua script.

A pending id lives in exactly one of two sorted sets: `due` (scored by due time) or
`in flight` (scored by the expiry of the lease of the replica firing it). Every move
between them is one script call, so any number of replicas may share one Redis.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

import redis
from redis.exceptions import AskError, ClusterCrossSlotError, NoScriptError, TryAgainError

from blackbox.errors import ConcurrentUpdate, CorruptSchedule
from blackbox.reference import Reference, is_reference
from blackbox.schedule import CALLER_WITHIN, Schedule, caller_from_prefix, owner_of
from blackbox.storage import scripts
from blackbox.storage.applying import Applied, Applying, IntakeScript, IntakeSlice, chunked
from blackbox.storage.connections import RedisClient, refresh_after
from blackbox.storage.keys import SHARED_OWNER, Layout
from blackbox.storage.watermarks import Watermarks

# Tries of a reschedule whose payload an intake update replaced between read and write.
RESCHEDULE_TRIES = 3
RESCHEDULE_CHANGED = 6  # reschedule.lua: the payload changed since it was read
# What a pipelined script call may answer that the same call run on its own does not: a
# script the node lost (a restart, a failover), a slot moved or moving on a cluster.
RUN_AGAIN = (NoScriptError, AskError, TryAgainError)
# The most ended ids one owned.lua call removes from one caller's set in one shard.
PRUNE_BATCH = 1000
# Payload bytes one claim takes at most, unless told (BLACKBOX_BATCH_BYTES).
DEFAULT_CLAIM_BYTES = 16 * 1024 * 1024


class Acks(NamedTuple):
    """Ids of one shard delivered or dead-lettered under one claim's lease token."""

    ids: Sequence[str]
    token: float
    shard: int


class ScriptCall(NamedTuple):
    """One call of a registered script, on the keys of one shard."""

    script: Any
    shard: int
    keys: list[str]
    args: list[Any]


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
    # Asked for (`leases_seen`): the earliest lease expiry in the shard after the claim
    # (this one's or another's), None for no lease; nothing there can be reclaimed before.
    leases_seen: bool = False
    lease_expiry_ms: int | None = None
    connection: bytes | None = None  # the connection that made it, where asked (`identify`)
    # The shard's clock (clocks.py): when an intake last found it whole, and on which server.
    clock_at_ms: int | None = None
    clock_server: str | None = None
    recheck: str | None = None  # the shard clock's recheck mark, "<since ms> <until ms>"


class Reclaimed(NamedTuple):
    """What one shard's reclaim did: ids returned to due, and the earliest lease expiry
    left there (None: no lease; at or before the reclaim's time: more expired)."""

    returned: int
    lease_expiry_ms: int | None


# A probe's answer per shard: something due by its time, nothing due, or nothing at all
# (no due id and no lease: nothing to claim or reclaim there).
PROBED_DUE, PROBED_NOT_DUE, PROBED_EMPTY = 1, 0, -1


def pending_counts(client: RedisClient, layout: Layout) -> tuple[int, int]:
    """How many ids are due and in flight, over every shard of `layout` (one round trip
    per Redis node). On one Redis, one EXISTS over every set first: while nothing is
    pending (idle), that is the only command (the readiness probe asks every 2 s)."""
    if not isinstance(client, redis.RedisCluster):
        every = [key for keys in layout.shards for key in (keys.due, keys.in_flight)]
        try:
            if not client.exists(*every):
                return 0, 0
        except ClusterCrossSlotError:  # slots behind a plain URL: counted per shard below
            pass
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


class StoreReader(Protocol):
    """Reads back the store records index mode's references name (kafka/storereader.py)."""

    def resolve(self, ids: Sequence[str], payloads: Sequence[bytes | None]) -> list[bytes | None]:
        """Each payload as an encoding, a reference read back (None: its record missing)."""

    def values(self, wanted: Sequence[tuple[str, Reference]]) -> dict[str, bytes]:
        """The encoding each (id, reference) stands for, by id, the missing left out."""

    def remember(self, key: bytes, value: bytes, place: tuple[int, int]) -> None:
        """Keep a record written at `place` (partition, offset)."""

    def close(self) -> None:
        """Let go of its consumer."""


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
        # Index mode: reads back what references name (kafka/storereader.py); None: inline.
        self.reader: StoreReader | None = None
        self.grace_seconds = grace_seconds
        self.ended_retention_seconds = ended_retention_seconds
        self.intake = IntakeScript(_script(client, "intake", shared=True), layout,
                                   self.pool_of, self.ttl, ended_retention_seconds)  # fmt: skip
        self.intake.grouping = not isinstance(client, redis.RedisCluster)
        self._claim = _script(client, "claim")
        self._ack = _script(client, "ack")
        self._advance = _script(client, "advance")
        self._retry = _script(client, "retry")
        self._release = _script(client, "release")
        self._reclaim = _script(client, "reclaim")
        self._probe = _script(client, "probe")
        self._cancel = _script(client, "cancel", shared=True)
        self._reschedule = _script(client, "reschedule", shared=True)
        self._owned = _script(client, "owned")
        self._beat = _script(client, "beat")
        self._repoint = _script(client, "repoint")

    def pool_of(self, shard: int) -> Any:
        """The connection pool of the Redis node serving `shard`."""
        return self._node_client(shard).connection_pool

    def _node_client(self, shard: int) -> redis.Redis:
        """A client of the Redis node serving `shard` (the client itself on one Redis)."""
        if isinstance(self.client, redis.RedisCluster):
            node = self.client.get_node_from_key(self.layout.shards[shard].due)  # type: ignore[no-untyped-call]
            connection: redis.Redis = self.client.get_redis_connection(node)
            return connection
        return self.client

    def _run_all(
        self, calls: Sequence[ScriptCall], connections: dict[int, bytes] | None = None
    ) -> list[Any]:
        """Each call's answer, in order: one round trip per Redis node for all of them, so
        that many shards cost what one does. A call the pipeline could not run (a script
        the node lost, a slot moved on a cluster) is run again on its own. With
        `connections`, each node's round trip names its connection first (`CLIENT INFO`'s
        id and address, a few bytes), and `connections` gets it per call: a connection not
        seen before may lead to another server (a failover, a restart: `run_id`)."""
        answers: list[Any] = [None] * len(calls)
        by_node: dict[int, list[int]] = {}
        for n, call in enumerate(calls):
            by_node.setdefault(id(self.pool_of(call.shard)), []).append(n)
        for numbers in by_node.values():
            pipe = self._node_client(calls[numbers[0]].shard).pipeline(transaction=False)
            if connections is not None:
                pipe.execute_command("CLIENT", "INFO")  # type: ignore[no-untyped-call]
            for n in numbers:
                script, _, keys, args = calls[n]
                pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)  # type: ignore[no-untyped-call]
            replies = pipe.execute(raise_on_error=False)
            if connections is not None:
                named = replies.pop(0)
                if isinstance(named, Exception):
                    raise named
                key = b" ".join(bytes(named).split(b" ", 2)[:2])  # "id=N addr=host:port"
                connections.update(dict.fromkeys(numbers, key))
            for n, answer in zip(numbers, replies, strict=True):
                script, _, keys, args = calls[n]
                if isinstance(answer, RUN_AGAIN):
                    answer = script(keys=keys, args=args)  # noqa: PLW2901 - its own answer
                elif isinstance(answer, Exception):
                    raise answer
                answers[n] = answer
        return answers

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

    def count_owned(
        self, owners: Sequence[str], now_ms: int, prune: int = PRUNE_BATCH
    ) -> dict[str, int]:
        """How many ids each owner (a caller as in its ids) has pending, summed over the
        shards: its owned sets, each pruned first of up to `prune` ids due by `now_ms`
        that ended. One round trip per Redis node."""
        calls = []
        for owner in owners:
            for shard, keys_of in enumerate(self.layout.shards):
                keys = [keys_of.owned(owner), keys_of.due, keys_of.in_flight, keys_of.owners]
                calls.append(ScriptCall(self._owned, shard, keys, [now_ms, prune, owner]))
        counts = dict.fromkeys(owners, 0)
        for call, (_, left) in zip(calls, self._run_all(calls), strict=True):
            counts[call.args[2]] += int(left)
        return counts

    def owners(self) -> set[str]:
        """The callers with an owned set in any shard (as in their ids)."""
        pipe = self.client.pipeline(transaction=False)
        for keys_of in self.layout.shards:
            pipe.smembers(keys_of.owners)
        return {owner.decode() for members in pipe.execute() for owner in members}

    def pending_of(self, ids: Sequence[str]) -> list[bool]:
        """Whether each id is pending (due or in flight): one round trip per Redis node."""
        pipe = self.client.pipeline(transaction=False)
        for schedule_id in ids:
            keys_of = self.layout.keys_of(schedule_id)
            pipe.zscore(keys_of.due, schedule_id)
            pipe.zscore(keys_of.in_flight, schedule_id)
        replies = pipe.execute()
        pairs = zip(replies[0::2], replies[1::2], strict=True)
        return [due is not None or flying is not None for due, flying in pairs]

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
        (claim,) = self.claim_all(now_ms, limit, lease_ms, [shard], due_by_ms=due_by_ms,
                                  max_bytes=max_bytes)  # fmt: skip
        return claim

    def claim_all(  # noqa: PLR0913 - the claim script's arguments, each named
        self, now_ms: int, limit: int, lease_ms: int, shards: Sequence[int], *,
        due_by_ms: int | None = None, max_bytes: int = DEFAULT_CLAIM_BYTES,
        see_leases: Collection[int] = (), floors: Mapping[int, int] | None = None,
        identify: bool = False,
    ) -> list[Claim]:  # fmt: skip
        """`claim_due` of each of `shards`, in one round trip per Redis node: a claim per
        shard, in their order; those of `see_leases` also answer their shard's earliest
        lease expiry. A shard whose clock is below its floor in `floors`, missing, or marked
        lost is not claimed: `redis.ResponseError` BLACKBOX_LOST (clocks.py). With
        `identify`, each claim names the connection that made it (see `_run_all`)."""
        due_by = now_ms if due_by_ms is None else due_by_ms
        calls = []
        for shard in shards:
            keys_of = self.layout.shards[shard]
            keys = [keys_of.due, keys_of.in_flight, keys_of.attempts, keys_of.lease_counter,
                    keys_of.clock]  # fmt: skip
            args = [due_by, limit, now_ms + lease_ms, keys_of.payload(""), keys_of.ended(""),
                    max_bytes, "1" if shard in see_leases else "0",
                    -1 if floors is None else floors.get(shard, -1)]  # fmt: skip
            calls.append(ScriptCall(self._claim, shard, keys, args))
        if len(calls) == 1 and not identify:  # no pipeline needed
            call = calls[0]
            return [_claimed(self._claim(keys=call.keys, args=call.args), call, due_by, limit)]
        connections: dict[int, bytes] | None = {} if identify else None
        answers = self._run_all(calls, connections)
        named = connections or {}
        return [_claimed(a, c, due_by, limit, named.get(n))
                for n, (a, c) in enumerate(zip(answers, calls, strict=True))]  # fmt: skip

    def run_id(self, shard: int) -> str:
        """The run id of the Redis server serving `shard` now (another after a failover or
        a restart)."""
        server: Any = self._node_client(shard).info("server")
        return str(server["run_id"])

    def ack(self, ids: Sequence[str], token: float, shard: int = 0) -> int:
        """Forget ids of `shard` that were delivered or dead-lettered; return how many were
        still ours."""
        return self.ack_all([Acks(ids, token, shard)])[0]

    def ack_all(
        self, batches: Sequence[Acks], ended: list[tuple[str, bool]] | None = None
    ) -> list[int]:
        """`ack` of each batch (of any shards), in one round trip per Redis node; how many
        of each were still ours. `ended`, where given, gets each id that ended here (not due
        again after an update that came while it flew) and whether a cancel ended it."""
        calls, of_batch = [], []
        report = "1" if ended is not None else "0"
        for n, batch in enumerate(batches):
            keys_of = self.layout.shards[batch.shard]
            for chunk in chunked(batch.ids):
                keys = [keys_of.in_flight, keys_of.due, keys_of.attempts]
                for i in chunk:
                    keys += [keys_of.payload(i), keys_of.ended(i)]
                args = [batch.token, self.ended_retention_seconds, report, *chunk]
                calls.append(ScriptCall(self._ack, batch.shard, keys, args))
                of_batch.append(n)
        acked = [0] * len(batches)  # a batch with nothing to ack (series advances) has 0
        if len(calls) == 1:  # no pipeline needed
            _, _, keys, args = calls[0]
            answers = [self._ack(keys=keys, args=args)]
        else:
            answers = self._run_all(calls)
        for n, answer in zip(of_batch, answers, strict=True):
            if ended is None:
                acked[n] += int(answer)
                continue
            acked[n] += int(answer[0])
            pairs = zip(answer[1::2], answer[2::2], strict=True)
            ended += [(i.decode("utf-8"), how == b"c") for i, how in pairs]
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
        return self.reclaim_all(now_ms, limit, [shard])

    def reclaim_all(self, now_ms: int, limit: int, shards: Sequence[int]) -> int:
        """`reclaim` in each of `shards`, in one round trip per Redis node; how many in all."""
        return sum(reclaimed.returned for reclaimed in self.reclaim_each(now_ms, limit, shards))

    def reclaim_each(self, now_ms: int, limit: int, shards: Sequence[int]) -> list[Reclaimed]:
        """`reclaim` in each of `shards`, in one round trip per Redis node: per shard, how
        many came back and the earliest lease expiry left there."""
        calls = []
        for shard in shards:
            keys_of = self.layout.shards[shard]
            keys = [keys_of.in_flight, keys_of.due, keys_of.attempts]
            calls.append(ScriptCall(self._reclaim, shard, keys, [now_ms, limit]))
        return [Reclaimed(int(count), _ms(expiry)) for count, expiry in self._run_all(calls)]

    def beat_all(
        self, floors: Sequence[int], now_ms: int, *, write: bool,
        servers: Sequence[str] | None = None,
    ) -> list[Any]:  # fmt: skip
        """Every shard's clock as beat.lua answers it, judged against its floor in `floors`
        and, with `write`, moved to `now_ms` and to its server in `servers` (`run_ids`)
        where it stands (one round trip per node)."""
        named = servers or [""] * self.layout.count
        calls = [
            ScriptCall(self._beat, shard, [keys.clock],
                       [floor, "1" if write else "0", now_ms, named[shard]])
            for shard, (keys, floor) in enumerate(zip(self.layout.shards, floors, strict=True))
        ]  # fmt: skip
        return self._run_all(calls)

    def run_ids(self) -> list[str]:
        """Per shard, the run id of the Redis server serving it now (one INFO per node)."""
        by_pool: dict[int, str] = {}
        found = []
        for shard in range(self.layout.count):
            pool = id(self.pool_of(shard))
            if pool not in by_pool:
                by_pool[pool] = self.run_id(shard)
            found.append(by_pool[pool])
        return found

    def probe_all(self, due_by: Sequence[tuple[int, int]]) -> dict[int, int]:
        """For each (shard, due-by ms): PROBED_DUE if an id there is due by then, else
        PROBED_NOT_DUE, or PROBED_EMPTY if the shard holds nothing at all (no lease
        either). Reads only: one script per Redis node, which on one Redis answers for all
        the shards with one command while nothing is pending. A node whose probe fails
        answers PROBED_DUE for its shards (they are claimed, as if there were no probe);
        the claims then meet the failure, or the slot's new node."""
        by_node: dict[int, list[tuple[int, int]]] = {}
        for shard, by in due_by:
            by_node.setdefault(id(self.pool_of(shard)), []).append((shard, by))
        one_redis = "0" if isinstance(self.client, redis.RedisCluster) else "1"
        answers: dict[int, int] = {}
        nodes = list(by_node.values())
        pipes = []
        for probed in nodes:
            args: list[Any] = [one_redis]
            for shard, by in probed:
                keys_of = self.layout.shards[shard]
                args += [keys_of.due, keys_of.in_flight, by]
            node = self._node_client(probed[0][0])
            pipe = node.pipeline(transaction=False)
            pipe.execute_command("EVALSHA", self._probe.sha, 0, *args)  # type: ignore[no-untyped-call]
            pipes.append((probed, node, args, pipe))
        for probed, node, args, pipe in pipes:
            try:
                (answer,) = pipe.execute(raise_on_error=False)
                if isinstance(answer, NoScriptError):  # loaded there, then run
                    answer = self._probe(keys=[], args=args, client=node)
                if isinstance(answer, Exception):
                    raise answer
            except redis.RedisError:
                answer = [PROBED_DUE] * len(probed)
            for (shard, _), found in zip(probed, answer, strict=True):
                answers[shard] = int(found)
        return answers

    def counts(self) -> tuple[int, int]:
        """How many ids are due and in flight, over all shards."""
        return pending_counts(self.client, self.layout)

    def load(self, schedule_id: str) -> Schedule | None:
        """The stored schedule of a pending id (due or in flight), None when there is none."""
        key = self.layout.keys_of(schedule_id).payload(schedule_id)
        raw: bytes | None = self.client.get(key)  # type: ignore[assignment]
        if raw is not None and is_reference(raw) and self.reader is not None:
            raw = self.reader.resolve([schedule_id], [raw])[0]  # None: its record is missing
        return None if raw is None else Schedule.decode(schedule_id, raw)

    def payloads(self, ids: Sequence[str]) -> list[bytes | None]:
        """The stored encoding of each id, None where none is pending (or in flight)."""
        pipe = self.client.pipeline(transaction=False)
        for schedule_id in ids:
            pipe.get(self.layout.keys_of(schedule_id).payload(schedule_id))
        return list(pipe.execute()) if ids else []

    def repoint(self, moves: Sequence[tuple[str, bytes, bytes]]) -> int:
        """Index mode: each (id, reference read, reference to keep) applied where the id
        still holds the first; how many changed."""
        if not moves:
            return 0
        pipe = self.client.pipeline(transaction=False)
        for schedule_id, was, now in moves:
            key = self.layout.keys_of(schedule_id).payload(schedule_id)
            self._repoint(keys=[key], args=[was, now], client=pipe)
        return sum(int(n) for n in pipe.execute())

    def ended_markers(self, ids: Sequence[str]) -> list[bytes | None]:
        """Each caller's id's ended marker ("f" fired, "c" cancelled), None where none."""
        pipe = self.client.pipeline(transaction=False)
        for schedule_id in ids:
            pipe.get(self.layout.keys_of(schedule_id).ended(schedule_id))
        return list(pipe.execute()) if ids else []

    def cancel(self, schedule_id: str) -> Applied:
        """Cancel one id as an intake cancel record would (the same Lua function):
        CANCELLED, ALREADY_FIRED or NOT_FOUND."""
        keys_of = self.layout.keys_of(schedule_id)
        keys = [keys_of.due, keys_of.in_flight, keys_of.attempts,
                keys_of.payload(schedule_id), keys_of.ended(schedule_id)]  # fmt: skip
        args = [schedule_id, self.ended_retention_seconds]
        head: bytes = self.client.getrange(keys[3], 0, CALLER_WITHIN)  # type: ignore[assignment]
        code = Applied(int(self._cancel(keys=keys, args=args)))
        if code is Applied.CANCELLED:
            self._owned_now(schedule_id, head, None)
        return code

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
            moved = self._decoded(schedule_id, raw)
            if moved is not None:
                moved.due_ms = due_ms
            new = b"" if moved is None else moved.encode()
            if moved is not None and is_reference(raw):  # the reference moves, not the record
                new = raw[:1] + struct.pack(">q", due_ms) + raw[9:]
            code = int(self._reschedule(keys=keys, args=[schedule_id, due_ms, raw, new, ttl]))
            if code == Applied.UPDATED:
                self._owned_now(schedule_id, raw, due_ms)
            if code != RESCHEDULE_CHANGED:
                return Applied(code), moved if code == Applied.UPDATED else None
        raise ConcurrentUpdate(f"{schedule_id!r} changed {RESCHEDULE_TRIES} times while moved")

    def _decoded(self, schedule_id: str, raw: bytes) -> Schedule | None:
        """The schedule a payload holds (a reference read back); None for none."""
        if raw and is_reference(raw):
            found = None if self.reader is None else self.reader.resolve([schedule_id], [raw])[0]
            if found is None:
                raise CorruptSchedule(f"schedule {schedule_id!r}: its store record is missing")
            raw = found
        return Schedule.decode(schedule_id, raw) if raw else None

    def _owned_now(self, schedule_id: str, head: bytes, due_ms: int | None) -> None:
        """Keep the owned set (quotas.py) of an id cancelled (`due_ms` None) or moved by
        the API in step: the id leaves it, or takes its new due time, in whichever of its
        caller's own set and the shared one holds it. `head`: the start of its payload."""
        try:
            caller = caller_from_prefix(head) if head else None
        except CorruptSchedule:
            return
        keys_of = self.layout.keys_of(schedule_id)
        pipe = self.client.pipeline(transaction=False)
        for owner in {owner_of(schedule_id, caller), SHARED_OWNER}:
            if due_ms is None:
                pipe.zrem(keys_of.owned(owner), schedule_id)
            else:
                pipe.zadd(keys_of.owned(owner), {schedule_id: due_ms}, xx=True)
        pipe.execute()


def _claimed(
    answer: Any, call: ScriptCall, due_by: int, limit: int, connection: bytes | None = None
) -> Claim:
    """The claim script's answer to `call` as a Claim of its shard (made over
    `connection`, where named)."""
    shard, seen = call.shard, call.args[6] == "1"
    ids, next_due, payloads, attempts, ended, token, lease, recheck, clock_at, server = answer
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
        leases_seen=seen,
        lease_expiry_ms=_ms(lease),
        recheck=recheck.decode() if recheck else None,
        connection=connection,
        clock_at_ms=int(clock_at) if clock_at else None,
        clock_server=server.decode() if server else None,
    )


def _ms(score: Any) -> int | None:
    """A sorted-set score a script answered (text, or false: None), in whole ms; a lease
    token's fraction of a ms rounds up, so the lease has run out by then."""
    return math.ceil(float(score)) if score else None
