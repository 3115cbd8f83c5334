"""The intake topic deleted and created again under its name: its records are not skipped."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson
import pytest
import redis
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from blackbox.intake.incarnations import TAG_LENGTH, tag_of
from blackbox.kafka import clients
from blackbox.service import Service
from blackbox.storage.keys import Layout
from tests.integration.conftest import ReaderFactory, ServiceFactory
from tests.kafkatools import Received, envelope, produce, unique, wait_until


def _recreate(service: Service) -> None:
    """Delete the intake topic, wait until the broker no longer lists it, create it again."""
    config, topic = service.settings.kafka, service.settings.intake_topic
    admin = AdminClient(dict(config))
    for future in admin.delete_topics([topic], operation_timeout=10).values():
        future.result(15)
    wait_until(lambda: topic not in admin.list_topics(timeout=5).topics, timeout=30,
               what="the intake topic gone")  # fmt: skip

    def created() -> bool:  # a deletion still settling refuses the creation for a moment
        try:
            clients.ensure_topics(config, [topic])
        except KafkaException:
            return False
        return True

    wait_until(created, timeout=30, what="the intake topic created again")


def _tag(service: Service) -> str:
    """The intake topic's incarnation tag, once the new topic's metadata has spread."""
    lookup, intake = clients.topic_id_lookup(service.settings.kafka), service.settings.intake_topic
    found: list[str] = []

    def known() -> bool:
        try:
            found.append(tag_of(lookup([intake])[intake]))
        except KafkaException:
            return False
        return True

    wait_until(known, timeout=30, what="the intake topic's id")
    return found[-1]


def _values(records: list[Received]) -> list[int]:
    return sorted(orjson.loads(r.value or b"") for r in records)


def test_a_recreated_intake_topic_has_every_record_delivered(
    start_service: ServiceFactory, reader: ReaderFactory
) -> None:
    """Guarantee 1: a topic created again under the intake's name starts its offsets below
    the old watermark; its records are scheduled and delivered, not skipped as re-reads."""
    service = start_service()
    bootstrap, intake = service.settings.kafka["bootstrap.servers"], service.settings.intake_topic
    first, second = unique("before"), unique("after")
    produce(bootstrap, intake, [envelope(first, n, 0) for n in range(20)])
    reader(first).wait_count(20)
    old_tag = _tag(service)

    _recreate(service)
    new_tag = _tag(service)
    produce(bootstrap, intake, [envelope(second, n, 0) for n in range(10)])
    records = reader(second).wait_count(10, timeout=60)

    assert _values(records) == list(range(10))
    assert {r.header("blackbox-id") for r in records} == {
        f"{intake}:0:{n}:{new_tag}" for n in range(10)
    }
    assert old_tag and new_tag and old_tag != new_tag
    assert not service.failed


def test_a_topic_recreated_while_the_service_was_down_has_every_record_delivered(
    start_service: ServiceFactory, reader: ReaderFactory
) -> None:
    """Guarantee 1: a replica starting on a recreated intake topic judges its records
    against the new topic's watermark, not the one the old topic left in Redis."""
    service = start_service()
    bootstrap, intake = service.settings.kafka["bootstrap.servers"], service.settings.intake_topic
    first, second = unique("before"), unique("after")
    produce(bootstrap, intake, [envelope(first, n, 0) for n in range(20)])
    reader(first).wait_count(20)
    service.stop()

    _recreate(service)
    produce(bootstrap, intake, [envelope(second, n, 0) for n in range(10)])
    restarted = start_service()
    records = reader(second).wait_count(10, timeout=60)

    assert _values(records) == list(range(10))
    assert not restarted.failed


class _ZeroIds:
    """The look-up of a broker that gives topics no id: every topic is the zero Uuid."""

    def __init__(self, _config: Mapping[str, Any], timeout: float = 10.0) -> None:
        self.timeout = timeout

    def __call__(self, names: Sequence[str]) -> dict[str, str]:
        return {name: "AAAAAAAAAAAAAAAAAAAAAA" for name in names}

    def close(self) -> None:
        """Nothing to close: it asks no broker."""


def test_a_topic_recreated_on_a_broker_without_topic_ids_has_every_record_delivered(
    start_service: ServiceFactory,
    reader: ReaderFactory,
    redis_client: redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Guarantee 1: where the broker names every topic with the zero id, a recreated intake
    topic's offsets going back are a new incarnation (a tag recorded in Redis for every
    replica), not re-reads: its records are delivered, under ids of their own."""
    monkeypatch.setattr(clients, "topic_id_lookup", _ZeroIds)
    service = start_service()
    bootstrap, intake = service.settings.kafka["bootstrap.servers"], service.settings.intake_topic
    first, second = unique("before"), unique("after")
    produce(bootstrap, intake, [envelope(first, n, 0) for n in range(20)])
    assert {r.header("blackbox-id") for r in reader(first).wait_count(20)} == {
        f"{intake}:0:{n}" for n in range(20)
    }

    _recreate(service)
    produce(bootstrap, intake, [envelope(second, n, 0) for n in range(10)])
    records = reader(second).wait_count(10, timeout=60)

    assert _values(records) == list(range(10))
    recorded = redis_client.hget(Layout(service.settings.namespace).incarnations, intake)
    assert isinstance(recorded, bytes)
    tag = recorded.decode().removeprefix(" ")
    assert tag.startswith("~") and len(tag) == TAG_LENGTH
    assert {r.header("blackbox-id") for r in records} == {
        f"{intake}:0:{n}:{tag}" for n in range(10)
    }
    assert not service.failed
