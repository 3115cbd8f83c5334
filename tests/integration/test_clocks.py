"""The shards' clocks on a real Redis (beat.lua), and the claims they guard (claim.lua): a
Redis that lost its clock, or whose clock went back beyond a failover's lag, gives nothing
to fire (issue 50). Their judgement is pure logic in tests/unit/test_clocks.py; the
scenarios on running services are in test_redis_loss.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from blackbox.clock import now_ms
from blackbox.dev.servers import RedisServer
from blackbox.storage import clocks
from blackbox.storage.clocks import Clocks, State
from blackbox.storage.keys import Layout
from blackbox.storage.store import RedisStore
from tests.kafkatools import unique

MAX_LAG_MS = 60_000


@pytest.fixture
def store(redis_server: RedisServer) -> Iterator[RedisStore]:
    client = redis.Redis.from_url(redis_server.url)
    yield RedisStore(client, Layout(unique("ns"), 2), grace_seconds=60)
    client.close()


def _clocks(store: RedisStore) -> Clocks:
    return Clocks(store.client, store.layout, MAX_LAG_MS, store.beat_all)


def _due(store: RedisStore, shard: int) -> None:
    keys = store.layout.shards[shard]
    store.client.zadd(keys.due, {"x": now_ms() - 1})
    store.client.set(keys.payload("x"), b"payload")


def _claim(store: RedisStore, clocks: Clocks, shard: int) -> list[str]:
    (claim,) = store.claim_all(now_ms(), 10, 30_000, [shard], floors=clocks.floors())
    return claim.ids


def test_a_clock_is_created_by_a_writer_and_only_moves_forward(store: RedisStore) -> None:
    """A look creates nothing (a restored Redis's clock stays as evidence until judged); a
    write creates the clock where none was, and moves it on, never back."""
    clocks = _clocks(store)
    assert [c.state for c in clocks.look(1_000)] == [State.NONE, State.NONE]
    assert [c.at_ms for c in clocks.look(1_000, write=True)] == [1_000, 1_000]
    assert [c.at_ms for c in clocks.look(500, write=True)] == [1_000, 1_000]
    assert [c.at_ms for c in clocks.look(2_000, write=True)] == [2_000, 2_000]
    assert store.client.hget(store.layout.shards[1].clock, "at") == b"2000"


def test_a_flushed_shard_is_found_and_its_claims_refused(store: RedisStore) -> None:
    """Issue 50: the clock gone with the data (FLUSHALL, a restart empty) is `missing` to a
    process that saw it, and claim.lua refuses to take anything from that shard."""
    clocks = _clocks(store)
    clocks.look(now_ms(), write=True)
    _due(store, 0)
    store.client.delete(store.layout.shards[0].clock)
    assert [c.state for c in clocks.look(now_ms())] == [State.MISSING, State.OK]
    with pytest.raises(redis.ResponseError, match="BLACKBOX_LOST flushed"):
        _claim(store, clocks, 0)
    assert _claim(store, _clocks(store), 0) == ["x"]  # a process that never saw it: no floor


def test_a_clock_gone_back_beyond_the_lag_is_stale_and_its_claims_refused(
    store: RedisStore,
) -> None:
    """Issue 50: a snapshot restored is older than a failover's lag: what it holds due may
    have fired already, so nothing is claimed from it; within the lag, claims go on."""
    clocks = _clocks(store)
    now = now_ms()
    clocks.look(now, write=True)
    _due(store, 0)
    clock = store.layout.shards[0].clock
    store.client.hset(clock, "at", str(now - MAX_LAG_MS))  # a replica the whole lag behind
    assert _claim(store, clocks, 0) == ["x"]
    _due(store, 1)
    store.client.hset(store.layout.shards[1].clock, "at", str(now - MAX_LAG_MS - 1))
    assert [c.state for c in clocks.look(now)] == [State.OK, State.STALE]
    with pytest.raises(redis.ResponseError, match="BLACKBOX_LOST restored"):
        _claim(store, clocks, 1)


def test_a_lost_mark_holds_every_process_until_restarted(store: RedisStore) -> None:
    """The mark left by the process that found the loss holds the others and the next
    start too (no floor needed); a rebuild's restart clears it and claims go on."""
    finder = _clocks(store)
    finder.look(now_ms(), write=True)
    finder.mark_lost([0], "restored", now_ms(), "test")
    _due(store, 0)
    newcomer = _clocks(store)
    found = newcomer.look(now_ms(), write=True)
    assert found[0].state is State.LOST
    assert found[0].lost == "restored"
    with pytest.raises(redis.ResponseError, match="BLACKBOX_LOST restored"):
        _claim(store, newcomer, 0)
    clocks.restart(store.client, store.layout, now_ms())
    assert [c.state for c in newcomer.look(now_ms())] == [State.OK, State.OK]
    assert _claim(store, newcomer, 0) == ["x"]


def test_a_clock_names_the_server_it_was_last_moved_on(store: RedisStore) -> None:
    """A write records each shard's server; the next look tells the server it was moved on
    before, so an intake and a claim can tell Redis was restarted or replaced since."""
    clocks = _clocks(store)
    servers = store.run_ids()
    assert [c.server for c in clocks.look(now_ms(), write=True, servers=servers)] == [None, None]
    assert [c.server for c in clocks.look(now_ms())] == servers
    (claim,) = store.claim_all(now_ms(), 10, 30_000, [0], identify=True)
    assert claim.clock_server == servers[0]
    assert claim.clock_at_ms is not None
    assert claim.connection is not None and claim.connection.startswith(b"id=")
