"""Restating: the store topic told again what Redis holds of a caller's id stored anew just
after its last version ended.

Firing writes the tombstone of a version it delivered behind Redis's ack, without waiting
for it (kafka/storetopic.py); intake writes a new version of the same id ahead of Redis. A
new version that comes in the moments between the two may land in the store before that
tombstone: the store would then hold the id ended while Redis holds it pending, and a
rebuild after a Redis loss would miss it.

So intake.lua notes in its shard's restate set each caller's id it stores while removing
the id's ended-marker (the mark every ended caller's id keeps), with the instant and the
intake partition. The intake owning that partition writes what Redis then holds of the id
(a version, or a tombstone if it ended since, as `Keeping.after` does) once the tombstone
must have landed or failed: the producer's delivery timeout, and a margin, after the note.
It runs between polls on the intake's thread, after every write of that partition's
requests before it, so no version of the id that intake writes can land after it. A note
of a partition nobody owns any more (its topic deleted) is taken by any intake once
STALE_MS old. Costs one ZRANGE per shard every CHECK_SECONDS, and a store write per id
created anew within moments of its end.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Collection

import redis
import structlog
from confluent_kafka import KafkaException

from blackbox.intake.keeping import Keeping
from blackbox.kafka.storetopic import StoreUnavailable
from blackbox.storage.store import RedisStore

log = structlog.get_logger("blackbox.intake.restating")

# How often the restate sets are looked at, seconds.
CHECK_SECONDS = 5.0
# Added to the delivery timeout: a tombstone handed to the producer has landed or failed
# by then.
MARGIN_MS = 5_000
# A note this old is taken by any intake: its partition's owner would have taken it.
STALE_MS = 600_000
# The most notes taken from a shard at a time.
BATCH = 500

# The notes of a restate set noted `ARGV[1]` ms or longer ago by Redis's clock (the one
# intake.lua scored them by, not this replica's), up to ARGV[2], with Redis's now.
_DUE = """
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
return {now, redis.call('ZRANGE', KEYS[1], '-inf', now - tonumber(ARGV[1]), 'BYSCORE',
                        'LIMIT', 0, ARGV[2], 'WITHSCORES')}
"""
# Remove the notes taken, each only where its score is still the one read: a note the
# owner made again meanwhile (the id stored anew once more) stays for its own turn.
_FORGET = """
local removed = 0
for i = 1, #ARGV, 2 do
  local score = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if score and tonumber(score) == tonumber(ARGV[i + 1]) then
    removed = removed + redis.call('ZREM', KEYS[1], ARGV[i])
  end
end
return removed
"""

Partition = tuple[str, int]


def partition_of(field: str) -> Partition | None:
    """The intake partition of a watermark field ("topic:partition[:incarnation]")."""
    parts = field.split(":")
    if len(parts) < 2 or not parts[1].isdigit():
        return None
    return (parts[0], int(parts[1]))


class Restating:
    """The restate notes of one intake, written to the store topic when due."""

    def __init__(self, store: RedisStore, keeping: Keeping, delivery_timeout_s: float) -> None:
        self.store = store
        self.keeping = keeping
        self.wait_ms = int(delivery_timeout_s * 1000) + MARGIN_MS
        self._next_check = 0.0
        self._due = store.client.register_script(_DUE)
        self._forget = store.client.register_script(_FORGET)
        store.intake.restating = True  # intake.lua notes them from now on

    def run(self, owned: Collection[Partition], stop: threading.Event) -> int:
        """Restate the notes of `owned` partitions old enough, every CHECK_SECONDS; how
        many ids were restated. A failure leaves them for the next time."""
        now = time.monotonic()
        if now < self._next_check:
            return 0
        self._next_check = now + CHECK_SECONDS
        try:
            shards = self.store.layout.shards
            return sum(self._restate(keys.restate, owned, stop) for keys in shards)
        except (redis.RedisError, KafkaException, StoreUnavailable) as e:
            log.warning("store_restate_failed", error=str(e), retry_in_s=CHECK_SECONDS)
            return 0

    def _restate(self, key: str, owned: Collection[Partition], stop: threading.Event) -> int:
        at, flat = self._due(keys=[key], args=[self.wait_ms, BATCH])
        taken: list[bytes | int] = []
        ids: list[str] = []
        for member, score in zip(flat[::2], flat[1::2], strict=True):
            field, _, schedule_id = member.decode("utf-8").partition("|")
            if partition_of(field) in owned or int(at) - int(score) > STALE_MS:
                taken += [member, int(score)]
                ids.append(schedule_id)
        if not ids:
            return 0
        self.keeping.restate(sorted(set(ids)), stop)
        self._forget(keys=[key], args=taken)
        log.info("store_restated", ids=len(ids))
        return len(ids)
