"""Scheduled messages arrive on their target topics on time, with their headers."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import orjson

from blackbox.intake.incarnations import tag_of
from blackbox.kafka import clients
from blackbox.service import Service
from tests.integration.conftest import ReaderFactory, ServiceFactory
from tests.kafkatools import assert_on_time, envelope, now_ms, produce, unique, wait_until
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
    sent_ms = now_ms()
    produce(_bootstrap(service), service.settings.intake_topic,
            [envelope(target, {"order": 1}, 6)], headers=caller)  # fmt: skip
    acked_ms = now_ms()

    (record,) = reader(target).wait_count(1, timeout=40)

    assert orjson.loads(record.value or b"") == {"order": 1}
    due_ms = int(record.header("blackbox-due-ms"))
    assert sent_ms + 6000 - 1 <= due_ms <= acked_ms + 6000  # what the sender asked for
    assert_on_time(record, sent_ms + 6000)
    assert record.header("CALLER_SERVICE") == "billing"
    assert record.header("blackbox-attempt") == "1"
    intake = service.settings.intake_topic
    topic_id = clients.topic_id_lookup(service.settings.kafka)([intake])[intake]
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
    countdowns = [rng.uniform(0, 4) for _ in range(1000)]
    values = [envelope(target, {"n": n}, c) for n, c in enumerate(countdowns)]
    sent_ms = now_ms()
    produce(_bootstrap(service), service.settings.intake_topic, values)
    store = service.store

    target_reader = reader(target)
    target_reader.wait_count(1000, timeout=60)
    wait_until(lambda: store.counts() == (0, 0), what="nothing pending")
    records = target_reader.read_to_end()  # a late second copy would be read too

    ids = Counter(r.header("blackbox-id") for r in records)
    assert len(records) == 1000
    assert max(ids.values()) == 1
    assert sorted(orjson.loads(r.value or b"")["n"] for r in records) == list(range(1000))
    for r in records:
        assert_on_time(r, sent_ms + countdowns[orjson.loads(r.value or b"")["n"]] * 1000)


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
    # The lease outlasts the delivery timeout and the sweep delay (2 poll intervals).
    service = start_service(BLACKBOX_POLL_INTERVAL="30", BLACKBOX_LEASE_SECONDS="80")
    bootstrap, intake = _bootstrap(service), service.settings.intake_topic
    warm, target = unique("warm"), unique("prompt")
    produce(bootstrap, intake, [envelope(warm, 0, 0)])
    reader(warm).wait_count(1)  # intake is assigned, and the first tick has run

    sent_ms = now_ms()
    produce(bootstrap, intake, [envelope(target, 1, 2)])
    (record,) = reader(target).wait_count(1, timeout=20)

    assert_on_time(record, sent_ms + 2000)


def test_a_countdown_runs_from_the_records_timestamp_not_from_when_it_is_read(
    start_service: ServiceFactory, reader: ReaderFactory
) -> None:
    """A record read late (after downtime) fires when its sender meant: send time + countdown,
    the send time being the record's timestamp, not the moment intake reads it."""
    service = start_service()
    target = unique("downtime")
    sent_ms = int(now_ms()) - 20_000  # as if blackbox had been down for 20 s
    produce(_bootstrap(service), service.settings.intake_topic,
            [envelope(target, "overdue", 5), envelope(target, "pending", 25)],
            timestamp_ms=sent_ms)  # fmt: skip

    records = {r.value: r for r in reader(target).wait_count(2, timeout=30)}

    assert int(records[b"overdue"].header("blackbox-due-ms")) == sent_ms + 5_000
    assert int(records[b"pending"].header("blackbox-due-ms")) == sent_ms + 25_000
    assert records[b"overdue"].received_ms < sent_ms + 25_000  # at once, not 5 s after the read
    assert_on_time(records[b"pending"], sent_ms + 25_000)  # 5 s after the send, not 25 s
