"""The local Redis Cluster and the cluster client REDIS_URL=redis+cluster://... makes: keys
spread over the masters, scripts on one hash slot, and per-master clients. Where a key lives
is asked of the nodes themselves, not of the client's routing."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from redis.cluster import RedisCluster as ClusterClient

from blackbox.dev.cluster import CLUSTER_SLOTS, RedisCluster
from blackbox.dev.servers import LOOPBACK
from blackbox.storage import connections
from blackbox.storage.connections import RedisClient
from tests.kafkatools import unique, wait_until

pytestmark = pytest.mark.integration

# Two writes on one slot, atomically: a script whose keys all share one {hash tag}.
APPEND = """
redis.call('SET', KEYS[1], ARGV[1])
return redis.call('RPUSH', KEYS[2], ARGV[1])
"""


@pytest.fixture
def client(redis_cluster: RedisCluster) -> Iterator[RedisClient]:
    client = connections.redis_client(redis_cluster.url)
    yield client
    client.close()


def node(port: int) -> redis.Redis:
    """A plain client of one node: it answers for that node only, never following MOVED."""
    return redis.Redis(host=LOOPBACK, port=port)


def slot_owners(port: int) -> dict[tuple[int, int], int]:
    """The cluster's slot ranges and the port of the master serving each, as a node sees it."""
    with node(port) as plain:
        return {(start, end): int(master[1]) for start, end, master, *_ in plain.cluster("SLOTS")}


def owner(port: int, key: str) -> int:
    """The port of the master serving `key`'s slot, computed by the node at `port`."""
    with node(port) as plain:
        slot = int(plain.cluster("KEYSLOT", key))
    return next(p for (start, end), p in slot_owners(port).items() if start <= slot <= end)


def one_key_per_master(port: int, prefix: str) -> dict[int, str]:
    """A key name for each master, by the master's port."""
    found: dict[int, str] = {}
    for i in range(1000):
        found.setdefault(owner(port, f"{prefix}:{i}"), f"{prefix}:{i}")
        if len(found) == 3:
            return found
    raise AssertionError(f"1000 keys hashed to only {len(found)} masters")


def connected(port: int) -> int:
    """How many clients the node at `port` has connected, this question's own included."""
    with node(port) as plain:
        return int(plain.info("clients")["connected_clients"])


def stored(port: int, pattern: str) -> set[str]:
    """The keys matching `pattern` that the node at `port` itself holds."""
    with node(port) as plain:
        return {key.decode() for key in plain.scan_iter(match=pattern)}


def test_the_fixture_cluster_has_three_masters_serving_every_slot(
    redis_cluster: RedisCluster,
) -> None:
    """Every node of the local cluster is ready (cluster_state:ok, 16384 slots, 3 known
    nodes), and the slot map divides all slots among three distinct masters."""
    ports = {n.port for n in redis_cluster.nodes}
    for server in redis_cluster.nodes:
        info = redis_cluster.cluster_info(server)
        assert (info["cluster_state"], info["cluster_known_nodes"]) == ("ok", "3")
        assert int(info["cluster_slots_assigned"]) == CLUSTER_SLOTS
    owners = slot_owners(redis_cluster.nodes[0].port)
    assert set(owners.values()) == ports
    assert sum(end - start + 1 for start, end in owners) == CLUSTER_SLOTS
    assert redis_cluster.url == f"redis+cluster://{LOOPBACK}:{redis_cluster.nodes[0].port}"


def test_cluster_url_writes_and_reads_keys_on_every_master(
    redis_cluster: RedisCluster, client: RedisClient
) -> None:
    """A redis+cluster:// URL gives redis-py's cluster client, which stores each key on the
    master serving its slot (seen on the nodes themselves) and reads it back from there."""
    assert isinstance(client, ClusterClient)
    prefix = unique("spread")
    keys = one_key_per_master(redis_cluster.nodes[0].port, prefix)
    for key in keys.values():
        client.set(key, key)
    assert [client.get(key) for key in keys.values()] == [key.encode() for key in keys.values()]
    for port, key in keys.items():
        assert stored(port, f"{prefix}:*") == {key}


def test_script_on_one_hash_tag_runs_on_its_master(
    redis_cluster: RedisCluster, client: RedisClient
) -> None:
    """A registered Lua script whose keys share one {hash tag} runs by EVALSHA on the master
    of that tag's slot (here not the node the URL names), writing both keys there."""
    first = redis_cluster.nodes[0].port
    tags = one_key_per_master(first, unique("tag"))
    port, tag = next((p, t) for p, t in tags.items() if p != first)
    keys = [f"{{{tag}}}:value", f"{{{tag}}}:list"]
    append = client.register_script(APPEND)
    assert append(keys=keys, args=["a"]) == 1
    assert append(keys=keys, args=["b"]) == 2
    assert stored(port, f"{{{tag}}}:*") == set(keys)
    with node(port) as plain:
        assert plain.script_exists(append.sha) == [True]
        assert int(plain.info("commandstats")["cmdstat_evalsha"]["calls"]) >= 2


def test_primaries_gives_one_plain_client_per_master(
    redis_cluster: RedisCluster, client: RedisClient
) -> None:
    """primaries() of a cluster client is one plain client per master, each talking to its
    own node (for per-node work such as CONFIG GET)."""
    masters = connections.primaries(client)
    assert all(type(m) is redis.Redis for m in masters)
    ports = {m.config_get("port")["port"] for m in masters}
    assert len(masters) == 3
    assert ports == {str(n.port) for n in redis_cluster.nodes}


def test_closing_the_cluster_client_closes_every_masters_connections(
    redis_cluster: RedisCluster,
) -> None:
    """close() on the client of a redis+cluster:// URL disconnects it from every master,
    the per-master clients of primaries() included (nothing is left to the garbage
    collector, which would warn of unclosed sockets)."""
    ports = [n.port for n in redis_cluster.nodes]
    before = [connected(port) for port in ports]
    client = connections.redis_client(redis_cluster.url)
    for master in connections.primaries(client):
        master.ping()
    assert all(connected(port) > n for port, n in zip(ports, before, strict=True))
    client.close()
    wait_until(lambda: [connected(port) for port in ports] == before, 5, "connections closed")
