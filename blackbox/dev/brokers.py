"""A local Apache Kafka cluster of three brokers, for the benchmarks that measure a broker
failing: node 1 is a broker and the KRaft controller, nodes 2 and 3 brokers only, every
internal topic kept on all three with 2 in sync (what production runs: docs/production.md).
A broker-only node can be killed and started again while the cluster goes on."""

from __future__ import annotations

from pathlib import Path
from types import TracebackType

from blackbox.dev.servers import LOOPBACK, KafkaBroker, cluster_id, free_port

# The internal topics, replicated as production replicates them.
_REPLICATED = {
    "offsets.topic.replication.factor": "3",
    "transaction.state.log.replication.factor": "3",
    "transaction.state.log.min.isr": "2",
    "share.coordinator.state.topic.replication.factor": "3",
    "share.coordinator.state.topic.min.isr": "2",
    "default.replication.factor": "3",
}


class ClusterNode(KafkaBroker):
    """One node of a `KafkaCluster`: node 1 also the controller, the others brokers only."""

    def __init__(  # noqa: PLR0913 - where it sits in the cluster
        self, node_id: int, port: int, data_dir: Path, *, controller_port: int, cluster: str,
        heap: str,
    ) -> None:  # fmt: skip
        super().__init__(port, data_dir, controller_port, heap, config=_REPLICATED)
        self.node_id = node_id
        self.cluster = cluster

    def properties(self) -> str:
        """The single broker's properties, as node `node_id` of the cluster."""
        lines = dict(line.split("=", 1) for line in super().properties().splitlines())
        lines["node.id"] = str(self.node_id)
        if self.node_id != 1:  # a broker only: it listens for clients, asks node 1
            lines["process.roles"] = "broker"
            lines["listeners"] = f"PLAINTEXT://{LOOPBACK}:{self.port}"
        return "".join(f"{name}={value}\n" for name, value in lines.items())

    def format_options(self) -> list[str]:
        """Node 1 formats the cluster's controller; the others join it."""
        mode = "--standalone" if self.node_id == 1 else "--no-initial-controllers"
        return [mode, "-t", self.cluster]


class KafkaCluster:
    """Three brokers on loopback; `bootstrap` names them all."""

    def __init__(self, data_dir: Path, size: int = 3, heap: str = "384m") -> None:
        controller, cluster = free_port(), cluster_id()
        self.nodes = [ClusterNode(n, free_port(), data_dir / f"node-{n}",
                                  controller_port=controller, cluster=cluster, heap=heap)
                      for n in range(1, size + 1)]  # fmt: skip

    @property
    def bootstrap(self) -> str:
        return ",".join(node.bootstrap for node in self.nodes)

    def node(self, node_id: int) -> ClusterNode:
        return self.nodes[node_id - 1]

    def start(self) -> None:
        for node in self.nodes:  # node 1 first: the others join its controller
            node.start()

    def stop(self) -> None:
        for node in reversed(self.nodes):
            node.stop()

    def __enter__(self) -> KafkaCluster:
        self.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:  # fmt: skip
        self.stop()
