"""A local Redis Cluster for the tests and benchmarks: cluster-mode `RedisServer`s joined
by `redis-cli --cluster create`, with or without replicas."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import redis
import structlog

from blackbox.dev.servers import LOOPBACK, RedisServer, free_port, log_tail
from blackbox.errors import StackError

log = structlog.get_logger("blackbox.dev.cluster")

CLUSTER_SLOTS = 16384  # every hash slot of a Redis Cluster
# Clusters formed on fresh free ports, in a fresh folder, before `formed_cluster` gives up: a
# cluster whose nodes never agreed they were ready was seen once in a test session.
FORM_TRIES = 2


def redis_cli() -> str:
    """The redis-cli binary, which forms a Redis Cluster; StackError if it is missing."""
    binary = shutil.which("redis-cli")
    if binary is None:
        raise StackError("redis-cli is not installed (apt-get install redis-tools)")
    return binary


class RedisCluster:
    """A Redis Cluster: one cluster-mode `RedisServer` per port (each with its own data folder
    under `data_dir`, append-only where `appendfsync` says so), joined by `redis-cli
    --cluster create` on the first start with `replicas` replicas per master (redis-cli
    chooses which node is which: ask the nodes). Ready when every node reports
    `cluster_state:ok` with all 16384 slots served by masters and knows every other node
    (and, with replicas, which nodes are replicas), and every replica has synced with its
    master (its first AOF written, where append-only).

    Each node's cluster bus listens on a free port of its own (`cluster-port`), not the
    default port + 10000, which may be taken or above 65535. The slot map is kept in each
    node's `nodes.conf`: `start()` after `stop()` brings back the same cluster (empty unless
    `appendfsync` makes every node append-only).
    """

    start_timeout = 30.0  # seconds until the cluster must be formed and ready
    node_timeout_ms = 3000  # short, yet long enough that a busy node on 2 cores is not failed

    def __init__(
        self,
        ports: Sequence[int],
        data_dir: Path,
        replicas: int = 0,
        appendfsync: str | None = None,
    ) -> None:
        if replicas < 0 or len(ports) % (replicas + 1) != 0:
            raise StackError(f"{len(ports)} nodes cannot be masters with {replicas} replicas each")
        self.replicas = replicas
        self.masters = len(ports) // (replicas + 1)
        self.appendfsync = appendfsync
        self.nodes = [self._node(port, data_dir / f"node-{port}") for port in ports]

    def _node(self, port: int, node_dir: Path) -> RedisServer:
        config = {
            "cluster-enabled": "yes",
            "cluster-config-file": str(node_dir / "nodes.conf"),
            "cluster-node-timeout": str(self.node_timeout_ms),
            "cluster-port": str(free_port()),
        }
        if self.replicas:
            # A replica's first sync starts at once, not after the default 5 s wait for others.
            config["repl-diskless-sync-delay"] = "0"
        return RedisServer(port, node_dir, self.appendfsync, config)

    @property
    def url(self) -> str:
        """The `redis+cluster://` URL blackbox reads as REDIS_URL: the first node's address."""
        return f"redis+cluster://{LOOPBACK}:{self.nodes[0].port}"

    def start(self) -> None:
        """Start every node, form the cluster if it was never formed, wait until it serves;
        on failure no node is left running."""
        try:
            for node in self.nodes:
                node.data_dir.mkdir(parents=True, exist_ok=True)
                node.start()
            if not self._formed():
                self._create()
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def __enter__(self) -> RedisCluster:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def cluster_info(self, node: RedisServer) -> dict[str, str]:
        """The node's CLUSTER INFO fields."""
        with _client(node) as client:
            return dict(client.cluster("INFO"))

    def info(self, node: RedisServer, section: str) -> dict[str, Any]:
        """One section of the node's INFO."""
        with _client(node) as client:
            found: dict[str, Any] = client.info(section)
            return found

    def _formed(self) -> bool:
        return int(self.cluster_info(self.nodes[0])["cluster_slots_assigned"]) > 0

    def _create(self) -> None:
        addresses = [f"{LOOPBACK}:{node.port}" for node in self.nodes]
        create = [redis_cli(), "--cluster", "create", *addresses,
                  "--cluster-replicas", str(self.replicas), "--cluster-yes"]  # fmt: skip
        try:
            done = subprocess.run(create, capture_output=True, text=True, check=False,
                                  timeout=self.start_timeout)  # fmt: skip
        except subprocess.TimeoutExpired as e:
            raise StackError(f"redis-cli --cluster create took over {e.timeout} s") from e
        if done.returncode != 0:
            raise StackError(f"redis-cli --cluster create failed: {done.stdout}{done.stderr}")

    def _ready(self, node: RedisServer) -> bool:
        info = self.cluster_info(node)
        return (info["cluster_state"] == "ok"
                and int(info["cluster_slots_ok"]) == CLUSTER_SLOTS
                and int(info["cluster_size"]) == self.masters
                and int(info["cluster_known_nodes"]) == len(self.nodes)
                and (not self.replicas or self._synced(node)))  # fmt: skip

    def _synced(self, node: RedisServer) -> bool:
        """The node knows every replica as one, and it is a master, or a replica whose link
        to its master is up and whose first AOF (which a full sync starts, and during which
        it refuses SIGTERM) is written."""
        if self._replicas_known(node) != len(self.nodes) - self.masters:
            return False
        replication = self.info(node, "replication")
        if replication["role"] == "master":
            return True
        if replication.get("master_link_status") != "up":
            return False
        aof = self.info(node, "persistence")
        return int(aof["aof_rewrite_in_progress"]) + int(aof["aof_rewrite_scheduled"]) == 0

    def _replicas_known(self, node: RedisServer) -> int:
        """How many nodes `node` knows as replicas (CLUSTER NODES flags)."""
        return sum(b"slave" in flags for _, flags in self._known(node))

    def _known(self, node: RedisServer) -> list[tuple[str, set[bytes]]]:
        """Every node `node` knows (itself too): its address and its CLUSTER NODES flags."""
        with _client(node) as client:
            nodes: bytes = client.execute_command("CLUSTER", "NODES")
        return [(fields[1].decode(), set(fields[2].split(b",")))
                for fields in (line.split() for line in nodes.splitlines())]  # fmt: skip

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            try:
                if all(self._ready(node) for node in self.nodes):
                    return
            except redis.RedisError:  # a node too busy to answer in time: not ready yet
                pass
            time.sleep(0.05)
        raise StackError(f"the Redis Cluster on {self.url} was not ready within "
                         f"{self.start_timeout} s: {self.describe()}")  # fmt: skip

    def describe(self) -> str:
        """Each node as it sees the cluster (its state, slots, masters, known nodes and the
        nodes it flags as failing), then the end of its log: why a cluster is not ready."""
        return "".join(f"\nnode {node.port}: {self._view(node)}"
                       f"{log_tail(node.log_path, lines=8)}" for node in self.nodes)  # fmt: skip

    def _view(self, node: RedisServer) -> str:
        try:
            info = self.cluster_info(node)
            failing = [address for address, flags in self._known(node)
                       if flags & {b"fail", b"fail?"}]  # fmt: skip
        except redis.RedisError as e:
            return f"unanswered ({e})"
        fields = ("cluster_state", "cluster_slots_ok", "cluster_size", "cluster_known_nodes")
        return " ".join(f"{name}={info.get(name)}" for name in fields) + f" failing={failing}"


def _client(node: RedisServer) -> redis.Redis:
    """A plain client of one node, answering for that node only."""
    return redis.Redis(host=LOOPBACK, port=node.port, socket_timeout=2)


@contextmanager
def formed_cluster(
    size: int, data_dir: Path, replicas: int = 0, appendfsync: str | None = None
) -> Iterator[RedisCluster]:
    """A `RedisCluster` of `size` nodes on free ports, started, and stopped on leaving. One
    that does not become ready is stopped and formed again on other free ports, in a
    folder of its own, up to FORM_TRIES times; the last failure is raised."""
    for attempt in range(1, FORM_TRIES + 1):
        folder = data_dir if attempt == 1 else data_dir / f"attempt-{attempt}"
        cluster = RedisCluster([free_port() for _ in range(size)], folder, replicas, appendfsync)
        try:
            cluster.start()
        except StackError as e:
            if attempt == FORM_TRIES:
                raise
            log.warning("redis_cluster_formed_again", attempt=attempt, error=str(e))
            continue
        break
    try:
        yield cluster
    finally:
        cluster.stop()
