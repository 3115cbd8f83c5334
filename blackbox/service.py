"""Service: wires intake, store and dispatcher together, and runs their lifecycle.

Threads: one intake consumer loop, and APScheduler's worker running the firing tick every
poll interval. `stop()` (SIGTERM/SIGINT) stops intake, lets the current tick finish,
flushes the producers and commits offsets.
"""

from __future__ import annotations

import gc
import signal
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from types import FrameType

import redis
import structlog
from apscheduler.schedulers.background import BackgroundScheduler
from confluent_kafka import KafkaException, Producer

from blackbox import api, kafka, layout, memory, policy, shares
from blackbox.backoff import Backoff
from blackbox.clock import now_ms
from blackbox.dispatcher import Dispatcher, RetryPolicy
from blackbox.endpoints import Endpoints
from blackbox.envelope import Limits
from blackbox.errors import SettingsError
from blackbox.health import Health
from blackbox.incarnations import Incarnations
from blackbox.intake import Intake, IntakeConfig
from blackbox.keys import Layout
from blackbox.metrics import Metrics
from blackbox.outbox import Outbox
from blackbox.policy import CallerPolicy
from blackbox.settings import Settings
from blackbox.shares import Share, sweep_after_ms
from blackbox.store import RedisStore
from blackbox.waker import NudgeListener, Waker, nudge_message

log = structlog.get_logger("blackbox.service")

STOP_TIMEOUT_SECONDS = 8.0
# The process's exit codes (the `blackbox` command documents them).
EXIT_FAILED, EXIT_SETTINGS = 1, 2


def redis_client(url: str) -> redis.Redis:
    """A Redis client that fails fast when Redis is away, so callers can back off."""
    return redis.Redis.from_url(
        url, socket_timeout=5, socket_connect_timeout=2, health_check_interval=10
    )


def limits_of(settings: Settings) -> Limits:
    return Limits(
        max_value_bytes=settings.max_message_bytes,
        forbidden_topics=frozenset(settings.own_topics),
    )


def caller_policy_of(settings: Settings) -> CallerPolicy:
    """The policy file's rules, or the open policy; SettingsError if the file is bad."""
    base = policy.open_policy(settings.max_countdown, settings.max_message_bytes)
    return policy.load(settings.policy_file, base) if settings.policy_file else base


def retry_policy_of(settings: Settings) -> RetryPolicy:
    return RetryPolicy(
        batch_limit=settings.batch_limit,
        lease_ms=int(settings.lease_seconds * 1000),
        max_attempts=settings.max_attempts,
        backoff_ms=int(settings.retry_backoff * 1000),
        backoff_max_ms=int(settings.retry_backoff_max * 1000),
        dlq_topic=settings.dlq_topic,
        events_topic=settings.events_topic,
    )


class Service:
    """One blackbox replica: intake and dispatch against one Redis and one Kafka cluster."""

    def __init__(self, settings: Settings, metrics: Metrics | None = None) -> None:
        self.settings = settings
        caller_policy = caller_policy_of(settings)  # a bad policy file fails before any I/O
        self.metrics = metrics or Metrics()
        self.stopping = threading.Event()
        self.redis = redis_client(settings.redis_url)
        sharding = Layout(settings.namespace, settings.shards)
        self.store = RedisStore(
            self.redis, sharding, settings.grace_seconds, settings.fired_retention
        )
        self._probe_client = redis.Redis.from_url(
            settings.redis_url, socket_timeout=2, socket_connect_timeout=2
        )
        self.room = memory.Room(self._probe_client, sharding, self.metrics)
        self._policy_read = False
        self.exit_code = 0
        wait = settings.delivery_timeout + 1.0

        def renew() -> Producer:
            return kafka.new_producer(settings, linger_ms=kafka.FIRING_LINGER_MS)

        def renew_reporting_errors() -> Producer:
            return kafka.new_producer(settings, report_only_errors=True)

        # The intake sends an answer per request: its producer reports failures only.
        self._intake_outbox = Outbox(
            renew_reporting_errors(), wait, renew_reporting_errors, only_errors=True
        )
        self._dispatch_outbox = Outbox(renew(), wait, renew)
        share = Share(sharding, sweep_after_ms=sweep_after_ms(settings.poll_interval))
        self.dispatcher = Dispatcher(
            self.store, self._dispatch_outbox, retry_policy_of(settings), self.metrics, share
        )
        config = IntakeConfig(
            topic=settings.intake_topic,
            batch=settings.intake_batch,
            dlq_topic=settings.dlq_topic,
            events_topic=settings.events_topic,
            limits=limits_of(settings),
            policy=caller_policy,
        )
        self.intake = Intake(
            kafka.new_consumer(settings), self.store, self._intake_outbox, config, self.metrics,
            incarnations=Incarnations(kafka.topic_id_lookup(settings.kafka)),
            on_scheduled=self._scheduled, on_refused_for_memory=self.room.intake_refused,
        )  # fmt: skip
        stall_seconds = max(60.0, 10 * settings.poll_interval)
        self.health = Health(self._probes(), self.metrics, stall_seconds)
        self.endpoints = None if settings.http_port is None else self._endpoints(settings)
        self.waker = Waker(self._fire, self.stopping)
        self._nudges = NudgeListener(
            redis_client(settings.redis_url), sharding.wake_channel, self._nudged, self.stopping
        )
        self._threads = [
            threading.Thread(target=self._guard(self._run_intake), name="intake", daemon=True),
            threading.Thread(target=self._guard(self.waker.run), name="waker", daemon=True),
            threading.Thread(target=self._guard(self._nudges.run), name="nudges", daemon=True),
            threading.Thread(target=self._guard(self._run_health), name="health", daemon=True),
        ]
        self._scheduler = BackgroundScheduler(job_defaults={"coalesce": True, "max_instances": 1})
        self._fire_lock = threading.Lock()
        self._fire_backoff = Backoff(base=settings.poll_interval, cap=30.0)

    @property
    def failed(self) -> bool:
        """The service stopped for a failure (a crashed thread, an evicting Redis)."""
        return self.exit_code != 0

    def _endpoints(self, settings: Settings) -> Endpoints:
        """The HTTP server: health, metrics, the API and its page."""
        backend = api.backend_of(settings, self.store, self.health, self.metrics, self._scheduled)
        try:
            return Endpoints(settings.http_host, settings.http_port or 0,
                             api.create_app(backend), backend.close)  # fmt: skip
        except OSError as e:
            raise SettingsError(
                f"BLACKBOX_HTTP_PORT={settings.http_port} cannot be served on "
                f"{settings.http_host}: {e}"
            ) from e

    def _probes(self) -> dict[str, Callable[[], None]]:
        outbox, topic = self._dispatch_outbox, self.settings.intake_topic

        def redis_probe() -> None:
            if not self._policy_read:
                self._read_policy_or_stop()
            self.room.probe()

        def kafka_probe() -> None:
            outbox.producer.list_topics(topic, timeout=2)

        return {"redis": redis_probe, "kafka": kafka_probe}

    def start(self) -> None:
        """Start serving; a SettingsError if Redis may evict schedules (EvictingRedis) or holds
        messages pending under another shard count (ShardsChanged)."""
        log.info("service_starting", settings=repr(self.settings))
        self._check_eviction()
        if self.endpoints is not None:
            self.endpoints.start()
        for thread in self._threads:
            thread.start()
        self._scheduler.add_job(  # guarded: APScheduler would log a crash and carry on
            self._guard(self.tick), "interval", seconds=self.settings.poll_interval, id="tick",
            next_run_time=datetime.now(UTC), misfire_grace_time=None,
        )  # fmt: skip
        self._scheduler.start()

    def _check_eviction(self) -> None:
        """Read Redis's eviction policy now if Redis answers; if not, the first probe that
        reaches it does (and stops the service on an evicting Redis)."""
        try:
            self._read_policy()
        except (redis.ConnectionError, redis.TimeoutError) as e:
            log.warning("eviction_policy_unchecked", error=str(e), retry="at each probe")

    def _read_policy(self) -> None:
        memory.check_eviction(self._probe_client, self.settings.accept_eviction)
        layout.settle(self.redis, self.store.layout)
        self._policy_read = True

    def _read_policy_or_stop(self) -> None:
        try:
            self._read_policy()
        except SettingsError as e:  # an evicting Redis, or a shard count changed under data
            log.error("redis_refused", error=str(e))
            self.exit_code = EXIT_SETTINGS
            self.stopping.set()
            raise

    def tick(self) -> None:
        """The poll-interval safety net: renew this replica's share of the shards, return
        expired leases, and fire every shard of the share (and what is long overdue in the
        others'), after the waker's current run."""
        share, poll_interval = self.dispatcher.share, self.settings.poll_interval
        try:
            share.beat(self.redis, now_ms(), shares.ttl_ms(poll_interval))
            if self.dispatcher.reclaim_expired():
                self.waker.nudge(now_ms())
        except redis.RedisError as e:
            log.warning("reclaim_failed", error=str(e))
        self.waker.nudge(self._fire(sweep=True))
        self.health.beat()

    def _fire(self, *, sweep: bool = False) -> int:
        """Deliver what is due; return when to fire next (epoch ms)."""
        poll_ms = int(self.settings.poll_interval * 1000)
        with self._fire_lock:
            try:
                fired = self.dispatcher.fire_due(
                    self.stopping, self.waker.nudged_while_firing, sweep=sweep
                )
            except (redis.RedisError, KafkaException) as e:
                return now_ms() + self._paused(e)
            self._fire_backoff.reset()
        next_poll = now_ms() + poll_ms
        return next_poll if fired.next_due_ms is None else min(fired.next_due_ms, next_poll)

    def _settle_sent(self) -> None:
        """Settle what the dispatcher sent before stopping (what never left is retried)."""
        with self._fire_lock:
            try:
                self.dispatcher.settle_all(self.stopping)
            except (redis.RedisError, KafkaException) as e:  # their leases run out instead
                log.warning("settle_on_stop_failed", error=str(e))

    def _paused(self, error: Exception) -> int:
        dependency = "redis" if isinstance(error, redis.RedisError) else "kafka"
        self.metrics.dependency_errors.labels(dependency=dependency).inc()
        delay = self._fire_backoff.next()
        log.warning("firing_paused", dependency=dependency, error=str(error), retry_in_s=delay)
        return int(delay * 1000)

    def _scheduled(self, shard: int, due_ms: int) -> None:
        """Intake stored a schedule due at `due_ms`: wake this replica if it fires that
        shard, else the replica that does."""
        if self.dispatcher.share.nudged(shard, due_ms):
            self.waker.nudge(due_ms)
            return
        try:
            self.redis.publish(self.store.layout.wake_channel, nudge_message(shard, due_ms))
        except redis.RedisError as e:  # the poll interval still fires it on the other replicas
            log.info("nudge_not_published", error=str(e))

    def _nudged(self, shard: int, due_ms: int) -> None:
        """Another process published a due time: wake the waker if this replica fires it."""
        if self.dispatcher.share.nudged(shard, due_ms):
            self.waker.nudge(due_ms)

    def _run_intake(self) -> None:
        self.intake.run(self.stopping)

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
        """Stop intake, finish the current firing, flush producers, commit offsets."""
        log.info("service_stopping")
        self.stopping.set()
        self.waker.wake()
        deadline = time.monotonic() + STOP_TIMEOUT_SECONDS
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        if self._scheduler.running:
            self._scheduler.shutdown(wait=True)
        self._settle_sent()
        undelivered = self._intake_outbox.close(1.0) + self._dispatch_outbox.close(1.0)
        if self.endpoints is not None:
            self.endpoints.stop()
        self.redis.close()
        self._nudges.client.close()
        try:
            self.dispatcher.share.leave(self.redis)
        except redis.RedisError as e:  # its heartbeat runs out instead
            log.info("share_not_left", error=str(e))
        self._probe_client.close()
        log.info("service_stopped", unflushed=undelivered)

    def run_until_signalled(self) -> int:
        """Start, block until SIGTERM/SIGINT (or a crash), stop; return the exit code."""

        def on_signal(signum: int, _frame: FrameType | None) -> None:
            log.info("signal_received", signal=signal.Signals(signum).name)
            self.stopping.set()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        # What was built so far lives as long as the process: leave it out of the cyclic
        # collector's full passes, which otherwise walk every imported module's objects
        # again and again while intake churns (S3: ~30 -> ~20 us of CPU per record).
        # Before the threads start, so nothing they are busy with is frozen.
        gc.freeze()
        self.start()
        while not self.stopping.wait(0.5):
            pass
        self.stop()
        return self.exit_code
