"""blackbox on a real three-master Redis Cluster: shards on every master, and every message
delivered once."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import redis
from redis.crc import key_slot

from blackbox.clock import now_ms
from blackbox.dev.cluster import RedisCluster
from blackbox.dev.servers import LOOPBACK
from blackbox.schedule import Schedule
from blackbox.settings import Settings
from blackbox.storage import connections
from blackbox.storage.applying import Applied, IntakeSlice, Write
from blackbox.storage.keys import Layout
from blackbox.storage.store import RedisStore
from tests.integration.conftest import ReaderFactory, ServiceFactory
from tests.kafkatools import envelope, produce, unique, wait_until


def test_a_service_on_redis_cluster_spreads_shards_over_masters_and_delivers_all(
    redis_cluster: RedisCluster,
    start_service: ServiceFactory,
    reader: ReaderFactory,
) -> None:
    """Scale: with `redis+cluster://` and six shards the messages land on all three
    masters (each script in one slot), and each is delivered once."""
    service = start_service(REDIS_URL=redis_cluster.url, BLACKBOX_SHARDS="6")
    settings: Settings = service.settings
    target = unique("clustered")
    produce(settings.kafka["bootstrap.servers"], settings.intake_topic,
            [envelope(target, {"n": n}, 3) for n in range(600)])  # fmt: skip

    client = connections.redis_client(redis_cluster.url)
    wait_until(lambda: sum(service.store.counts()) == 600, what="600 pending")
    per_master = [int(node.dbsize()) for node in connections.primaries(client)]
    assert len(per_master) == 3 and min(per_master) > 100, per_master

    target_reader = reader(target)
    target_reader.wait_count(600, timeout=60)
    wait_until(lambda: service.store.counts() == (0, 0), what="nothing pending")
    records = target_reader.read_to_end()
    ids = Counter(r.header("blackbox-id") for r in records)
    assert len(records) == len(ids) == 600
    client.close()


def _command(node: redis.Redis, *args: object) -> Any:
    return node.execute_command(*args)  # type: ignore[no-untyped-call]


def _move_slot(cluster: RedisCluster, slot: int) -> None:
    """Move `slot`, keys and all, to another master, as resharding does."""
    nodes = {n.port: redis.Redis(host=LOOPBACK, port=n.port) for n in cluster.nodes}
    try:
        ids = {port: node.cluster("MYID") for port, node in nodes.items()}
        owner = next(p for p, n in nodes.items() if n.cluster("COUNTKEYSINSLOT", slot) > 0)
        target = next(p for p in nodes if p != owner)
        source, destination = nodes[owner], nodes[target]
        _command(destination, "CLUSTER", "SETSLOT", slot, "IMPORTING", ids[owner])
        _command(source, "CLUSTER", "SETSLOT", slot, "MIGRATING", ids[target])
        keys = _command(source, "CLUSTER", "GETKEYSINSLOT", slot, 1000)
        _command(source, "MIGRATE", LOOPBACK, target, "", 0, 5000, "KEYS", *keys)
        for node in nodes.values():
            _command(node, "CLUSTER", "SETSLOT", slot, "NODE", ids[target])
    finally:
        for node in nodes.values():
            node.close()


def test_intake_follows_a_shard_whose_slot_moved(redis_cluster: RedisCluster) -> None:
    """Guarantee 5 on Redis Cluster: intake writes over its own per-node connections;
    when a shard's slot moves to another master (resharding), the write that meets MOVED
    fails (intake retries the batch) and the next one reaches the new master, even in an
    intake-only process where no other command would refresh the client's slot map."""
    client = connections.redis_client(redis_cluster.url)
    store = RedisStore(client, Layout(unique("ns"), 3), grace_seconds=60)
    due = now_ms() + 60_000
    ids = [f"in:0:{o}" for o in range(100) if store.layout.shard_of(f"in:0:{o}") == 2][:4]
    items: list[tuple[int, Write]] = [(n, Schedule(i, "t", b"v", due)) for n, i in enumerate(ids)]
    store.apply([IntakeSlice("in", 0, 1, items[:2])], now_ms())

    _move_slot(redis_cluster, key_slot(store.layout.shards[2].due.encode()))

    with pytest.raises(redis.exceptions.MovedError):
        store.apply([IntakeSlice("in", 0, 3, items[2:])], now_ms())
    codes = store.apply([IntakeSlice("in", 0, 3, items[2:])], now_ms())
    assert codes == [Applied.SCHEDULED] * 2
    assert store.counts() == (4, 0)
    client.close()
