"""Kafka clients end with what opened them: a client left open after its broker stopped logs
a "Connection refused" line per reconnect until its process exits (the session's broker
fixture fails a passing session that leaves one; see conftest.py)."""

from __future__ import annotations

from tests.integration.conftest import ServiceFactory
from tests.kafkatools import holders, open_clients, wait_until


def test_a_stopped_service_leaves_no_kafka_client_open(start_service: ServiceFactory) -> None:
    """A stopped service has closed every Kafka client it opened (the firing and answers
    producers, the intake consumer, the API's producer, consumers and topic-id look-ups),
    although something may still hold the service: FastAPI keeps its routes' functions, and
    with them the service, for the life of the process. Stopping it again does nothing."""
    before = {id(client) for client in open_clients()}
    service = start_service()
    wait_until(lambda: service.health.ready, 30, "the service ready")

    service.stop()
    service.stop()

    left = [client for client in open_clients() if id(client) not in before]
    assert left == [], [f"{type(c).__name__} held by {holders(c)}" for c in left]
