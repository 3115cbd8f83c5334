"""A Redis Cluster master whose replica follows it through a relay, so that a test can make
the replica lag for real before the master dies (tests/relay.py says why a relay).

In a cluster, a replica connects to its master at the address the master announces on the
cluster bus (`cluster-announce-ip`, `cluster-announce-port`), and clients are sent to the
address that `CLUSTER SLOTS` and `MOVED` name. Both default to the same address, and the
port stays shared: a relay on the announced port would stand in front of the clients too.
So every node announces a hostname (`127.0.0.1`) and answers clients with it
(`cluster-preferred-endpoint-type hostname`), while the master alone announces the ip
127.0.0.2: clients still reach it directly on 127.0.0.1, and only its replica (and the
cluster bus, through a relay that never holds) goes through 127.0.0.2, where the `link`
relay listens on the master's own port.
"""

from __future__ import annotations

from typing import Any

import redis
from redis.crc import key_slot

from blackbox.dev.cluster import CLUSTER_SLOTS, RedisCluster
from blackbox.dev.servers import LOOPBACK, RedisServer
from blackbox.storage.keys import Layout
from tests.kafkatools import wait_until
from tests.relay import Relay

RELAYED_IP = "127.0.0.2"  # loopback too on Linux (127.0.0.0/8); no node binds it
SETTLE_TIMEOUT = 20.0  # seconds for gossip to carry a new address or a failover


def client(server: RedisServer) -> redis.Redis:
    """A plain client of one node, answering for that node only."""
    return redis.Redis(host=LOOPBACK, port=server.port, socket_timeout=2, decode_responses=True)


def slot_owners(server: RedisServer) -> list[tuple[int, int, str, int]]:
    """(first slot, last slot, host, port) of each slot range and its master, as clients
    are told by `server` (CLUSTER SLOTS)."""
    with client(server) as plain:
        ranges = plain.execute_command("CLUSTER", "SLOTS")
    return [(int(r[0]), int(r[1]), str(r[2][0]), int(r[2][1])) for r in ranges]


def shards_by_master(server: RedisServer, layout: Layout) -> dict[int, list[int]]:
    """The shards of `layout` each master serves, by the master's port, as `server` sees it."""
    owners = slot_owners(server)
    found: dict[int, list[int]] = {port: [] for *_, port in owners}
    for shard, keys in enumerate(layout.shards):
        slot = key_slot(keys.due.encode())
        found[next(port for low, high, _, port in owners if low <= slot <= high)].append(shard)
    return found


def replication(server: RedisServer) -> dict[str, Any]:
    """The node's INFO replication fields."""
    with client(server) as plain:
        info: dict[str, Any] = plain.info("replication")
        return info


def replica_of(cluster: RedisCluster, master: RedisServer) -> RedisServer:
    """The node replicating `master`."""
    with client(master) as plain:
        master_id = plain.execute_command("CLUSTER", "MYID")
        replicas = plain.execute_command("CLUSTER", "REPLICAS", master_id)
    (line,) = replicas
    port = int(line.split()[1].split("@")[0].rsplit(":", 1)[1])
    return next(node for node in cluster.nodes if node.port == port)


def hostname_endpoints(cluster: RedisCluster) -> None:
    """Every node names every node to clients by its announced hostname, 127.0.0.1, which no
    `cluster-announce-ip` changes."""
    for node in cluster.nodes:
        with client(node) as plain:
            plain.config_set("cluster-announce-hostname", LOOPBACK)
            plain.config_set("cluster-preferred-endpoint-type", "hostname")
    wait_until(lambda: _clients_told_loopback(cluster.nodes), SETTLE_TIMEOUT,
               "every node naming every master 127.0.0.1")  # fmt: skip


def _clients_told_loopback(nodes: list[RedisServer]) -> bool:
    return all(host == LOOPBACK for node in nodes for *_, host, _ in slot_owners(node))


class RelayedMaster:
    """`master` of `cluster`, its replica following it through `link` (a relay the test
    holds and cuts) and the cluster bus reaching it through `bus` (never held); clients
    still talk to it directly. `start()` returns once the replica follows through `link`,
    in sync."""

    def __init__(self, cluster: RedisCluster, master: RedisServer) -> None:
        self.cluster = cluster
        self.master = master
        self.replica = replica_of(cluster, master)
        with client(master) as plain:
            bus_port = int(plain.config_get("cluster-port")["cluster-port"])
        self.bus = Relay(0, bus_port, RELAYED_IP)
        self.link = Relay(master.port, master.port, RELAYED_IP)

    def start(self) -> None:
        hostname_endpoints(self.cluster)
        with client(self.master) as plain:
            plain.config_set("cluster-announce-bus-port", str(self.bus.port))
            plain.config_set("cluster-announce-ip", RELAYED_IP)
        wait_until(self._followed_through_link, SETTLE_TIMEOUT, "the replica behind the link")
        wait_until(self._announced, SETTLE_TIMEOUT, "every node seeing the new address")
        wait_until(lambda: _clients_told_loopback(self.cluster.nodes), SETTLE_TIMEOUT,
                   "clients still told 127.0.0.1")  # fmt: skip

    def close(self) -> None:
        self.link.close()
        self.bus.close()

    def partition(self) -> None:
        """Hold the replication link: from now on the replica receives nothing."""
        self.link.hold()

    def lag(self) -> int:
        """How many bytes of the replication stream the replica has not applied."""
        ahead = int(replication(self.master)["master_repl_offset"])
        return ahead - int(replication(self.replica)["slave_repl_offset"])

    def fail_over(self) -> None:
        """The master dies (SIGKILL) while partitioned, the link is cut (what it held is
        lost); returns once the cluster promoted the replica and serves every slot again."""
        self.master.kill()
        self.link.cut()
        wait_until(self._promoted, SETTLE_TIMEOUT, "the replica promoted, the cluster ok")

    def survivors(self) -> list[RedisServer]:
        return [node for node in self.cluster.nodes if node is not self.master]

    def _followed_through_link(self) -> bool:
        info = replication(self.replica)
        return (
            info.get("master_host") == RELAYED_IP
            and info.get("master_link_status") == "up"
            and self.link.connections == 1
            and self.lag() <= 0
        )  # fmt: skip

    def _announced(self) -> bool:
        address = f"{RELAYED_IP}:{self.master.port}@{self.bus.port}"
        for node in self.cluster.nodes:
            with client(node) as plain:
                nodes = plain.execute_command("CLUSTER", "NODES")
            if address not in nodes:
                return False
        return True

    def _promoted(self) -> bool:
        if replication(self.replica)["role"] != "master":
            return False
        for node in self.survivors():
            info = self.cluster.cluster_info(node)
            if info["cluster_state"] != "ok" or int(info["cluster_slots_ok"]) != CLUSTER_SLOTS:
                return False
            if any(port == self.master.port for *_, port in slot_owners(node)):
                return False
        return True

    def __enter__(self) -> RelayedMaster:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
