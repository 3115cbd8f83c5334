"""Following a Redis failover on real processes: a client made from a `redis+sentinel://`
REDIS_URL writes again on the replica Sentinel promotes, and a plain client drops a
connection a demoted primary answers `READONLY` (or a loading replica `LOADING`) on, so its
next command connects afresh (issue 37, Guarantee 5)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
import redis
from redis.exceptions import BusyLoadingError, ReadOnlyError

from blackbox.dev.servers import LOOPBACK, RedisServer, free_port
from blackbox.storage.connections import RedisClient, redis_client
from tests.kafkatools import wait_until
from tests.sentinel import SentinelProcess

pytestmark = pytest.mark.integration

FAILOVER_DEADLINE = 15.0  # seconds: down after 1 s, then one Sentinel promotes at once


@pytest.fixture
def stack() -> Iterator[ExitStack]:
    """Whatever a test starts, stopped at its end even when it fails."""
    with ExitStack() as started:
        yield started


def start_redis(stack: ExitStack, folder: Path, **config: str) -> RedisServer:
    """A redis-server on a free port, killed at the test's end; `config` adds directives."""
    folder.mkdir()
    server = RedisServer(free_port(), folder, config=config)
    server.start()
    stack.callback(server.kill)  # on SIGTERM a primary waits for its replicas to catch up
    return server


def plain(server: RedisServer) -> redis.Redis:
    return redis.Redis(LOOPBACK, server.port, socket_timeout=2)


def replica_linked(server: RedisServer) -> bool:
    with plain(server) as client:
        return bool(client.info("replication").get("master_link_status") == "up")


def writes(client: RedisClient, key: str) -> bool:
    """Whether `client` stored `key` now; False on the failures a failover causes."""
    try:
        return bool(client.set(key, "1"))
    except (redis.ConnectionError, redis.TimeoutError):
        return False


def watched_pair(
    stack: ExitStack, folder: Path
) -> tuple[RedisServer, RedisServer, SentinelProcess]:
    """A primary, its replica (linked) and a Sentinel that knows both, stopped with the test."""
    # Full syncs start at once, not after the 5 s Redis waits for more replicas by default.
    primary = start_redis(stack, folder / "primary", **{"repl-diskless-sync-delay": "0"})
    replica = start_redis(stack, folder / "replica", replicaof=f"{LOOPBACK} {primary.port}")
    wait_until(lambda: replica_linked(replica), 10, "the replica to link to the primary")
    sentinel = SentinelProcess(free_port(), folder / "sentinel", primary.port)
    stack.enter_context(sentinel)
    sentinel.wait_for_replicas(1)
    return primary, replica, sentinel


def test_a_sentinel_client_writes_on_the_promoted_replica_after_the_primary_dies(
    stack: ExitStack, tmp_path: Path
) -> None:
    """Guarantee 5: the client made from `redis+sentinel://host:port/mymaster/0` writes on
    the primary; the primary is killed with SIGKILL; the same client object writes again,
    with no restart, on the replica Sentinel promoted."""
    primary, replica, sentinel = watched_pair(stack, tmp_path)
    client = redis_client(sentinel.url())
    stack.callback(client.close)

    assert client.set("before", "1")
    assert client.wait(1, 5000) == 1  # replicated: a write the kill may lose is not the point
    primary.kill()
    wait_until(lambda: writes(client, "after"), FAILOVER_DEADLINE, "a write after failover")

    assert sentinel.master_address() == (LOOPBACK, replica.port)
    with plain(replica) as promoted:
        assert promoted.mget("before", "after") == [b"1", b"1"]


def test_a_sentinel_client_drops_its_connection_to_a_demoted_primary(
    stack: ExitStack, tmp_path: Path
) -> None:
    """Guarantee 5: after `SENTINEL FAILOVER` the old primary lives on as a replica; the
    client's pooled connection to it meets READONLY on the next write, which fails as a
    ConnectionError and drops it; the write after connects to the master Sentinel names."""
    primary, replica, sentinel = watched_pair(stack, tmp_path)
    client = redis_client(sentinel.url())
    stack.callback(client.close)
    assert client.set("before", "1")

    with sentinel.client() as asking:
        assert asking.sentinel_failover(sentinel.service)
    promoted = (LOOPBACK, replica.port)
    wait_until(lambda: sentinel.master_address() == promoted, FAILOVER_DEADLINE, "a switch")
    # Demoted now, as Sentinel would do on its next look at it (up to 10 s), but keeping
    # the client's connection, which Sentinel's own demotion would close.
    with plain(primary) as demoted:
        demoted.replicaof(LOOPBACK, replica.port)
    with pytest.raises(redis.ConnectionError, match="previous master"):
        client.set("after", "1")

    assert client.set("after", "1")
    with plain(replica) as new_primary:
        assert new_primary.get("after") == b"1"


def test_a_demoted_primary_answering_readonly_loses_the_connection(
    stack: ExitStack, tmp_path: Path
) -> None:
    """Guarantee 5: a primary demoted to a replica behind the same address answers a write
    `READONLY`; the write fails as a RedisError and the connection is closed, so the next
    command connects again (to whichever node the address names then), not to the demoted
    one forever."""
    server = start_redis(stack, tmp_path / "redis")
    client = redis_client(server.url)
    stack.callback(client.close)
    before = client.client_id()
    with plain(server) as admin:
        admin.replicaof(LOOPBACK, free_port())  # a primary nothing answers on
        with pytest.raises(ReadOnlyError):
            client.set("key", "1")
        admin.replicaof("NO", "ONE")

    assert client.set("key", "1")
    assert client.client_id() != before


def test_a_loading_redis_answering_loading_loses_the_connection(
    stack: ExitStack, tmp_path: Path
) -> None:
    """Guarantee 5: a Redis still loading its data answers `LOADING`; the command fails as
    a RedisError (a ConnectionError), its connection is closed, and the same client works
    once the data is loaded."""
    first = start_redis(stack, tmp_path / "redis")
    with plain(first) as filling:
        filling.mset({f"key{i}": "1" for i in range(2000)})
        filling.save()
    first.stop()
    # 1 ms a key, answering clients meanwhile: the load lasts about 2 s.
    slow = {"key-load-delay": "1000", "loading-process-events-interval-bytes": "1024"}
    server = RedisServer(free_port(), first.data_dir, config=slow)
    server.start()
    stack.callback(server.kill)
    client = redis_client(server.url)
    stack.callback(client.close)
    with pytest.raises(BusyLoadingError):
        client.set("key", "1")
    with plain(server) as admin:  # CLIENT LIST is answered while loading
        assert admin.info("persistence")["loading"] == 1
        wait_until(lambda: len(admin.client_list()) == 1, 5, "only the admin's connection")

    wait_until(lambda: writes(client, "key"), 15, "the load to end")
