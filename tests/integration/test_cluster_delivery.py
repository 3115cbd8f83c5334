"""blackbox on a real three-master Redis Cluster: shards on every master, and every message
delivered once."""

from __future__ import annotations

from collections import Counter

from blackbox import connections
from blackbox.localstack import RedisCluster
from blackbox.settings import Settings
from tests.integration.conftest import ReaderFactory, ServiceFactory
from tests.kafkatools import envelope, produce, unique, wait_until


def test_a_service_on_redis_cluster_spreads_shards_over_masters_and_delivers_all(
    redis_cluster: RedisCluster,
    start_service: ServiceFactory,
    reader: ReaderFactory,
) -> None:
    """Scale: with `redis+cluster://` and six shards the messages land on all three
    masters (each script in one slot), and each is delivered once."""
    service = start_service(REDIS_URL=redis_cluster.url, BLACKBOX_SHARDS="6")
    settings: Settings = service.settings
    target = unique("clustered")
    produce(settings.kafka["bootstrap.servers"], settings.intake_topic,
            [envelope(target, {"n": n}, 3) for n in range(600)])  # fmt: skip

    client = connections.redis_client(redis_cluster.url)
    wait_until(lambda: sum(service.store.counts()) == 600, what="600 pending")
    per_master = [int(node.dbsize()) for node in connections.primaries(client)]
    assert len(per_master) == 3 and min(per_master) > 100, per_master

    target_reader = reader(target)
    target_reader.wait_count(600, timeout=60)
    wait_until(lambda: service.store.counts() == (0, 0), what="nothing pending")
    records = target_reader.read_to_end()
    ids = Counter(r.header("blackbox-id") for r in records)
    assert len(records) == len(ids) == 600
    client.close()
