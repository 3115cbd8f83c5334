"""A Redis Sentinel on loopback for the failover tests: one `redis-server SENTINEL.conf
--sentinel` watching one primary, which it alone may declare down (quorum 1) and replace, or
one of several that must agree (`quorum`, see below).

    sentinel = SentinelProcess(free_port(), tmp_path / "sentinel", primary_port)
    sentinel.start()                # writes its config, waits until the port listens
    sentinel.wait_for_replicas(1)   # before a failover: it must know a replica to promote
    REDIS_URL = sentinel.url()      # redis+sentinel://127.0.0.1:PORT/mymaster/0
    sentinel.master_address()       # ("127.0.0.1", port) of the primary it names to clients
    sentinel.replicas_known()       # replicas it could promote now
    sentinel.client()               # redis.Redis of the Sentinel itself (SENTINEL commands)
    sentinel.events("+switch-master")  # the lines of its log reporting that event
    sentinel.stop()                 # SIGTERM, SIGKILL if it lingers

`with SentinelProcess(...) as sentinel:` starts it and stops it at the end of the block.
`SentinelProcess(port, folder, primary_port, service="mymaster", quorum=1)`: the Sentinel
finds the primary down after `down_after_ms` (1000; set the attribute before the first start
to change it, likewise `failover_timeout_ms`, 5000) without an answer. With quorum 1 it
promotes a replica at once; with several Sentinels watching the same primary (they find each
other through it), `quorum` of them must find it down, and the one a majority elects
promotes: three with quorum 2 is the smallest set production runs.

    sentinel.wait_for_sentinels(2)  # before a failover: the other two found (every 2 s)

Its config and log are kept in `folder`; Sentinel rewrites the config with what it learns, so
`start()` after `stop()` resumes it.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from types import TracebackType
from typing import IO

import redis

from blackbox.dev.servers import LOOPBACK, wait_for_port
from tests.kafkatools import wait_until

STOP_TIMEOUT = 5.0  # seconds a SIGTERM is given before SIGKILL


class SentinelProcess:
    """One Sentinel on `port` watching the primary on `primary_port` as `service`."""

    down_after_ms = 1000  # no answer from the primary this long: it is down
    failover_timeout_ms = 5000  # a failover that stalls is tried again after this

    def __init__(
        self, port: int, folder: Path, primary_port: int, service: str = "mymaster",
        quorum: int = 1,
    ) -> None:  # fmt: skip
        self.port = port
        self.folder = folder
        self.primary_port = primary_port
        self.service = service
        self.quorum = quorum
        self.process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def config(self) -> str:
        """The sentinel.conf written on the first start."""
        service = self.service
        return "\n".join([
            f"port {self.port}",
            f"bind {LOOPBACK}",
            f'dir "{self.folder}"',
            f"sentinel monitor {service} {LOOPBACK} {self.primary_port} {self.quorum}",
            f"sentinel down-after-milliseconds {service} {self.down_after_ms}",
            f"sentinel failover-timeout {service} {self.failover_timeout_ms}",
        ]) + "\n"  # fmt: skip

    @property
    def config_path(self) -> Path:
        return self.folder / "sentinel.conf"

    def url(self, db: int = 0) -> str:
        """The REDIS_URL naming this Sentinel's service."""
        return f"redis+sentinel://{LOOPBACK}:{self.port}/{self.service}/{db}"

    def start(self) -> None:
        """Run the Sentinel (its config written on the first start) until its port listens."""
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed (apt-get install redis-server)")
        self.folder.mkdir(parents=True, exist_ok=True)
        if not self.config_path.exists():
            self.config_path.write_text(self.config())
        self._log = self.log_path.open("ab")
        command = [binary, str(self.config_path), "--sentinel"]
        self.process = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT)
        wait_for_port(self.port, self.process)

    def stop(self) -> None:
        """End the Sentinel: SIGTERM, then SIGKILL if it has not exited in time."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    @property
    def log_path(self) -> Path:
        return self.folder / "sentinel.log"

    def events(self, event: str) -> list[str]:
        """The lines of the Sentinel's log that report `event` (such as `+switch-master`)."""
        if not self.log_path.exists():
            return []
        lines = self.log_path.read_text(errors="replace").splitlines()
        return [line for line in lines if f" {event} " in line]

    def client(self) -> redis.Redis:
        """A client of the Sentinel itself, for SENTINEL commands."""
        return redis.Redis(LOOPBACK, self.port, socket_timeout=2)

    def master_address(self) -> tuple[str, int]:
        """(host, port) of the primary the Sentinel names now, as redis-py's Sentinel client
        reads it (`SENTINEL MASTER`: the old address until the failover ends, where
        GET-MASTER-ADDR-BY-NAME already names the promoted replica)."""
        with self.client() as client:
            state = client.sentinel_master(self.service)
        return str(state["ip"]), int(state["port"])

    def replicas_known(self) -> int:
        """How many replicas the Sentinel knows up and linked to the primary: the ones it
        could promote."""
        with self.client() as client:
            replicas = client.sentinel_slaves(self.service)
        return sum(1 for r in replicas if not r["is_sdown"] and r["master-link-status"] == "ok")

    def wait_for_replicas(self, count: int, timeout: float = 15.0) -> None:
        """Wait until the Sentinel knows `count` replicas it could promote (it asks the
        primary for them at once, then every 10 s)."""
        what = f"Sentinel to know {count} replica(s)"
        wait_until(lambda: self.replicas_known() >= count, timeout, what)

    def sentinels_known(self) -> int:
        """How many other Sentinels watching the same service this one knows."""
        with self.client() as client:
            return len(client.sentinel_sentinels(self.service))

    def wait_for_sentinels(self, count: int, timeout: float = 15.0) -> None:
        """Wait until the Sentinel knows `count` others (each announces itself through the
        primary every 2 s): the votes a failover with a quorum above 1 needs."""
        what = f"Sentinel to know {count} other Sentinel(s)"
        wait_until(lambda: self.sentinels_known() >= count, timeout, what)

    def __enter__(self) -> SentinelProcess:
        self.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
