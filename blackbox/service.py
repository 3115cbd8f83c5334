"""Service: wires intake, store and dispatcher together, and runs their lifecycle.

Threads: one intake consumer loop, and APScheduler's worker running the firing tick every
poll interval. `stop()` (SIGTERM/SIGINT) stops intake, lets the current tick finish,
flushes the producers and commits offsets.
"""

from __future__ import annotations

import signal
import threading
import time
from datetime import UTC, datetime
from types import FrameType

import redis
import structlog
from apscheduler.schedulers.background import BackgroundScheduler
from confluent_kafka import KafkaException

from blackbox import kafka
from blackbox.backoff import Backoff
from blackbox.dispatcher import Dispatcher, Policy
from blackbox.envelope import Limits
from blackbox.intake import Intake, IntakeConfig
from blackbox.keys import Keys
from blackbox.metrics import Metrics
from blackbox.outbox import Outbox
from blackbox.settings import Settings
from blackbox.store import RedisStore

log = structlog.get_logger("blackbox.service")

STOP_TIMEOUT_SECONDS = 8.0


def redis_client(url: str) -> redis.Redis:
    """A Redis client that fails fast when Redis is away, so callers can back off."""
    return redis.Redis.from_url(
        url, socket_timeout=5, socket_connect_timeout=2, health_check_interval=10
    )


def limits_of(settings: Settings) -> Limits:
    return Limits(
        max_value_bytes=settings.max_message_bytes,
        max_countdown_seconds=settings.max_countdown,
        forbidden_topics=frozenset({settings.intake_topic, settings.dlq_topic}),
    )


def policy_of(settings: Settings) -> Policy:
    return Policy(
        batch_limit=settings.batch_limit,
        lease_ms=int(settings.lease_seconds * 1000),
        max_attempts=settings.max_attempts,
        backoff_ms=int(settings.retry_backoff * 1000),
        backoff_max_ms=int(settings.retry_backoff_max * 1000),
        dlq_topic=settings.dlq_topic,
    )


class Service:
    """One blackbox replica: intake and dispatch against one Redis and one Kafka cluster."""

    def __init__(self, settings: Settings, metrics: Metrics | None = None) -> None:
        self.settings = settings
        self.metrics = metrics or Metrics()
        self.stopping = threading.Event()
        self.redis = redis_client(settings.redis_url)
        self.store = RedisStore(self.redis, Keys(settings.namespace), settings.grace_seconds)
        wait = settings.delivery_timeout + 1.0
        self._intake_outbox = Outbox(kafka.new_producer(settings), wait)
        self._dispatch_outbox = Outbox(kafka.new_producer(settings), wait)
        self.dispatcher = Dispatcher(
            self.store, self._dispatch_outbox, policy_of(settings), self.metrics
        )
        config = IntakeConfig(
            settings.intake_topic, settings.intake_batch, settings.dlq_topic, limits_of(settings)
        )
        self.intake = Intake(
            kafka.new_consumer(settings), self.store, self._intake_outbox, config, self.metrics
        )
        self._intake_thread = threading.Thread(target=self._run_intake, name="intake", daemon=True)
        self._scheduler = BackgroundScheduler(job_defaults={"coalesce": True, "max_instances": 1})
        self._tick_backoff = Backoff(base=settings.poll_interval, cap=30.0)
        self._tick_blocked_until = 0.0
        self.failed = False

    def start(self) -> None:
        log.info("service_starting", settings=repr(self.settings))
        self._intake_thread.start()
        self._scheduler.add_job(
            self.tick, "interval", seconds=self.settings.poll_interval, id="fire",
            next_run_time=_now(), misfire_grace_time=None,
        )  # fmt: skip
        self._scheduler.start()

    def tick(self) -> None:
        """One firing run: deliver all that is due; on a dependency failure, back off."""
        if self.stopping.is_set() or time.monotonic() < self._tick_blocked_until:
            return
        try:
            self.dispatcher.fire_due(self.stopping)
            self._tick_backoff.reset()
        except (redis.RedisError, KafkaException) as e:
            dependency = "redis" if isinstance(e, redis.RedisError) else "kafka"
            self.metrics.dependency_errors.labels(dependency=dependency).inc()
            delay = self._tick_backoff.next()
            self._tick_blocked_until = time.monotonic() + delay
            log.warning("firing_paused", dependency=dependency, error=str(e), retry_in_s=delay)

    def _run_intake(self) -> None:
        try:
            self.intake.run(self.stopping)
        except Exception:
            log.exception("intake_crashed")
            self.failed = True
            self.stopping.set()

    def stop(self) -> None:
        """Stop intake, finish the current tick, flush producers, commit offsets."""
        log.info("service_stopping")
        self.stopping.set()
        self._intake_thread.join(STOP_TIMEOUT_SECONDS)
        if self._scheduler.running:
            self._scheduler.shutdown(wait=True)
        undelivered = self._intake_outbox.close(1.0) + self._dispatch_outbox.close(1.0)
        self.redis.close()
        log.info("service_stopped", unflushed=undelivered)

    def run_until_signalled(self) -> int:
        """Start, block until SIGTERM/SIGINT (or a crash), stop; return the exit code."""

        def on_signal(signum: int, _frame: FrameType | None) -> None:
            log.info("signal_received", signal=signal.Signals(signum).name)
            self.stopping.set()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        self.start()
        while not self.stopping.wait(0.5):
            pass
        self.stop()
        return 1 if self.failed else 0


def _now() -> object:

    return datetime.now(UTC)
