"""Deliveries that keep failing for a lasting reason end in the dead-letter topic."""

from __future__ import annotations

import orjson
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    ResourceType,
)
from structlog.testing import capture_logs

from blackbox.clock import now_ms
from blackbox.errors import DeadLetterReason
from blackbox.intake.incarnations import tag_of
from blackbox.kafka import clients
from blackbox.schedule import Schedule
from blackbox.settings import Settings
from blackbox.storage.applying import IntakeSlice
from blackbox.storage.connections import redis_client
from blackbox.storage.keys import Layout
from blackbox.storage.store import RedisStore
from tests.integration.conftest import ReaderFactory, ServiceFactory, settle
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
    intake = settings.intake_topic
    topic_id = clients.topic_id_lookup(settings.kafka)([intake])[intake]
    assert dead.header("blackbox-id") == f"{intake}:0:0:{tag_of(topic_id)}"
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
    clients.ensure_topics(settings.kafka, [target])
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


def test_an_expired_or_undecodable_payload_goes_through_the_dispatcher_to_the_dlq(
    start_service: ServiceFactory, reader: ReaderFactory, env: dict[str, str]
) -> None:
    """Guarantee 1: an id due whose payload expired (past due + grace) or cannot be decoded
    is dead-lettered by the dispatcher with its reason, never dropped, never delivered."""
    settings = Settings.from_env(env)
    store = RedisStore(redis_client(settings.redis_url), Layout(settings.namespace), 60)
    target, now = unique("lost"), now_ms()
    seeded = [Schedule(f"seed-{n}", target, b"v", now - 1) for n in range(2)]
    store.apply([IntakeSlice("seed", 0, 1, list(enumerate(seeded)))], now)
    store.client.delete(store.layout.shards[0].payload("seed-0"))  # as its TTL would
    store.client.set(store.layout.shards[0].payload("seed-1"), b"\x07garbled")

    service = start_service()
    dlq = reader(settings.dlq_topic)
    dlq.wait_count(2)
    settle(service)

    dead = {d.header("blackbox-id"): d for d in dlq.read_to_end()}
    assert dead["seed-0"].header("blackbox-dlq-reason") == DeadLetterReason.EXPIRED.value
    assert dead["seed-1"].header("blackbox-dlq-reason") == DeadLetterReason.DELIVERY_FAILED.value
    assert dead["seed-1"].value == b"\x07garbled"  # kept for whoever looks into it
    assert len(dead) == 2
    assert reader(target).read_to_end() == []
    store.client.close()


def _set_max_message_bytes(settings: Settings, topic: str, limit: int) -> None:
    """Change a topic's `max.message.bytes` on the broker."""
    admin = AdminClient(dict(settings.kafka))
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[
        ConfigEntry("max.message.bytes", str(limit),
                    incremental_operation=AlterConfigOpType.SET),
    ])  # fmt: skip
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(15)


def test_a_dead_letter_the_dlq_refuses_stays_pending_and_lands_once_it_is_taken(
    start_service: ServiceFactory, reader: ReaderFactory, env: dict[str, str]
) -> None:
    """Guarantee 1: while the dead-letter topic refuses a dead letter, its message stays in
    Redis and is retried; once the topic takes it, it lands, is answered, and leaves Redis."""
    settings = Settings.from_env(env)
    admin = AdminClient(dict(settings.kafka))
    tiny = NewTopic(settings.dlq_topic, num_partitions=1, config={"max.message.bytes": "64"})
    for future in admin.create_topics([tiny]).values():
        future.result(15)
    service = start_service(
        KAFKA_PRODUCER_ALLOW_AUTO_CREATE_TOPICS="false",
        KAFKA_PRODUCER_TOPIC_METADATA_PROPAGATION_MAX_MS="500",
        BLACKBOX_MAX_ATTEMPTS="1",
        BLACKBOX_RETRY_BACKOFF="0.2",
    )
    missing = unique("missing")
    with capture_logs() as logs:
        produce(env["KAFKA_BOOTSTRAP_SERVERS"], settings.intake_topic, [envelope(missing, "m", 0)])

        def refused_twice() -> bool:
            return sum(1 for e in list(logs) if e["event"] == "dead_letter_failed") >= 2

        wait_until(refused_twice, timeout=30, what="the refused dead letter tried again")
        assert service.store.counts() != (0, 0), "the message must stay in Redis meanwhile"
        _set_max_message_bytes(settings, settings.dlq_topic, 1_048_576)

    (dead,) = reader(settings.dlq_topic).wait_count(1, timeout=30)
    assert dead.header("blackbox-dlq-reason") == DeadLetterReason.UNKNOWN_TOPIC.value
    assert dead.value == b"m"
    settle(service)
    assert service.metrics.value("blackbox_dead_letters_total", {"reason": "unknown_topic"}) == 1
