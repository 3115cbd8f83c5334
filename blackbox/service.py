"""Service: one `blackbox run` process of a role, and its lifecycle.

It builds the parts its role names (`Receiving`: the intake consumer; `Firing`: the
dispatcher with its waker and safety-net tick), the health loop and the HTTP endpoints,
and tells the firing processes what intake and the API store. It starts them, and on
SIGTERM/SIGINT (or a crashed thread) stops them in order: intake first (committing its
offsets), then firing settles what it sent, and the producers flush.
"""

from __future__ import annotations

import gc
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from types import FrameType

import redis
import structlog
from confluent_kafka import KafkaException, Producer

from blackbox import tracing
from blackbox.api import app
from blackbox.api.backend import Backend, backend_of
from blackbox.api.connections import Limits
from blackbox.api.server import PROBE_LIMITS, PROBE_PATHS, Endpoints
from blackbox.clock import now_ms
from blackbox.errors import RedisFull, SettingsError, ShardsChanged, StoreTopicRefused
from blackbox.exits import EXIT_FAILED, EXIT_SETTINGS
from blackbox.firing import shares
from blackbox.firing.nudges import Publisher
from blackbox.firing.runner import Firing
from blackbox.health import Health, Probe
from blackbox.intake import filling
from blackbox.intake.policy import CallerPolicy
from blackbox.intake.runner import Receiving, caller_policy_of
from blackbox.kafka import clients, retention
from blackbox.kafka.storereader import StoreReader
from blackbox.metrics import Metrics
from blackbox.role import Loop, Role
from blackbox.settings import Settings
from blackbox.storage import memory, rebuilding, shardcount
from blackbox.storage.connections import redis_client
from blackbox.storage.keys import Layout
from blackbox.storage.store import RedisStore

log = structlog.get_logger("blackbox.service")

STOP_TIMEOUT_SECONDS = 8.0
# How often the main thread looks for a signal received (or a crash).
SIGNAL_POLL_SECONDS = 0.2
# How long the start check waits for the broker to describe the store topic; a broker away
# is asked again at each probe.
STORE_CHECK_SECONDS = 5.0


class Service:
    """One blackbox process: the parts of its role against one Redis and one Kafka cluster."""

    def __init__(
        self,
        settings: Settings,
        metrics: Metrics | None = None,
        role: Role = Role.ALL,
        *,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        caller_policy = caller_policy_of(settings)  # a bad policy file fails before any I/O
        self.settings, self.role = settings, role
        self.metrics = metrics or Metrics()
        self.metrics.role.info({"role": role.value})
        self.stopping = threading.Event()
        self._stopped = False
        self.exit_code = 0
        self._environ = environ or {}  # OTEL_* variables: spans exported (tracing.py)
        self._tracing = False
        self.redis = redis_client(settings.redis_url)
        self._probe_client = redis_client(settings.redis_url, socket_timeout=2)
        self.name = shares.replica_name()  # among the firers and the processes of the count
        sharding = Layout(settings.namespace, self._shard_count())
        self.guard = shardcount.Guard(self.redis, sharding, self.name,
                                  shardcount.heartbeat_ms(settings.health_interval))  # fmt: skip
        self.store = RedisStore(
            self.redis, sharding, settings.grace_seconds, settings.fired_retention
        )
        if settings.store_topic:  # references (index mode, now or before) are read back
            cache = settings.store_cache_mb << 20
            self.store.reader = StoreReader(settings.kafka, settings.store_topic, cache,
                                            self.metrics)  # fmt: skip
        self.room = memory.Room(self._probe_client, sharding, self.metrics)
        # Eviction policy, shard count and the store topic found right: intake waits for it.
        self._redis_checked = threading.Event()
        self._publisher = Publisher(self.redis, self.store.layout.wake_channel)
        self.firing = self._firing(caller_policy) if role.fires else None
        self.receiving = (
            Receiving(settings, self.store, self.metrics, caller_policy=caller_policy,
                      room=self.room, stopping=self.stopping, announce=self._scheduled,
                      redis_checked=self._redis_checked, on_stopped=self._intake_stopped)
            if role.takes_intake else None
        )  # fmt: skip
        self.health = Health(self._probes(), self.metrics, self._stall_seconds())
        self.backend: Backend | None = None  # the API's parts, with its HTTP server
        self.endpoints = (
            None if settings.http_port is None else self._endpoints(settings, caller_policy)
        )
        try:
            self.probe_endpoints = self._probe_endpoints(settings)
        except SettingsError:  # the API's port, bound already, is not left open
            if self.endpoints is not None:
                self.endpoints.close()
            raise
        self._threads = [
            threading.Thread(target=self._guard(loop), name=name, daemon=True)
            for name, loop in self._loops().items()
        ]

    def _intake_stopped(self, partitions: Sequence[tuple[str, int]]) -> None:
        """Intake partitions stopped because Redis lost their data keep the replica unready."""
        self.metrics.stopped_partitions.set(len(partitions))
        named = ", ".join(f"{topic}:{partition}" for topic, partition in partitions)
        reason = f"Redis lost the data of intake partitions {named}: see the log" if named else None
        self.health.hold("intake", reason)

    @property
    def failed(self) -> bool:
        """The service stopped for a failure (a crashed thread, an evicting Redis)."""
        return self.exit_code != 0

    def _shard_count(self) -> int:
        """BLACKBOX_SHARDS, or the count the namespace was written with when it is unset
        (shardcount.adopt). If Redis is away at start, the default for now: `_read_policy`
        adopts again once it answers, and stops the process if the count differs (the
        next start adopts it)."""
        self._shards_adopted = self.settings.shards is None
        if self.settings.shards is not None:
            return self.settings.shards
        try:
            return shardcount.adopt(self._probe_client, self.settings.namespace)
        except (redis.ConnectionError, redis.TimeoutError) as e:
            log.warning("shards_unknown", error=str(e), shards=shardcount.DEFAULT_SHARDS,
                        retry="at each probe")  # fmt: skip
            self._shards_adopted = False
            return shardcount.DEFAULT_SHARDS

    def _firing(self, caller_policy: CallerPolicy) -> Firing:
        nudges = redis_client(self.settings.redis_url)
        return Firing(self.settings, self.store, self.metrics, client=self.redis,
                      nudge_client=nudges, stopping=self.stopping, on_tick=self._beat,
                      name=self.name, horizon_of=caller_policy.horizon_ms,
                      on_held=lambda reason: self.health.hold("firing", reason))  # fmt: skip

    def _stall_seconds(self) -> float | None:
        """The firing clock's stall limit; none in a role that does not fire."""
        return None if self.firing is None else max(60.0, 10 * self.settings.poll_interval)

    def _loops(self) -> dict[str, Loop]:
        """Every thread of this process, by name: the parts' and health."""
        loops = {"health": self._run_health}
        for part in (self.receiving, self.firing):
            if part is not None:
                loops.update(part.loops())
        return loops

    def _endpoints(self, settings: Settings, caller_policy: CallerPolicy) -> Endpoints:
        """The HTTP server: health, metrics, the API and its page."""
        backend = backend_of(settings, self.store, self.health, self.metrics,
                             self._scheduled, caller_policy=caller_policy)  # fmt: skip
        self.backend = backend
        try:
            limits = Limits(settings.http_header_timeout, settings.http_max_connections,
                            settings.http_answer_timeout,
                            settings.http_max_connections_per_client)  # fmt: skip
            return Endpoints(settings.http_host, settings.http_port or 0,
                             app.create_app(backend), backend.close, limits)  # fmt: skip
        except OSError as e:
            raise _unservable("BLACKBOX_HTTP_PORT", settings.http_port, settings, e) from e

    def _probe_endpoints(self, settings: Settings) -> Endpoints | None:
        """The probes' own listener, where BLACKBOX_PROBE_PORT asks for one."""
        if settings.probe_port is None:
            return None
        try:
            return Endpoints(settings.http_host, settings.probe_port,
                             app.probes_app(self.health, self.metrics), limits=PROBE_LIMITS,
                             paths=PROBE_PATHS)  # fmt: skip
        except OSError as e:
            raise _unservable("BLACKBOX_PROBE_PORT", settings.probe_port, settings, e) from e

    def _probes(self) -> dict[str, Probe]:
        """Redis (its eviction policy and memory) and the broker, through this role's
        producer. Redis too full for intake leaves a dispatch-only process ready: its
        firing is what frees room."""
        producer, topic = self._producer(), self.settings.intake_topic

        def kafka_probe() -> None:
            producer.list_topics(topic, timeout=2)

        return {"redis": self._probe_redis, "kafka": kafka_probe}

    def _producer(self) -> Producer:
        """The producer whose metadata request probes the broker: firing's, else intake's."""
        part = self.firing or self.receiving
        if part is None:
            raise SettingsError(f"role {self.role} runs neither intake nor firing")
        return part.outbox.producer

    def _probe_redis(self) -> None:
        self._check_redis_or_stop()
        try:
            self.room.probe()
        except RedisFull:
            if self.receiving is not None:
                raise

    def start(self) -> None:
        """Start serving; a SettingsError if Redis may evict schedules (EvictingRedis), holds
        messages pending under another shard count (ShardsChanged), or the store topic is
        missing or not compacted alone (StoreTopicRefused)."""
        log.info("service_starting", role=self.role.value, settings=repr(self.settings))
        self._tracing = tracing.configure(self._environ)
        self._check_eviction()
        for endpoints in (self.endpoints, self.probe_endpoints):
            if endpoints is not None:
                endpoints.start()
        for thread in self._threads:
            thread.start()
        if self.firing is not None:
            self.firing.start(self._guard)

    def _check_eviction(self) -> None:
        """Read Redis's eviction policy now if Redis answers; if not, the first probe that
        reaches it does (and stops the service on an evicting Redis)."""
        try:
            self._read_policy()
        except (redis.ConnectionError, redis.TimeoutError) as e:
            log.warning("eviction_policy_unchecked", error=str(e), retry="at each probe")

    def _read_policy(self) -> None:
        memory.check_eviction(self._probe_client, self.settings.accept_eviction)
        self._check_adopted()
        # The store checked before anything writes to it (a missing topic would be created
        # by the first write, with cleanup.policy=delete).
        if not self._store_checked():
            return
        if not filling.check(self.settings, self._probe_client, self.store.layout):
            return
        self.guard.settle(now_ms(), clients.committed_offsets(self.settings))
        if self._rebuild_under_way():
            return
        self._redis_checked.set()

    def _rebuild_under_way(self) -> bool:
        """A rebuild from Kafka began and did not finish: intake waits (each probe looks
        again), and the replica is not ready, until one runs to its end."""
        under_way = rebuilding.under_way(self._probe_client, self.store.layout)
        if under_way:
            action = "let the rebuild finish, or run `blackbox rebuild --yes` again"
            log.error("rebuild_under_way", namespace=self.settings.namespace, action=action)
        reason = "a rebuild from Kafka is under way or stopped half-way" if under_way else None
        self.health.hold("rebuild", reason)
        return under_way

    def _store_checked(self) -> bool:
        """The store topic, where one is set, exists and is compacted alone (one describe
        call; StoreTopicRefused if not). While the broker cannot tell, intake waits and the
        replica is not ready: each probe asks again."""
        topic = self.settings.store_topic
        if not topic:
            return True
        try:
            retention.check_store(self.settings.kafka, topic, STORE_CHECK_SECONDS)
        except KafkaException as e:
            error = e.args[0].str() if e.args and hasattr(e.args[0], "str") else str(e)
            log.warning("store_topic_unchecked", topic=topic, error=error, retry="at each probe")
            self.health.hold("store", f"the store topic {topic} could not be checked: {error}")
            return False
        self.health.hold("store", None)
        return True

    def _check_adopted(self) -> None:
        """BLACKBOX_SHARDS unset and Redis away at start: the count taken meanwhile must be
        the one the namespace adopts now."""
        if self.settings.shards is not None or self._shards_adopted:
            return
        adopted = shardcount.adopt(self._probe_client, self.settings.namespace)
        if adopted != self.store.layout.count:
            raise ShardsChanged(
                f"BLACKBOX_SHARDS is unset and Redis was away at start: this process took "
                f"{self.store.layout.count} shards, but namespace "
                f"{self.settings.namespace!r} has {adopted}. Stopping; the next start adopts it."
            )
        self._shards_adopted = True

    def _check_redis_or_stop(self) -> None:
        """Until Redis was checked: check it (intake waits for that). After: check that no
        other process changed the namespace's shard count meanwhile."""
        try:
            if self._redis_checked.is_set():
                self.guard.verify(now_ms())
            else:
                self._read_policy()
        except SettingsError as e:  # an evicting Redis, a shard count changed under data, a store
            event = "store_topic_refused" if isinstance(e, StoreTopicRefused) else "redis_refused"
            log.error(event, error=str(e))
            self.exit_code = EXIT_SETTINGS
            self.stopping.set()
            raise

    def _scheduled(self, shard: int, due_ms: int) -> None:
        """Intake (or the API) stored a schedule due at `due_ms` in `shard`: wake this
        process's waker if it fires that shard, else tell the process that does."""
        if self.firing is not None and self.firing.nudge(shard, due_ms):
            return
        self._publisher.publish(shard, due_ms)

    def _beat(self) -> None:
        """A firing tick completed: the liveness clock."""
        self.health.beat()

    def _run_health(self) -> None:
        self.health.run(self.stopping, self.settings.health_interval)

    def _guard(self, loop: Callable[[], None]) -> Callable[[], None]:
        """Run a thread's loop; if it crashes, stop the whole service with a failure."""

        def guarded() -> None:
            try:
                loop()
            except Exception:
                log.exception("thread_crashed", thread=threading.current_thread().name)
                self.exit_code = EXIT_FAILED
                self.health.mark_crashed()
                self.stopping.set()

        return guarded

    def stop(self) -> None:
        """Stop intake (its offsets committed), let firing settle, flush the producers and
        close every client. Stopping again does nothing."""
        if self._stopped:
            return
        self._stopped = True
        log.info("service_stopping", role=self.role.value)
        self.stopping.set()
        if self.firing is not None:
            self.firing.wake()
        self._join_threads()
        unflushed = sum(part.stop() for part in (self.receiving, self.firing) if part)
        self._leave()
        for endpoints in (self.endpoints, self.probe_endpoints):
            if endpoints is not None:
                endpoints.stop()
        self.redis.close()
        self._probe_client.close()
        if self.store.reader is not None:
            self.store.reader.close()
        if self._tracing:
            tracing.shutdown()
        log.info("service_stopped", role=self.role.value, unflushed=unflushed)

    def _leave(self) -> None:
        """Drop this process's heartbeat: a shard-count change need not wait for it."""
        try:
            self.guard.leave()
        except redis.RedisError as e:  # it runs out instead
            log.info("heartbeat_not_left", error=str(e))

    def _join_threads(self) -> None:
        deadline = time.monotonic() + STOP_TIMEOUT_SECONDS
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def run_until_signalled(self) -> int:
        """Start, block until SIGTERM/SIGINT (or a crash), stop; return the exit code."""
        received: list[int] = []

        def on_signal(signum: int, _frame: FrameType | None) -> None:
            # Only noted here: the handler runs in the main thread between two bytecodes,
            # maybe while it holds the lock inside `stopping.wait()` (or the log's), and
            # taking that lock again here (`stopping.set()`, a log line) never returns.
            received.append(signum)

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        # What was built so far lives as long as the process: leave it out of the cyclic
        # collector's full passes, which otherwise walk every imported module's objects
        # again and again while intake churns (S3: ~30 -> ~20 us of CPU per record).
        # Before the threads start, so nothing they are busy with is frozen.
        gc.freeze()
        self.start()
        while not received and not self.stopping.wait(SIGNAL_POLL_SECONDS):
            pass
        if received:
            log.info("signal_received", signal=signal.Signals(received[0]).name)
        self.stop()
        return self.exit_code


def _unservable(
    variable: str, port: int | None, settings: Settings, error: OSError
) -> SettingsError:
    """The error for a port the HTTP server cannot listen on, naming its variable."""
    return SettingsError(f"{variable}={port} cannot be served on {settings.http_host}: {error}")
