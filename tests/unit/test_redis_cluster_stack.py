"""How the local Redis Cluster's nodes are started (no server is started)."""

from __future__ import annotations

from pathlib import Path

import pytest

from blackbox.dev import cluster as servers_cluster
from blackbox.dev.cluster import RedisCluster
from blackbox.errors import StackError


def option(command: list[str], name: str) -> str:
    return command[command.index(f"--{name}") + 1]


def test_each_node_is_a_loopback_cluster_node_of_its_own(tmp_path: Path) -> None:
    """Every node runs in cluster mode on loopback without persistence, with its own data
    folder, cluster config file and cluster bus port; the URL names the first node."""
    cluster = RedisCluster([7001, 7002, 7003], tmp_path)
    commands = [node.command() for node in cluster.nodes]
    for command in commands:
        assert option(command, "cluster-enabled") == "yes"
        assert (option(command, "bind"), option(command, "save")) == ("127.0.0.1", "")
        assert option(command, "appendonly") == "no"
        assert Path(option(command, "cluster-config-file")).parent == Path(option(command, "dir"))
    for name in ("port", "dir", "cluster-port"):
        assert len({option(command, name) for command in commands}) == 3
    assert cluster.url == "redis+cluster://127.0.0.1:7001"


def test_missing_redis_cli_is_a_stack_error_naming_the_package(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Without redis-cli the cluster cannot be formed: the error says what to install."""
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(StackError, match="redis-tools"):
        servers_cluster.redis_cli()


def test_replicas_make_append_only_nodes_that_sync_at_once(tmp_path: Path) -> None:
    """With one replica per master, six nodes make three masters; every node (replicas as
    masters) is append-only with the fsync asked for, and starts a replica's first sync
    without the default 5 s wait; without replicas the nodes' command is as before."""
    cluster = RedisCluster(range(7001, 7007), tmp_path, replicas=1, appendfsync="always")
    for command in (node.command() for node in cluster.nodes):
        assert (option(command, "appendonly"), option(command, "appendfsync")) == ("yes", "always")
        assert option(command, "repl-diskless-sync-delay") == "0"
    assert (cluster.masters, cluster.replicas) == (3, 1)
    plain = RedisCluster([7001, 7002, 7003], tmp_path)
    assert all("--repl-diskless-sync-delay" not in node.command() for node in plain.nodes)


def test_nodes_that_cannot_pair_with_their_replicas_are_a_stack_error(tmp_path: Path) -> None:
    """Five nodes cannot be masters with one replica each: refused before anything starts."""
    with pytest.raises(StackError, match="5 nodes cannot be masters with 1 replicas each"):
        RedisCluster(range(7001, 7006), tmp_path, replicas=1)
