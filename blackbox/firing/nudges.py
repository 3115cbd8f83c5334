"""Nudges: how whatever stores a schedule tells the firers that a shard has something due.

In one process, intake and the API call the firing part's `nudge` directly (a `Nudge`). To
the other processes a nudge is published on the namespace's wake channel in Redis as
"shard:due ms"; each firing process listens and wakes its waker when that shard is its own.
A publisher publishes a due time only if it is sooner than the last it published for the
shard and still ahead, and a lost nudge costs at most one poll interval: the safety-net tick
fires what no nudge announced.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import redis
import structlog

from blackbox.backoff import Backoff
from blackbox.clock import now_ms
from blackbox.storage.connections import RedisClient, refresh_after

log = structlog.get_logger("blackbox.firing.nudges")

# Something stored in a shard is due at a time: (shard, due ms). Intake and the API tell
# the firers through one of these.
Nudge = Callable[[int, int], None]


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


class Announcements:
    """The due times this process published, per shard: one is published only if it is
    sooner than the last still ahead. The shard's firer, woken for that one, learns the
    shard's next due time from its claim, so a steady stream of later messages costs no
    publish each (and a lost one is found by the safety-net tick)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ahead: dict[int, int] = {}

    def forget(self, shard: int) -> None:
        """Publishing `shard`'s last due time failed: the next one is published again."""
        with self._lock:
            self._ahead.pop(shard, None)

    def worth_publishing(self, shard: int, due_ms: int, now_ms: int) -> bool:
        """True (and remembered) if `due_ms` must be published for `shard`."""
        with self._lock:
            last = self._ahead.get(shard)
            if last is not None and now_ms < last <= due_ms:
                return False
            self._ahead[shard] = due_ms
            return True


class Publisher:
    """Publishes a shard's due time to the other processes, when it is worth it."""

    def __init__(self, client: RedisClient, channel: str) -> None:
        self.client = client
        self.channel = channel
        self._announced = Announcements()

    def publish(self, shard: int, due_ms: int) -> None:
        """Tell the process firing `shard` that something there is due at `due_ms`."""
        if not self._announced.worth_publishing(shard, due_ms, now_ms()):
            return
        try:
            self.client.publish(self.channel, nudge_message(shard, due_ms))
        except redis.RedisError as e:  # the poll interval still fires it elsewhere
            self._announced.forget(shard)
            log.info("nudge_not_published", error=str(e))
