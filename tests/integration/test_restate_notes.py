"""intake.lua's restate notes (intake/restating.py) under each combination of its flags
(owned sets counted, restate notes kept), in its single and grouped forms, on one Redis and
on Redis Cluster: a caller's id stored anew as its ended marker goes is noted once, with
its partition, only where notes are kept; everything else the script does is unchanged."""

from __future__ import annotations

import itertools

import pytest
import redis

from blackbox.clock import now_ms
from blackbox.dev.cluster import RedisCluster
from blackbox.dev.servers import RedisServer
from blackbox.schedule import Schedule
from blackbox.storage import connections
from blackbox.storage.applying import Applied, Cancellation, IntakeSlice, Move, Write
from blackbox.storage.keys import Layout
from blackbox.storage.store import RedisStore
from tests.kafkatools import unique

COMBOS = list(itertools.product([False, True], [False, True]))  # (counting, restating)


def _ids(layout: Layout, n_shards: int) -> dict[int, list[str]]:
    found: dict[int, list[str]] = {s: [] for s in range(n_shards)}
    for n in range(2000):
        i = f"@acme/x{n}"
        s = layout.shard_of(i)
        if len(found[s]) < 3:
            found[s].append(i)
    return found


def _run(
    client: redis.Redis | redis.RedisCluster, counting: bool, restating: bool,
    grouping: bool | None,
) -> None:  # fmt: skip
    """Store ids over three shards from two partitions, cancel them, store them again (and
    move one and store it while pending: no marker, no note), then read one part again."""
    layout = Layout(unique("ns"), 3)
    store = RedisStore(client, layout, grace_seconds=60, ended_retention_seconds=600)
    store.intake.counting = counting
    store.intake.restating = restating
    if grouping is not None:
        store.intake.grouping = grouping
    due = now_ms() + 3_600_000
    by_shard = _ids(layout, 3)
    every = [i for s in by_shard.values() for i in s]

    # several partitions and shards in one apply: grouped where the store groups
    def sch(i: str, d: int = due) -> Schedule:
        return Schedule(i, "t", b"v-" + i.encode(), d, caller=b"acme")

    first: list[tuple[int, Write]] = [(n, sch(i)) for n, i in enumerate(every)]
    half = len(first) // 2
    codes = store.apply(
        [
            IntakeSlice("in", 0, half - 1, first[:half]),
            IntakeSlice("in", 1, 100, [(o + 100, w) for o, (_, w) in enumerate(first[half:])]),
        ],
        now_ms(),
    )
    assert codes == [Applied.SCHEDULED] * len(every)
    # cancel them all (marker "c"), then store again: ids of partition 0 and 1
    cancels = [(n + half, Cancellation(w.id)) for n, (_, w) in enumerate(first[:half])]
    cancels1 = [(200 + n, Cancellation(w.id)) for n, (_, w) in enumerate(first[half:])]
    codes = store.apply(
        [IntakeSlice("in", 0, 2 * half, cancels), IntakeSlice("in", 1, 300, cancels1)], now_ms()
    )
    assert codes == [Applied.CANCELLED] * len(every)
    again: list[tuple[int, Write]] = [
        (2 * half + 1 + n, sch(w.id, due + 5)) for n, (_, w) in enumerate(first[:half])
    ]
    again1: list[tuple[int, Write]] = [
        (400 + n, sch(w.id, due + 5)) for n, (_, w) in enumerate(first[half:])
    ]
    # plus a move and an id stored again while pending (no marker: no note)
    more: list[tuple[int, Write]] = [
        (3 * half + 10, Move(first[0][1].id, b"acme", due + 9)),
        (3 * half + 11, sch(first[0][1].id, due + 11)),
    ]
    codes = store.apply(
        [IntakeSlice("in", 0, 3 * half + 20, again + more), IntakeSlice("in", 1, 500, again1)],
        now_ms(),
    )
    assert sorted(codes) == sorted(
        [Applied.SCHEDULED] * len(every) + [Applied.UPDATED, Applied.UPDATED]
    ), codes
    for i in every:
        k = layout.keys_of(i)
        assert client.get(k.payload(i)) is not None
        assert client.get(k.ended(i)) is None
        want = due + (11 if i == first[0][1].id else 5)
        assert client.zscore(k.due, i) == want
        own = client.zscore(k.owned("acme"), i)
        assert (own is not None) == counting, (i, own)
        if counting:
            assert own == want
        members = set(client.zrange(k.restate, 0, -1))
        part = "in:0" if any(i == w.id for _, w in first[:half]) else "in:1"
        noted = f"{part}|{i}".encode() in members
        assert noted == restating, (i, members)
    total = sum(client.zcard(k.restate) for k in layout.shards)
    assert total == (len(every) if restating else 0)
    for s, k in enumerate(layout.shards):
        if counting:
            assert client.smembers(k.owners) == ({b"acme"} if by_shard[s] else set())
        assert client.hget(k.intake_marks, "in:0") in (None, str(3 * half + 20).encode())
        assert client.hget(k.intake_marks, "in:1") in (None, b"500")
    # a re-read of the same slice: answered 8, no new note
    before = {k.restate: client.zrange(k.restate, 0, -1, withscores=True) for k in layout.shards}
    codes = store.apply([IntakeSlice("in", 1, 500, again1)], now_ms())
    assert set(codes) == {Applied.REREAD_PENDING}
    assert before == {
        k.restate: client.zrange(k.restate, 0, -1, withscores=True) for k in layout.shards
    }


@pytest.mark.parametrize("grouping", [True, False])
@pytest.mark.parametrize(("counting", "restating"), COMBOS)
def test_one_redis(
    redis_server: RedisServer, counting: bool, restating: bool, grouping: bool
) -> None:
    client = redis.Redis.from_url(redis_server.url)
    _run(client, counting, restating, grouping)
    client.close()


@pytest.mark.parametrize(("counting", "restating"), COMBOS)
def test_redis_cluster(redis_cluster: RedisCluster, counting: bool, restating: bool) -> None:
    client = connections.redis_client(redis_cluster.url)
    _run(client, counting, restating, None)
    client.close()
