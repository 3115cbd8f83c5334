"""Scheduled messages arrive on their target topics on time, with their headers."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import orjson

from blackbox import kafka
from blackbox.incarnations import tag_of
from blackbox.keys import Keys
from blackbox.service import Service
from blackbox.store import RedisStore
from tests.integration.conftest import ReaderFactory, ServiceFactory
from tests.kafkatools import envelope, produce, unique, wait_until
from tests.process import BlackboxProcess


def _bootstrap(service: Service) -> str:
    return service.settings.kafka["bootstrap.servers"]


def test_message_arrives_after_its_countdown_and_not_before(
    start_service: ServiceFactory, reader: ReaderFactory
) -> None:
    """Guarantee 6: delivered no earlier than due, with value, caller and blackbox headers."""
    service = start_service()
    target = unique("orders")
    caller = [("CALLER_SERVICE", b"billing")]
    produce(_bootstrap(service), service.settings.intake_topic,
            [envelope(target, {"order": 1}, 6)], headers=caller)  # fmt: skip

    (record,) = reader(target).wait_count(1, timeout=40)

    assert orjson.loads(record.value or b"") == {"order": 1}
    due_ms = int(record.header("blackbox-due-ms"))
    assert record.received_ms >= due_ms
    assert record.header("CALLER_SERVICE") == "billing"
    assert record.header("blackbox-attempt") == "1"
    intake = service.settings.intake_topic
    topic_id = kafka.topic_id_lookup(service.settings.kafka)([intake])[intake]
    assert record.header("blackbox-id") == f"{intake}:0:0:{tag_of(topic_id)}"
    assert service.metrics.value("blackbox_lateness_seconds_count") == 1
    assert service.metrics.value("blackbox_send_lateness_seconds_count") == 1
    sent_late = service.metrics.value("blackbox_send_lateness_seconds_sum")
    assert sent_late <= service.metrics.value("blackbox_lateness_seconds_sum")


def test_string_message_is_delivered_as_its_text(
    start_service: ServiceFactory, reader: ReaderFactory
) -> None:
    """A JSON string message is delivered as its UTF-8 text, not as a JSON string."""
    service = start_service()
    target = unique("texts")
    produce(_bootstrap(service), service.settings.intake_topic, [envelope(target, "héllo", 0)])

    (record,) = reader(target).wait_count(1)

    assert record.value == "héllo".encode()


def test_a_thousand_messages_with_mixed_countdowns_arrive_exactly_once(
    start_service: ServiceFactory, reader: ReaderFactory
) -> None:
    """Guarantee 2: in normal operation every message is delivered, and only once."""
    service = start_service()
    target = unique("mixed")
    rng = random.Random(7)
    values = [envelope(target, {"n": n}, rng.uniform(0, 4)) for n in range(1000)]
    produce(_bootstrap(service), service.settings.intake_topic, values)
    store = RedisStore(service.redis, Keys(service.settings.namespace), 60)

    target_reader = reader(target)
    target_reader.wait_count(1000, timeout=60)
    wait_until(lambda: store.counts() == (0, 0), what="nothing pending")
    records = target_reader.read_to_end()  # a late second copy would be read too

    ids = Counter(r.header("blackbox-id") for r in records)
    assert len(records) == 1000
    assert max(ids.values()) == 1
    assert sorted(orjson.loads(r.value or b"")["n"] for r in records) == list(range(1000))
    assert all(r.received_ms >= int(r.header("blackbox-due-ms")) for r in records)


def test_blackbox_send_schedules_through_the_intake_topic(
    start_service: ServiceFactory, reader: ReaderFactory, env: dict[str, str], tmp_path: Path
) -> None:
    """`blackbox send` builds the envelope and the caller header; the service delivers it."""
    service = start_service()
    target = unique("cli")
    sender = BlackboxProcess(env, tmp_path / "send.log", "send", "--topic", target,
                             "--countdown", "1", "--caller", "billing", '{"order": 1}')  # fmt: skip
    assert sender.wait() == 0, sender.output()

    (record,) = reader(target).wait_count(1)

    assert orjson.loads(record.value or b"") == {"order": 1}
    assert record.header("CALLER_SERVICE") == "billing"
    assert service.metrics.value("blackbox_delivered_total") == 1


def test_firing_does_not_wait_for_the_poll_interval(
    start_service: ServiceFactory, reader: ReaderFactory
) -> None:
    """Guarantee 6: a message fires at its due instant, not at the next 30 s poll."""
    service = start_service(BLACKBOX_POLL_INTERVAL="30")
    bootstrap, intake = _bootstrap(service), service.settings.intake_topic
    warm, target = unique("warm"), unique("prompt")
    produce(bootstrap, intake, [envelope(warm, 0, 0)])
    reader(warm).wait_count(1)  # intake is assigned, and the first tick has run

    produce(bootstrap, intake, [envelope(target, 1, 2)])
    (record,) = reader(target).wait_count(1, timeout=20)

    assert record.received_ms >= int(record.header("blackbox-due-ms"))
