"""Deliveries that keep failing for a lasting reason end in the dead-letter topic."""

from __future__ import annotations

import orjson

from blackbox import kafka
from blackbox.errors import DeadLetterReason
from tests.integration.conftest import ReaderFactory, ServiceFactory
from tests.kafkatools import envelope, produce, unique, wait_until


def test_record_too_large_for_the_broker_is_dead_lettered_after_its_attempts(
    start_service: ServiceFactory, reader: ReaderFactory
) -> None:
    """Guarantee 1: an undeliverable message reaches the DLQ with its reason; others flow on."""
    service = start_service(
        KAFKA_PRODUCER_MESSAGE_MAX_BYTES="2000",
        BLACKBOX_MAX_ATTEMPTS="3",
        BLACKBOX_RETRY_BACKOFF="0.1",
    )
    settings = service.settings
    target = unique("limited")
    values = [envelope(target, "x" * 5000, 0), envelope(target, {"small": True}, 0)]
    produce(settings.kafka["bootstrap.servers"], settings.intake_topic, values)

    (small,) = reader(target).wait_count(1)
    (dead,) = reader(settings.dlq_topic).wait_count(1)

    assert orjson.loads(small.value or b"") == {"small": True}
    assert dead.header("blackbox-dlq-reason") == DeadLetterReason.RECORD_TOO_LARGE.value
    assert dead.header("blackbox-id") == f"{settings.intake_topic}:0:0"
    assert dead.header("blackbox-target-topic") == target
    assert "after 3 attempts" in dead.header("blackbox-dlq-detail")
    # The value is too large for the dead-letter topic as well: left out, and said so.
    assert dead.value is None
    assert dead.header("blackbox-dlq-value-omitted") == "5000 bytes"
    failures = {"kind": "lasting"}
    assert service.metrics.value("blackbox_delivery_failures_total", failures) == 3
    wait_until(lambda: service.store.counts() == (0, 0), what="nothing left pending")


def test_a_target_topic_that_does_not_exist_is_dead_lettered_and_answered(
    start_service: ServiceFactory, reader: ReaderFactory
) -> None:
    """A missing topic (auto-creation off) ends as unknown_topic; the others are not held up."""
    service = start_service(
        KAFKA_PRODUCER_ALLOW_AUTO_CREATE_TOPICS="false",
        KAFKA_PRODUCER_TOPIC_METADATA_PROPAGATION_MAX_MS="500",
        BLACKBOX_MAX_ATTEMPTS="2",
        BLACKBOX_RETRY_BACKOFF="0.2",
    )
    settings = service.settings
    missing, target = unique("missing"), unique("present")
    kafka.ensure_topics(settings.kafka, [target])
    missing_one = orjson.dumps({"topic": missing, "message": "lost?", "countdown": 0, "id": "m1"})
    values = [missing_one, *(envelope(target, n, 0) for n in range(20))]
    produce(settings.kafka["bootstrap.servers"], settings.intake_topic, values)

    delivered = reader(target).wait_count(20)
    (dead,) = reader(settings.dlq_topic).wait_count(1, timeout=30)
    events = reader(settings.events_topic).wait_for(
        lambda records: any(b'"dead_lettered"' in (r.value or b"") for r in records)
    )

    assert sorted(orjson.loads(r.value or b"") for r in delivered) == list(range(20))
    assert min(r.received_ms for r in delivered) < dead.received_ms
    assert dead.header("blackbox-dlq-reason") == DeadLetterReason.UNKNOWN_TOPIC.value
    assert dead.header("blackbox-target-topic") == missing
    assert dead.value == b"lost?"
    (answer,) = [
        orjson.loads(r.value or b"") for r in events if b"dead_lettered" in (r.value or b"")
    ]
    assert (answer["id"], answer["reason"], answer["topic"]) == ("m1", "unknown_topic", missing)
    wait_until(lambda: service.store.counts() == (0, 0), what="nothing left pending")
