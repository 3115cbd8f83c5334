"""Several replicas against one Redis: no id fired twice, a dead replica's ids recovered."""

from __future__ import annotations

import time
from collections import Counter

import orjson
import pytest

from blackbox.clock import now_ms
from blackbox.firing import shares
from blackbox.kafka import clients
from blackbox.schedule import Schedule
from blackbox.settings import Settings
from blackbox.storage import shardcount
from blackbox.storage.applying import IntakeSlice
from blackbox.storage.connections import redis_client
from blackbox.storage.keys import Layout
from blackbox.storage.store import RedisStore
from tests.integration.conftest import ReaderFactory, ServiceFactory
from tests.kafkatools import envelope, produce, unique, wait_until


def test_two_replicas_never_deliver_one_id_twice(
    start_service: ServiceFactory, reader: ReaderFactory, env: dict[str, str]
) -> None:
    """Guarantee 3: two healthy replicas sharing Redis and intake deliver each id once,
    each firing its share of the shards."""
    settings = Settings.from_env(env)
    clients.ensure_topics(settings.kafka, [settings.intake_topic], partitions=2)
    first, second = (
        start_service(BLACKBOX_BATCH_LIMIT="50", BLACKBOX_SHARDS="4"),
        start_service(BLACKBOX_BATCH_LIMIT="50", BLACKBOX_SHARDS="4"),
    )
    share = first.firing.share if first.firing is not None else None
    wait_until(lambda: share is not None and share.members == 2, what="both in the share")
    target = unique("shared")
    values = [envelope(target, {"n": n}, 3) for n in range(2000)]
    produce(settings.kafka["bootstrap.servers"], settings.intake_topic, values)

    target_reader = reader(target)
    target_reader.wait_count(2000, timeout=60)
    wait_until(lambda: first.store.counts() == (0, 0), what="nothing pending")
    records = target_reader.read_to_end()  # a late second copy would be read too

    ids = Counter(r.header("blackbox-id") for r in records)
    delivered = [s.metrics.value("blackbox_delivered_total") for s in (first, second)]
    assert len(records) == len(ids) == 2000
    assert sum(delivered) == 2000, delivered
    assert min(delivered) > 0, delivered  # both replicas fired: the test shares the work


def test_a_dead_replicas_in_flight_ids_are_delivered_after_the_lease(
    start_service: ServiceFactory, reader: ReaderFactory, env: dict[str, str]
) -> None:
    """Guarantee 3: ids claimed by a replica that died return to due when its lease ends."""
    settings = Settings.from_env(env)
    store = RedisStore(redis_client(settings.redis_url), Layout(settings.namespace), 60)
    shardcount.Guard(store.client, store.layout, "seed").settle(now_ms())  # 1 shard, as seeded
    target = unique("orphans")
    now = now_ms()
    schedules = [Schedule(f"orphan-{n}", target, orjson.dumps(n), now) for n in range(20)]
    store.apply([IntakeSlice("seed", 0, 19, list(enumerate(schedules)))], now)
    # The dead replica: it claimed everything with a 2 s lease and never acked.
    claim = store.claim_due(now_ms(), 100, lease_ms=2000)
    assert len(claim.ids) == 20

    service = start_service()
    target_reader = reader(target)
    target_reader.wait_count(20, timeout=30)
    wait_until(lambda: service.store.counts() == (0, 0), what="nothing pending")
    records = target_reader.read_to_end()

    assert sorted(r.header("blackbox-id") for r in records) == sorted(s.id for s in schedules)
    assert len(records) == 20
    assert all(r.received_ms >= claim.token for r in records)
    assert {r.header("blackbox-attempt") for r in records} == {"2"}
    assert store.counts() == (0, 0)


def test_a_replica_draining_a_long_burst_keeps_its_heartbeat(
    start_service: ServiceFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Guarantee 3 with shares: a replica busy firing a burst that takes longer than a
    heartbeat lives still renews its heartbeat every poll interval, so the other replicas
    never count it dead and take its shards (every replica hammering every shard at the end
    of a burst)."""
    monkeypatch.setattr(shares, "MIN_TTL_MS", 1_500)  # heartbeats of 1.5 s: a short burst
    service = start_service(BLACKBOX_SHARDS="2", BLACKBOX_BATCH_LIMIT="10")
    assert service.firing is not None
    name, members = service.firing.share.name, service.store.layout.members
    target, count = unique("burst"), 20_000
    due = now_ms() + 500
    items = [(n, Schedule(f"burst-{n}", target, b"v", due)) for n in range(count)]
    service.store.apply([IntakeSlice("seed", 0, count - 1, list(items))], now_ms())
    lapsed: list[int] = []
    clock_ages: list[float] = []

    def drained() -> bool:
        expiry = service.redis.zscore(members, name)
        if expiry is None or expiry < now_ms():
            lapsed.append(now_ms())
        clock_ages.append(time.monotonic() - service.health._last_beat)
        return service.store.counts() == (0, 0)

    wait_until(drained, 60, "the burst drained")
    drain_ms = now_ms() - due
    assert drain_ms > shares.MIN_TTL_MS, f"drained in {drain_ms} ms: no longer than a heartbeat"
    assert lapsed == [], f"the heartbeat ran out {len(lapsed)} times in a {drain_ms} ms drain"
    # The liveness clock goes on too (a burst longer than its stall limit must not make
    # /live fail): it was never older than a few poll intervals.
    assert max(clock_ages) < 1.0, f"liveness clock {max(clock_ages):.2f} s old mid-burst"
