"""Several replicas against one Redis: no id fired twice, a dead replica's ids recovered."""

from __future__ import annotations

from collections import Counter

import orjson

from blackbox import kafka, layout
from blackbox.clock import now_ms
from blackbox.connections import redis_client
from blackbox.keys import Layout
from blackbox.schedule import Schedule
from blackbox.settings import Settings
from blackbox.store import IntakeSlice, RedisStore
from tests.integration.conftest import ReaderFactory, ServiceFactory
from tests.kafkatools import envelope, produce, unique, wait_until


def test_two_replicas_never_deliver_one_id_twice(
    start_service: ServiceFactory, reader: ReaderFactory, env: dict[str, str]
) -> None:
    """Guarantee 3: two healthy replicas sharing Redis and intake deliver each id once,
    each firing its share of the shards."""
    settings = Settings.from_env(env)
    kafka.ensure_topics(settings.kafka, [settings.intake_topic], partitions=2)
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
    layout.settle(store.client, store.layout, now_ms())
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
