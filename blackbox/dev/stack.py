"""The stack `blackbox dev` (and so `make run`) runs: Redis and a Kafka broker on loopback.

Apache Kafka by default, its data and Redis's (append-only) kept together in one state
folder, so stopping and starting again keeps topics, committed offsets and pending
schedules alike. Never one without the other: a Redis watermark ahead of a new topic's
offsets would take new records for re-reads. `fresh` starts both empty. The light Tansu
broker keeps nothing on disk, so with it Redis keeps nothing either.

An address given in the environment (REDIS_URL, KAFKA_BOOTSTRAP_SERVERS) is used as it is
and nothing is started for it. The servers run in sessions of their own: Ctrl-C stops the
service first, then Redis and the broker, so the service never sees them go. The service's
API, open to every call without a token here, is served on loopback only unless
BLACKBOX_HTTP_HOST says otherwise.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import structlog
from confluent_kafka import KafkaException, Producer

from blackbox.dev.servers import (
    LOOPBACK,
    KafkaBroker,
    RedisServer,
    TansuBroker,
    port_open,
    scratch_dir,
)
from blackbox.errors import StackError

log = structlog.get_logger("blackbox.dev.stack")

# The transactional id the stack's warm-up producer registers (one record in Kafka's
# transaction state, nothing in any topic).
WARM_UP_ID = "blackbox-dev-warm-up"
WARM_UP_SECONDS = 60.0

BROKERS = ("kafka", "tansu")
# Partitions of the topics the local stack creates: more than one, so that a producer whose
# partitioner is not murmur2 (librdkafka's default) shows up locally, as in production.
DEV_PARTITIONS = 3
Server = RedisServer | KafkaBroker | TansuBroker
SERVER_NAMES = {RedisServer: "redis", KafkaBroker: "kafka", TansuBroker: "tansu"}


def state_root(environ: Mapping[str, str] = os.environ) -> Path:
    """$XDG_STATE_HOME/blackbox/dev, else ~/.local/state/blackbox/dev."""
    base = environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "blackbox" / "dev"


@dataclass(frozen=True)
class DevOptions:
    broker: str = "kafka"
    redis_port: int = 6379
    kafka_port: int = 9092
    state_dir: Path | None = None
    fresh: bool = False


class DevStack:
    """The servers to start for `blackbox dev`, and the environment that points at them."""

    def __init__(self, options: DevOptions, environ: Mapping[str, str] = os.environ) -> None:
        self.options = options
        self.environ = environ
        self.state = self._state_folder()
        self.servers: list[Server] = []
        if "REDIS_URL" not in environ:
            self.servers.append(self._redis())
        if "KAFKA_BOOTSTRAP_SERVERS" not in environ:
            self.servers.append(self._broker())
        # Ctrl-C reaches the service alone: it stops first, then stop() stops these.
        for server in self.servers:
            server.own_session = True

    def _state_folder(self) -> Path:
        if self.options.broker == "tansu":  # a broker that keeps nothing: nor does Redis
            return scratch_dir("blackbox-dev-")
        state = self.options.state_dir or state_root(self.environ)
        if self.options.fresh and state.exists():
            shutil.rmtree(state)
        return state

    def _redis(self) -> RedisServer:
        folder = self.state / "redis"
        folder.mkdir(parents=True, exist_ok=True)
        keeps = None if self.options.broker == "tansu" else "everysec"
        return RedisServer(self.options.redis_port, folder, appendfsync=keeps)

    def _broker(self) -> KafkaBroker | TansuBroker:
        port = self.options.kafka_port
        if self.options.broker == "tansu":
            return TansuBroker(port, self.state / "tansu.log")
        return KafkaBroker(port, self.state / "kafka", controller_port=port + 1, heap="1g")

    def environment(self) -> dict[str, str]:
        """The environment the service runs with: the operator's, pointed at this stack, with
        every API call open without a token, to this machine alone, unless it says otherwise."""
        local = {"REDIS_URL": f"redis://{LOOPBACK}:{self.options.redis_port}/0",
                 "KAFKA_BOOTSTRAP_SERVERS": f"{LOOPBACK}:{self.options.kafka_port}",
                 "BLACKBOX_HTTP_HOST": LOOPBACK, "BLACKBOX_API_DEV_OPEN": "true"}  # fmt: skip
        return {**local, **self.environ}

    def start(self) -> None:
        """Start every server, or none: a port in use stops it all with one clear error."""
        for server in self.servers:
            _refuse_taken_ports(server)
        try:
            for server in self.servers:
                _start(server)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        for server in reversed(self.servers):
            server.stop()


def _start(server: Server) -> None:
    """Start one server and say so, before and after: Kafka's first start fetches its jars
    and takes a while."""
    name = SERVER_NAMES.get(type(server), type(server).__name__)
    log.info("local_server_starting", server=name, port=server.port)
    started = time.monotonic()
    server.start()
    if isinstance(server, KafkaBroker):
        hand_out_producer_ids(server.bootstrap)
    log.info("local_server_started", server=name, port=server.port,
             seconds=round(time.monotonic() - started, 1))  # fmt: skip


def hand_out_producer_ids(bootstrap: str, timeout: float = WARM_UP_SECONDS) -> None:
    """Return once the broker hands out producer ids. A broker just started loads its
    transaction state first, and until it has, every idempotent producer (the service
    starts several) logs "Failed to acquire idempotence PID ... Coordinator load in
    progress": a warning on the quick start's first screen that means nothing is wrong.
    A transactional producer's init waits for the load, quietly (librdkafka's own log
    kept to errors)."""
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": WARM_UP_ID,
                         "log_level": 3})  # fmt: skip
    try:
        producer.init_transactions(timeout)
    except KafkaException as e:
        raise StackError(f"the broker at {bootstrap} handed out no producer id: {e}") from e
    finally:
        producer.flush(0)


def _refuse_taken_ports(server: Server) -> None:
    ports = [server.port]
    if isinstance(server, KafkaBroker):
        ports.append(server.controller_port)
    for port in ports:
        if port_open(port):
            raise StackError(_taken(server, port))


def _taken(server: Server, port: int) -> str:
    if isinstance(server, RedisServer):
        return (f"port {port} is in use (another Redis?): stop it, pick --redis-port, or "
                f"set REDIS_URL=redis://{LOOPBACK}:{port}/0 to use it")  # fmt: skip
    return (f"port {port} is in use (another Kafka?): stop it, pick --kafka-port (the "
            f"controller takes the port after it), or set KAFKA_BOOTSTRAP_SERVERS to use "
            f"an existing Kafka, or run with --broker tansu on another port")  # fmt: skip
