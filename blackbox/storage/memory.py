"""Redis memory: the eviction policy checked at start, and the room left for intake.

A payload evicted by Redis is a schedule lost, so the service refuses to start on a Redis
whose `maxmemory-policy` is not `noeviction` unless BLACKBOX_ACCEPT_EVICTION says the risk
is accepted. A Redis over `maxmemory` refuses the intake script (it waits, unread records
stay in the intake topic) while the firing scripts still run and free it: the readiness
probe reports it `full` until it has room again, and exports its memory and what is
pending.
"""

from __future__ import annotations

from typing import Any

import redis
import structlog

from blackbox.errors import EvictingRedis, RedisFull
from blackbox.metrics import Metrics
from blackbox.storage import scripts
from blackbox.storage.connections import RedisClient, primaries, refresh_after
from blackbox.storage.keys import Layout
from blackbox.storage.store import pending_counts

log = structlog.get_logger("blackbox.storage.memory")

SAFE_POLICY = "noeviction"
POLICY = "maxmemory-policy"


def eviction_policy(client: redis.Redis) -> str | None:
    """Redis's `maxmemory-policy`, or None where CONFIG is renamed away or not allowed
    (managed Redis); logs a warning then."""
    try:
        policy = client.config_get(POLICY).get(POLICY)
    except redis.ResponseError as e:
        log.warning("eviction_policy_unknown", error=str(e), setting=POLICY, needed=SAFE_POLICY)
        return None
    if policy is None:
        log.warning("eviction_policy_unknown", error="not reported", setting=POLICY,
                    needed=SAFE_POLICY)  # fmt: skip
    return None if policy is None else str(policy)


def check_eviction(client: RedisClient, accept: bool) -> None:
    """Raise EvictingRedis if Redis (any master of a cluster) may evict keys, unless
    `accept`; log what was found."""
    policies = {eviction_policy(node) for node in primaries(client)} - {None, SAFE_POLICY}
    if not policies:
        return
    policy = ", ".join(sorted(p for p in policies if p is not None))
    if accept:
        log.warning("eviction_accepted", setting=POLICY, policy=policy)
        return
    raise EvictingRedis(
        f"Redis {POLICY} is {policy}: under memory pressure it deletes keys, and a deleted "
        f"payload is a lost schedule. Set it to {SAFE_POLICY} (CONFIG SET {POLICY} "
        f"{SAFE_POLICY}, and in redis.conf or your provider's parameter group), or set "
        "BLACKBOX_ACCEPT_EVICTION=true to run with that risk."
    )


class Room:
    """Whether Redis has room for intake, and the gauges of its memory and of what is
    pending. Redis's probe in the readiness check."""

    def __init__(self, client: RedisClient, layout: Layout, metrics: Metrics) -> None:
        self.client = client
        self.layout = layout
        self.metrics = metrics
        text = scripts.source("room")
        self._room = client.register_script(text)
        self.intake_waiting = False  # intake's last write was refused for memory

    def _memory(self) -> tuple[int, int]:
        """Used and maximum memory in bytes, summed over the masters."""
        used, most = 0, 0
        for node in primaries(self.client):
            memory: Any = node.info("memory")
            used, most = used + int(memory["used_memory"]), most + int(memory["maxmemory"])
        return used, most

    def intake_refused(self, refused: bool) -> None:
        """Intake's last write was refused for memory (True), or went through (False)."""
        self.intake_waiting = refused

    def probe(self) -> None:
        """Export Redis's memory (summed over a cluster's masters) and the pending counts;
        raise RedisFull if a Redis node has no room for intake (a write would be refused),
        or intake's last write was refused."""
        try:
            used, most = self._memory()
        except redis.RedisError as e:
            refresh_after(self.client, e)  # a failover: the next probe asks the new master
            raise
        due, in_flight = pending_counts(self.client, self.layout)
        self.metrics.redis_used_memory.set(used)
        self.metrics.redis_maxmemory.set(most)
        self.metrics.pending.labels(state="due").set(due)
        self.metrics.pending.labels(state="in_flight").set(in_flight)
        try:
            for key in _one_key_per_node(self.client, self.layout):
                self._room(keys=[key])
        except redis.exceptions.OutOfMemoryError as e:
            self.metrics.redis_full.set(1)
            raise RedisFull(str(e)) from e
        self.metrics.redis_full.set(1 if self.intake_waiting else 0)
        if self.intake_waiting:
            raise RedisFull("intake's last write was refused for memory")


def _one_key_per_node(client: RedisClient, layout: Layout) -> list[str]:
    """A due key on each Redis node holding shards: the room script's routes."""
    if not isinstance(client, redis.RedisCluster):
        return [layout.shards[0].due]
    by_node: dict[str, str] = {}
    for keys in layout.shards:
        node = client.get_node_from_key(keys.due)  # type: ignore[no-untyped-call]
        by_node.setdefault(node.name, keys.due)
    return list(by_node.values())
