"""A scheduled message arrives on its target topic on time, with its headers."""

from __future__ import annotations

import orjson

from blackbox.service import Service
from tests.integration.conftest import ReaderFactory, ServiceFactory
from tests.kafkatools import envelope, produce, unique


def _intake(service: Service) -> str:
    return service.settings.intake_topic


def test_message_arrives_after_its_countdown_and_not_before(
    start_service: ServiceFactory, reader: ReaderFactory
) -> None:
    """Guarantee 6 (on time): delivered at or after due, soon after, with its headers."""
    service = start_service()
    target = unique("orders")
    bootstrap = service.settings.kafka["bootstrap.servers"]
    produce(bootstrap, _intake(service), [envelope(target, {"order": 1}, 2)],
            headers=[("CALLER_SERVICE", b"billing")])  # fmt: skip

    (record,) = reader(target).wait_count(1, timeout=40)

    assert orjson.loads(record.value or b"") == {"order": 1}
    due_ms = int(record.header("blackbox-due-ms"))
    assert record.received_ms >= due_ms
    assert record.header("CALLER_SERVICE") == "billing"
    assert record.header("blackbox-attempt") == "1"
    assert record.header("blackbox-id").startswith(_intake(service) + ":0:")
