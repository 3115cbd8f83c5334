"""Deliveries that keep failing for a lasting reason end in the dead-letter topic."""

from __future__ import annotations

import orjson

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
