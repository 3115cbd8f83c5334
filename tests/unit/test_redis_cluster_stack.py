"""How the local Redis Cluster's nodes are started (no server is started)."""

from __future__ import annotations

from pathlib import Path

import pytest

from blackbox.dev import servers
from blackbox.dev.servers import RedisCluster
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
        servers.redis_cli()
