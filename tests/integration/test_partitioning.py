"""Every producer blackbox ships puts a keyed record on the partition Java's default
partitioner would: a schedule sent one way and its cancel sent another share a partition."""

from __future__ import annotations

from blackbox.client import Client
from blackbox.kafka import clients
from blackbox.kafka.clients import java_partition
from blackbox.settings import Settings
from tests.integration.conftest import service_env
from tests.kafkatools import TopicReader, unique

PARTITIONS = 6


def _partitions_by_key(bootstrap: str, topic: str, count: int) -> dict[bytes | None, int]:
    reader = TopicReader(bootstrap, topic)
    try:
        return {r.key: r.partition for r in reader.wait_count(count)}
    finally:
        reader.close()


def test_the_client_and_the_services_producers_partition_keys_as_java_does(
    env: dict[str, str],
) -> None:
    """Guarantee 7: the Python client (and `blackbox send`) and the service's own producer
    (the API's creates, cancels and reschedules) key records to murmur2's partition, the one
    Spark's connector and every Java producer choose, on a 6-partition intake topic."""
    settings = Settings.from_env(service_env(env["REDIS_URL"], env["KAFKA_BOOTSTRAP_SERVERS"]))
    bootstrap = settings.kafka["bootstrap.servers"]
    by_client, by_service = unique("client"), unique("service")
    clients.ensure_topics(settings.kafka, [by_client, by_service], partitions=PARTITIONS)
    ids = [f"order-{n}" for n in range(60)] + ["é✓-id", "x"]
    with Client({"bootstrap.servers": bootstrap}, caller="billing", intake_topic=by_client) as c:
        for schedule_id in ids:
            c.cancel(schedule_id)
    producer = clients.new_producer(settings)
    for schedule_id in ids:
        producer.produce(by_service, b"{}", schedule_id.encode())
    assert producer.flush(30) == 0

    expected: dict[bytes | None, int] = {
        i.encode(): java_partition(i.encode(), PARTITIONS) for i in ids
    }
    assert len(set(expected.values())) == PARTITIONS  # the ids do spread over every partition
    assert _partitions_by_key(bootstrap, by_client, len(ids)) == expected
    assert _partitions_by_key(bootstrap, by_service, len(ids)) == expected
