"""Firing: the dispatcher, and the two triggers that run it.

The waker fires this process's share of the shards at each due instant (woken early by
this process's intake, its API, or a nudge another process published for one of those
shards); APScheduler's tick, every poll interval, is the safety net: it renews the share's
heartbeat, returns expired leases to due (in the shards where one can have run out), and
fires what a probe of every shard finds due in the share and long overdue in the others'
shards. A lock keeps the two apart, and a backoff pauses firing while Redis or
the broker fails. While a rebuild from Kafka is under way (or stopped half-way), Redis is
half written back: nothing fires until it ends (storage/rebuilding.py). A Redis that lost
data (flushed, restarted empty, restored from an older snapshot: storage/clocks.py) may
hold what fired already: nothing fires from it until the operator acts, and the claim
script itself refuses it from the first claim after the loss.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime

import redis
import structlog
from apscheduler.schedulers.background import BackgroundScheduler
from confluent_kafka import KafkaException, Producer

from blackbox.backoff import Backoff
from blackbox.clock import now_ms
from blackbox.firing import shares
from blackbox.firing.batch import Horizon
from blackbox.firing.dispatcher import CLAIM_LEAD_MS, Dispatcher
from blackbox.firing.nudges import NudgeListener
from blackbox.firing.readahead import READ_AHEAD_SECONDS, ReadAhead
from blackbox.firing.rechecks import Rechecks
from blackbox.firing.retry import RetryPolicy
from blackbox.firing.shares import Share, sweep_after_ms
from blackbox.firing.waker import Waker
from blackbox.kafka import clients
from blackbox.kafka.outbox import Outbox
from blackbox.kafka.storetopic import StoreTopic
from blackbox.metrics import Metrics
from blackbox.role import Loop
from blackbox.settings import REPORT_GRACE_SECONDS, Settings
from blackbox.storage import rebuilding
from blackbox.storage.clocks import Clocks, refused_for_loss
from blackbox.storage.connections import RedisClient
from blackbox.storage.store import RedisStore

log = structlog.get_logger("blackbox.firing.runner")

# How often firing looks at the shards' clocks, seconds: an intake moves them every
# gaps.CHECK_SECONDS; a claim itself refuses a clock below the floor the last look set.
CLOCKS_LOOK_SECONDS = 2.0
# Wraps a thread's loop (or the tick) so that a crash stops the process with a failure.
Guard = Callable[[Loop], Loop]


def retry_policy_of(settings: Settings) -> RetryPolicy:
    return RetryPolicy(
        batch_limit=settings.batch_limit,
        batch_bytes=settings.batch_bytes,
        lease_ms=int(settings.lease_seconds * 1000),
        max_attempts=settings.max_attempts,
        backoff_ms=int(settings.retry_backoff * 1000),
        backoff_max_ms=int(settings.retry_backoff_max * 1000),
        dlq_topic=settings.dlq_topic,
        events_topic=settings.events_topic,
    )


def firing_outbox(settings: Settings) -> Outbox:
    """The producer of deliveries: it waits up to FIRING_LINGER_MS (5 ms) to share a
    produce request, each record stamped when it is handed over at its due instant."""

    def renew() -> Producer:
        return clients.new_producer(settings, linger_ms=clients.FIRING_LINGER_MS)

    return Outbox(renew(), settings.delivery_timeout + REPORT_GRACE_SECONDS, renew)


class Firing:
    """Fires due messages from one store: `loops()` run on threads, `start` adds the tick."""

    def __init__(  # noqa: PLR0913 - its collaborators, each injected
        self, settings: Settings, store: RedisStore, metrics: Metrics, *,
        client: RedisClient, nudge_client: RedisClient, stopping: threading.Event,
        on_tick: Callable[[], None], name: str | None = None, horizon_of: Horizon | None = None,
        on_held: Callable[[str | None], None] = lambda _reason: None,
    ) -> None:  # fmt: skip
        """`client` keeps the share's heartbeat; `nudge_client` listens for the due times
        other processes publish; `on_tick` is called after each safety-net tick (the
        liveness clock); `name` is this process's among the firers; `horizon_of` how far
        ahead each caller's series may go on (default: BLACKBOX_MAX_COUNTDOWN for all);
        `on_held` is told why firing holds for Redis lost data (None: it holds no more)."""
        self.poll_interval = settings.poll_interval
        self.client = client
        self.metrics = metrics
        self.stopping = stopping
        self._on_tick = on_tick
        self._claims_seen = 0
        self.outbox = firing_outbox(settings)
        share = Share(store.layout, name, sweep_after_ms(settings.poll_interval),
                      shares.refresh_ms(settings.lease_seconds))  # fmt: skip
        horizon_of = horizon_of or (lambda _caller: int(settings.max_countdown * 1000))
        self.clocks = Clocks(store.client, store.layout, int(settings.redis_max_lag * 1000),
                             store.beat_all)  # fmt: skip
        rechecks = Rechecks(settings.kafka, int(settings.redis_max_lag * 1000))
        keeper = None
        if settings.store_topic:
            keeper = StoreTopic(settings.store_topic, self.outbox, metrics)
        self.dispatcher = Dispatcher(store, self.outbox, retry_policy_of(settings), metrics, share,
                                     horizon_of=horizon_of, floors=self.clocks.floors,
                                     rechecks=rechecks, keeper=keeper)  # fmt: skip
        self.dispatcher.ahead_ms = settings.fire_ahead_ms
        self._on_held = on_held
        self.lost: str | None = None  # what Redis lost, while firing holds for it
        self._clocks_due = 0.0  # time.monotonic() of the next look at the clocks
        self.share = share
        self.waker = Waker(self.fire, stopping, settings.fire_coalesce_ms)
        self.nudges = NudgeListener(nudge_client, store.layout.wake_channel, self._nudged, stopping)
        self._read_ahead = None
        if settings.storage_mode == "index" and store.reader is not None:
            budget = (settings.store_cache_mb << 20) // 2
            self._read_ahead = ReadAhead(store, store.reader, budget)
        self._scheduler = BackgroundScheduler(job_defaults={"coalesce": True, "max_instances": 1})
        self._lock = threading.Lock()
        self._backoff = Backoff(base=settings.poll_interval, cap=30.0)
        self.layout = store.layout
        self.held_rounds = 0  # fire calls that found a rebuild under way
        self._rebuild_seen = False
        self._rebuild_checked_ms = 0

    def loops(self) -> dict[str, Loop]:
        """The threads it needs, by name."""
        return {"waker": self.waker.run, "nudges": self.nudges.run}

    def start(self, guard: Guard) -> None:
        """Start the safety-net tick (guarded: APScheduler would log a crash and carry on)."""
        self._scheduler.add_job(
            guard(self.tick), "interval", seconds=self.poll_interval, id="tick",
            next_run_time=datetime.now(UTC), misfire_grace_time=None,
        )  # fmt: skip
        # Apart from the tick, which waits for the fire lock while a burst drains: the
        # heartbeat must not stop then, or the others would take this process's shards.
        self._scheduler.add_job(
            guard(self.beat), "interval", seconds=self.poll_interval, id="beat",
            next_run_time=datetime.now(UTC), misfire_grace_time=None,
        )  # fmt: skip
        if self._read_ahead is not None:
            self._scheduler.add_job(
                guard(self.read_ahead), "interval", seconds=READ_AHEAD_SECONDS / 4,
                id="read_ahead", next_run_time=datetime.now(UTC), misfire_grace_time=None,
            )  # fmt: skip
        self._scheduler.start()

    def read_ahead(self) -> None:
        """Index mode: the records of what this replica's shards hold due soon, cached."""
        if self._read_ahead is not None and self.lost is None:
            self._read_ahead.run_once(self.share.owned)

    def nudge(self, shard: int, due_ms: int) -> bool:
        """Something in `shard` is due at `due_ms`: True if this process fires that shard
        (its waker then fires by `due_ms`)."""
        if not self.share.nudged(shard, due_ms):
            return False
        # Woken just before it, as for every shard: the claim is over by the due time.
        self.waker.nudge(due_ms - CLAIM_LEAD_MS)
        return True

    def _nudged(self, shard: int, due_ms: int) -> None:
        """Another process published a due time (the listener's callback)."""
        self.nudge(shard, due_ms)

    def tick(self) -> None:
        """The poll-interval safety net: return expired leases, and fire every shard of the
        share where something is due (and what is long overdue in the others'), after the
        waker's current run."""
        try:
            if self.dispatcher.reclaim_expired():
                self.waker.nudge(now_ms())
        except redis.RedisError as e:
            self.share.forget_leases()  # all reclaimed at the next tick
            log.warning("reclaim_failed", error=str(e))
        self.waker.nudge(self.fire(sweep=True))
        self._on_tick()

    def beat(self) -> None:
        """Renew this process's heartbeat and take its share of the shards; while a burst
        holds the tick back, claims still going on are the liveness clock."""
        if self.dispatcher.claims != self._claims_seen:
            self._claims_seen = self.dispatcher.claims
            self._on_tick()
        try:
            self.share.beat(self.client, now_ms(), shares.ttl_ms(self.poll_interval))
        except redis.RedisError as e:  # the share stays as it was; the heartbeat may run out
            log.warning("share_beat_failed", error=str(e))
        self.metrics.owned_shards.set(len(self.share.owned))
        if time.monotonic() >= self._clocks_due:  # they move every few seconds, no sooner
            self._clocks_due = time.monotonic() + CLOCKS_LOOK_SECONDS
            self._look_at_clocks()

    def _look_at_clocks(self) -> None:
        """Hold firing while a shard's clock says Redis lost data, leaving the mark where
        this process found it first (a claim then refuses it too); release it once the
        operator acted (the marks gone)."""
        now = now_ms()
        try:
            found = self.clocks.look(now)
        except redis.RedisError as e:  # the claims' own look at the clocks still guards
            log.info("clocks_not_read", error=str(e))
            return
        lost = [(shard, clock) for shard, clock in enumerate(found) if clock.lost is not None]
        first_seen = [shard for shard, clock in lost if clock.mark is None]
        if lost and first_seen:
            try:
                self.clocks.mark_lost(first_seen, lost[0][1].lost or "lost", now,
                                      "found by firing: see the log line firing_held")  # fmt: skip
            except redis.RedisError as e:
                log.info("clocks_not_marked", error=str(e))
        self._hold(lost[0][1].lost if lost else None)

    def _hold(self, lost: str | None) -> None:
        """Hold firing for Redis lost data (`lost`, its kind), or release it (None)."""
        if lost == self.lost:
            return
        if lost is not None:
            log.error("firing_held", reason="redis_lost_data", kind=lost,
                      action="rebuild Redis from Kafka (blackbox rebuild), or restart "
                      "the intake with BLACKBOX_REDIS_LOSS=reread or =skip")  # fmt: skip
        else:
            log.warning("firing_released", reason="redis_lost_data")
        self.lost = lost
        self.metrics.firing_held_for_lost_data.set(0 if lost is None else 1)
        self._on_held(None if lost is None else f"Redis lost data ({lost}): nothing fires")

    def fire(self, *, sweep: bool = False) -> int:
        """Deliver what is due; return when to fire next (epoch ms)."""
        poll_ms = int(self.poll_interval * 1000)
        with self._lock:
            try:
                if self.lost is not None or self._rebuild_under_way(poll_ms):
                    return now_ms() + poll_ms
                fired = self.dispatcher.fire_due(
                    self.stopping, self.waker.nudged_while_firing, sweep=sweep
                )
            except redis.ResponseError as e:
                if not refused_for_loss(e):
                    return now_ms() + self._paused(e)
                self._hold(str(e).split(" ", 2)[1].rstrip(":"))
                return now_ms() + poll_ms
            except (redis.RedisError, KafkaException) as e:
                return now_ms() + self._paused(e)
            self._backoff.reset()
        next_poll = now_ms() + poll_ms
        return next_poll if fired.wake_ms is None else min(fired.wake_ms, next_poll)

    def _rebuild_under_way(self, poll_ms: int) -> bool:
        """Whether a rebuild's mark is in Redis, looked up at most once a poll interval."""
        now = now_ms()
        if now >= self._rebuild_checked_ms + poll_ms:
            self._rebuild_checked_ms = now
            seen = rebuilding.under_way(self.client, self.layout)
            if seen != self._rebuild_seen:
                log.warning("firing_held" if seen else "firing_released", reason="rebuild")
            self._rebuild_seen = seen
        self.held_rounds += self._rebuild_seen
        return self._rebuild_seen

    def _paused(self, error: Exception) -> int:
        dependency = "redis" if isinstance(error, redis.RedisError) else "kafka"
        if isinstance(error, redis.RedisError):  # a failover may have lost what was known
            self.share.forget_leases()
        self.metrics.dependency_errors.labels(dependency=dependency).inc()
        delay = self._backoff.next()
        log.warning("firing_paused", dependency=dependency, error=str(error), retry_in_s=delay)
        return int(delay * 1000)

    def wake(self) -> None:
        """Wake the waker now, so that it sees the process stopping."""
        self.waker.wake()

    def stop(self) -> int:
        """After its threads ended: let the current tick finish, settle what was sent,
        flush the producer; how many records it could not flush."""
        if self._scheduler.running:
            self._scheduler.shutdown(wait=True)
        self._settle_sent()
        self._leave()
        self.nudges.client.close()
        return self.outbox.close(1.0)

    def _leave(self) -> None:
        """Drop this process's heartbeat, so the others take its shards at their next beat."""
        try:
            self.share.leave(self.client)
        except redis.RedisError as e:  # its heartbeat runs out instead
            log.info("share_not_left", error=str(e))

    def _settle_sent(self) -> None:
        """Settle what the dispatcher sent before stopping (what never left is retried)."""
        with self._lock:
            try:
                self.dispatcher.settle_all(self.stopping)
            except (redis.RedisError, KafkaException) as e:  # their leases run out instead
                log.warning("settle_on_stop_failed", error=str(e))
