"""Waker: fire at each due instant rather than at the next poll.

It sleeps until the earliest due time that the last claim reported (or one poll interval,
whichever is sooner) and wakes early when nudged: by this replica's intake, or by another
replica's through a Redis pub/sub message carrying the due time. A nudge that comes while
`fire` runs is kept: the claim inside may already have looked, so the next wake-up is no
later than the nudged time.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import redis
import structlog

from blackbox.backoff import Backoff
from blackbox.clock import now_ms
from blackbox.firing.shares import Nudge
from blackbox.storage.connections import RedisClient, refresh_after

log = structlog.get_logger("blackbox.firing.waker")

# fire() returns when to run next (epoch ms).
Fire = Callable[[], int]


class Waker:
    """A loop calling `fire` at the instants it returns, woken early by `nudge`."""

    def __init__(self, fire: Fire, stop: threading.Event) -> None:
        self.fire = fire
        self.stop = stop
        self.planned_ms = 0
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._firing = False
        self._nudged_ms: int | None = None  # the earliest nudge while firing

    def run(self) -> None:
        while not self.stop.is_set():
            with self._lock:
                self._firing, self._nudged_ms = True, None
            wake_at = self.fire()
            with self._lock:
                if self._nudged_ms is not None:
                    wake_at = min(wake_at, self._nudged_ms)
                self._firing, self.planned_ms = False, wake_at
            self._sleep_until(wake_at)

    def _sleep_until(self, wake_at: int) -> None:
        delay = (wake_at - now_ms()) / 1000
        if delay > 0:
            self._wake.wait(delay)
        self._wake.clear()

    def nudge(self, due_ms: int) -> bool:
        """Wake at `due_ms` if that is sooner than planned; True if it was."""
        with self._lock:
            if self._firing:
                if self._nudged_ms is not None and due_ms >= self._nudged_ms:
                    return False
                self._nudged_ms = due_ms
                return True
            if due_ms >= self.planned_ms:
                return False
            self.planned_ms = due_ms
        self._wake.set()
        return True

    def nudged_while_firing(self) -> int | None:
        """The earliest due time nudged since the current `fire` began, if it runs."""
        with self._lock:
            return self._nudged_ms if self._firing else None

    def wake(self) -> None:
        """Wake now (shutting down)."""
        self._wake.set()


def nudge_message(shard: int, due_ms: int) -> str:
    """What a nudge publishes: "shard:due ms"."""
    return f"{shard}:{due_ms}"


def parse_nudge(data: bytes) -> tuple[int, int] | None:
    """(shard, due ms) of a published nudge; None for one not understood (logged)."""
    shard, _, due = data.partition(b":")
    try:
        return int(shard), int(due)
    except ValueError:
        log.warning("nudge_unreadable", data=data[:40])
        return None


class NudgeListener:
    """Relays the due times other processes publish ("shard:due ms") to `on_nudge`."""

    def __init__(
        self, client: RedisClient, channel: str, on_nudge: Nudge, stop: threading.Event
    ) -> None:
        self.client = client
        self.channel = channel
        self.on_nudge = on_nudge
        self.stop = stop
        self.backoff = Backoff(base=0.5, cap=10.0)

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self._listen()
            except redis.RedisError as e:
                refresh_after(self.client, e)  # a failover: subscribe on a live node
                delay = self.backoff.next()
                log.warning("nudges_paused", error=str(e), retry_in_s=delay)
                self.stop.wait(delay)

    def _listen(self) -> None:
        pubsub = self.client.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]
        try:
            pubsub.subscribe(self.channel)
            self.backoff.reset()
            while not self.stop.is_set():
                message = pubsub.get_message(timeout=0.5)
                nudge = None if message is None else parse_nudge(message["data"])
                if nudge is not None:
                    self.on_nudge(*nudge)
        finally:
            pubsub.close()
