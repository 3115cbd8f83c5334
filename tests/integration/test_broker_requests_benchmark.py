"""benchmarks.brokerrequests: what a real Apache Kafka broker served, read from its own
metrics (attached to its JVM by pid), grows by what a producer sent it."""

from __future__ import annotations

import uuid

from confluent_kafka import Producer

from benchmarks import brokerrequests
from blackbox.dev.servers import KafkaBroker
from blackbox.kafka import clients
from blackbox.settings import Settings

RECORDS = 40
VALUE = b"x" * 500


def test_the_broker_counts_the_requests_and_bytes_a_producer_sent(broker: KafkaBroker) -> None:
    assert broker.process is not None
    topic = f"served-{uuid.uuid4().hex[:8]}"
    clients.ensure_topics(Settings.from_env({"KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap}).kafka,
                          [topic])  # fmt: skip
    before = brokerrequests.counts(broker.process.pid)
    assert before is not None, "the broker's metrics were not read (a JDK is needed)"
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
    for _ in range(RECORDS):
        producer.produce(topic, VALUE)
        assert producer.flush(10) == 0  # one request per record
    after = brokerrequests.counts(broker.process.pid)

    served = brokerrequests.per_message(before, after, RECORDS)
    assert served is not None
    assert served["Produce"] >= 1.0  # each record its own request (others may share the broker)
    assert served["bytes_in"] >= len(VALUE)
    assert "FetchConsumer" not in served  # a part of Fetch, not counted twice
