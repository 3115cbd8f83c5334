"""A local Redis Cluster formed on free ports (`formed_cluster`): one that never becomes
ready is formed again elsewhere, and its error says what each node sees."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from blackbox.dev.cluster import FORM_TRIES, RedisCluster, formed_cluster
from blackbox.errors import StackError
from tests.kafkatools import wait_until


def stopped(cluster: RedisCluster) -> bool:
    return all(node.process is not None and node.process.poll() is not None
               for node in cluster.nodes)  # fmt: skip


def test_a_cluster_not_ready_is_formed_again_in_a_folder_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first cluster is taken as never ready: it is stopped, and a second, formed on
    other free ports under attempt-2, serves; leaving stops it."""
    formed: list[RedisCluster] = []
    wait_ready = RedisCluster._wait_ready

    def first_never_ready(cluster: RedisCluster) -> None:
        formed.append(cluster)
        if len(formed) == 1:
            raise StackError("taken as never ready")
        wait_ready(cluster)

    monkeypatch.setattr(RedisCluster, "_wait_ready", first_never_ready)
    with formed_cluster(3, tmp_path) as cluster:
        assert formed == [formed[0], cluster]
        assert stopped(formed[0])
        assert {node.data_dir.parent for node in cluster.nodes} == {tmp_path / "attempt-2"}
        client = redis.RedisCluster.from_url(cluster.url.replace("redis+cluster", "redis"))
        client.set("formed", b"again")
        assert client.get("formed") == b"again"
        client.close()
    assert stopped(cluster)


def test_a_cluster_never_ready_raises_the_last_failure_with_every_node_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    formed: list[RedisCluster] = []

    def never_ready(cluster: RedisCluster) -> None:
        formed.append(cluster)
        raise StackError(f"never ready, try {len(formed)}")

    monkeypatch.setattr(RedisCluster, "_wait_ready", never_ready)
    with pytest.raises(StackError, match=f"never ready, try {FORM_TRIES}"), \
            formed_cluster(3, tmp_path):  # fmt: skip
        pytest.fail("no cluster was ready")
    assert len(formed) == FORM_TRIES
    assert all(stopped(cluster) for cluster in formed)


def test_describe_names_what_each_node_sees_and_the_node_that_does_not_answer(
    tmp_path: Path,
) -> None:
    """Ready, every node says so; with one node killed, the others flag it as failing and
    it is unanswered, each followed by the end of its log."""
    with formed_cluster(3, tmp_path) as cluster:
        ready = cluster.describe()
        for node in cluster.nodes:
            assert (f"node {node.port}: cluster_state=ok cluster_slots_ok=16384 "
                    f"cluster_size=3 cluster_known_nodes=3 failing=[]") in ready  # fmt: skip
            assert f"the end of {node.log_path}" in ready
        dead = cluster.nodes[2]
        dead.kill()
        flagged = f"failing=['127.0.0.1:{dead.port}@"
        wait_until(lambda: cluster.describe().count(flagged) == 2, timeout=30,
                   what="the live nodes flag the killed one")  # fmt: skip
        assert f"node {dead.port}: unanswered (" in cluster.describe()
