"""A Redis primary and its replica as a managed Redis runs them, with the network between
them in the test's hands (tests/relay.py).

Both servers are append-only with `appendfsync always`. The replica follows the primary
through the `link` relay, so a test can partition them for real (hold the link, then cut
it: what the primary applied meanwhile never reaches the replica). Clients use the
`endpoint` relay, which forwards to the primary and, after `fail_over()`, to the promoted
replica, as the primary endpoint of ElastiCache, Memorystore or Azure Cache moves.
`WatchedRedis` is the same pair watched by Redis Sentinels instead (one, or three with
quorum 2), which promote the replica themselves; clients ask the Sentinels.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import redis

from blackbox.dev.servers import LOOPBACK, RedisServer, free_port
from tests.kafkatools import wait_until
from tests.relay import Relay
from tests.sentinel import SentinelProcess

# The replica's own address for its replication connection (`bind-source-addr`): loopback
# too on Linux (127.0.0.0/8), and no other process connects from it.
REPLICA_SOURCE = "127.0.0.2"


class ReplicatedRedis:
    """A primary, a replica following it through `link`, and `endpoint` in front of
    whichever is primary; `start()` returns once the replica is in sync."""

    def __init__(self, work: Path) -> None:
        # A replica's first full sync starts at once, not after the default 5 s wait for others.
        at_once = {"repl-diskless-sync-delay": "0"}
        self.primary = RedisServer(
            free_port(), _folder(work / "primary"), appendfsync="always", config=at_once
        )
        self.link = self._link_to(self.primary.port)
        follow = {"replicaof": f"{LOOPBACK} {self.link.port}", **self._replica_config()}
        self.replica = RedisServer(
            free_port(), _folder(work / "replica"), appendfsync="always", config=follow
        )
        self.endpoint = Relay(0, self.primary.port)

    @property
    def url(self) -> str:
        """The endpoint's URL: what REDIS_URL names."""
        return f"redis://{LOOPBACK}:{self.endpoint.port}/0"

    def start(self, timeout: float = 30.0) -> None:
        self.primary.start()
        self.replica.start()
        self.wait_in_sync(timeout)
        # Until the AOF a full sync starts is written, the replica refuses SIGTERM for good
        # ("Writing initial AOF, can't exit"): stop() would wait for its kill.
        wait_until(self._replica_aof_written, timeout, "the replica's AOF written")

    def stop(self) -> None:
        self.endpoint.close()
        self.link.close()
        self.replica.stop()
        self.primary.stop()

    def client(self, server: RedisServer) -> redis.Redis:
        """A client of `server` itself, not through the endpoint."""
        return redis.Redis(host=LOOPBACK, port=server.port, socket_timeout=5)

    def wait_in_sync(self, timeout: float = 30.0) -> None:
        """Wait until the replica has applied everything the primary has."""
        wait_until(self.in_sync, timeout, "the replica in sync with the primary")

    def in_sync(self) -> bool:
        primary, replica = self._replication(self.primary), self._replication(self.replica)
        return (
            replica.get("master_link_status") == "up"
            and int(replica["slave_repl_offset"]) >= int(primary["master_repl_offset"])
        )  # fmt: skip

    def partition(self) -> None:
        """Hold the replication link: from now on the replica receives nothing."""
        self.link.hold()

    def fail_over(self) -> None:
        """The primary dies (SIGKILL) while partitioned, the link is cut (what it held is
        lost), the replica is promoted and the endpoint moves to it."""
        self.primary.kill()
        self.link.cut()
        with self.client(self.replica) as promoted:
            promoted.execute_command("REPLICAOF", "NO", "ONE")
            wait_until(lambda: _role(promoted) == "master", what="the replica promoted")
        self.endpoint.switch(self.replica.port)

    def _link_to(self, primary_port: int) -> Relay:
        return Relay(0, primary_port)

    def _replica_config(self) -> dict[str, str]:
        return {}

    def _replica_aof_written(self) -> bool:
        info = self._info(self.replica, "persistence")
        return int(info["aof_rewrite_in_progress"]) == int(info["aof_rewrite_scheduled"]) == 0

    def _replication(self, server: RedisServer) -> dict[str, Any]:
        return self._info(server, "replication")

    def _info(self, server: RedisServer, section: str) -> dict[str, Any]:
        with self.client(server) as client:
            info: dict[str, Any] = client.info(section)
            return info

    def __enter__(self) -> ReplicatedRedis:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


class WatchedRedis(ReplicatedRedis):
    """The same pair, watched by Sentinels (tests/sentinel.py) that clients ask for the
    primary (`url`) and that promote the replica themselves when the primary dies: one
    (quorum 1) by default, or `sentinels` of them with a majority's quorum (three: 2), so
    the failover waits for them to agree and elect the one that promotes.

    The Sentinels watch the primary at the `link` relay's address, the master address the
    replica reports: watching the primary's own port, they see the replica follow another
    master and re-point it straight at the primary (`+fix-slave-config` in their log, about
    10 s after finding the replica), which bypasses the link and makes the lag unreal. The
    replica connects from its own address and `link` holds only that connection, so the
    Sentinels' pings (and their announcements to each other) through the same relay are
    answered during a partition, and they find the primary down only once it is killed."""

    def __init__(self, work: Path, sentinels: int = 1) -> None:
        super().__init__(work)
        quorum = sentinels // 2 + 1
        self.sentinels = [
            SentinelProcess(free_port(), work / f"sentinel-{n}", self.link.port, quorum=quorum)
            for n in range(1, sentinels + 1)
        ]

    @property
    def sentinel(self) -> SentinelProcess:
        """The first Sentinel: the one clients ask first."""
        return self.sentinels[0]

    @property
    def url(self) -> str:
        """The Sentinels' URL (`redis+sentinel://h1:p1,h2:p2/mymaster/0`): what REDIS_URL
        names."""
        hosts = ",".join(f"{LOOPBACK}:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{self.sentinel.service}/0"

    def start(self, timeout: float = 30.0) -> None:
        super().start(timeout)
        for sentinel in self.sentinels:
            sentinel.start()
        for sentinel in self.sentinels:
            sentinel.wait_for_replicas(1, timeout)
            sentinel.wait_for_sentinels(len(self.sentinels) - 1, timeout)

    def stop(self) -> None:
        for sentinel in self.sentinels:
            sentinel.stop()
        super().stop()

    def fail_over(self) -> None:
        """The primary dies (SIGKILL) while partitioned and the link is cut (what it held is
        lost); the Sentinels, not the test, promote the replica: see `promoted()`."""
        self.primary.kill()
        self.link.cut()

    def promoted(self) -> bool:
        """Whether a Sentinel names the replica as the primary to clients now (redis-py's
        client passes over one that still finds the old primary down and asks the next)."""
        replica = (LOOPBACK, self.replica.port)
        return any(s.master_address() == replica for s in self.sentinels)

    def events(self, event: str) -> list[str]:
        """The lines of every Sentinel's log that report `event`."""
        return [line for s in self.sentinels for line in s.events(event)]

    def _link_to(self, primary_port: int) -> Relay:
        return Relay(0, primary_port, held_source=REPLICA_SOURCE)

    def _replica_config(self) -> dict[str, str]:
        return {"bind-source-addr": REPLICA_SOURCE}


def _folder(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def _role(client: redis.Redis) -> str:
    info: dict[str, Any] = client.info("replication")
    return str(info["role"])
