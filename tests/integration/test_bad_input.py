"""Bad intake records go to the dead-letter topic with a reason, and intake goes on."""

from __future__ import annotations

import orjson
from confluent_kafka import Consumer, TopicPartition

from blackbox.errors import DeadLetterReason
from blackbox.intake.loop import PART_RECORDS
from blackbox.kafka import clients
from blackbox.service import Service
from blackbox.settings import Settings
from tests.integration.conftest import (
    ReaderFactory,
    ServiceFactory,
    assert_none_crashed,
    settle,
)
from tests.kafkatools import end_offset, envelope, produce, unique, wait_until

BAD = [
    (b"{not json", DeadLetterReason.INVALID_JSON),
    (b"[1, 2]", DeadLetterReason.NOT_AN_OBJECT),
    (orjson.dumps({"topic": "t", "message": 1}), DeadLetterReason.MISSING_FIELD),
    (orjson.dumps({"topic": "t", "message": 1, "countdown": -5}),
     DeadLetterReason.INVALID_COUNTDOWN),
    (orjson.dumps({"topic": "t", "message": 1, "countdown": "5"}), DeadLetterReason.WRONG_TYPE),
    (orjson.dumps({"topic": "bad topic!", "message": 1, "countdown": 1}),
     DeadLetterReason.INVALID_TOPIC),
    (orjson.dumps({"topic": "__consumer_offsets", "message": 1, "countdown": 1}),
     DeadLetterReason.FORBIDDEN_TOPIC),
    (b"\xff\xfe\x00garbage", DeadLetterReason.INVALID_JSON),
    (None, DeadLetterReason.EMPTY_VALUE),
    (b"x" * 3000, DeadLetterReason.OVERSIZED),
    (b'{"topic":"t","countdown":1,"message":' + b"[" * 300 + b"]" * 300 + b"}",
     DeadLetterReason.INVALID_JSON),  # readable, but too deep to write back out
]  # fmt: skip


def _committed(bootstrap: str, group: str, topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        (position,) = consumer.committed([TopicPartition(topic, 0)], timeout=5)
        return position.offset
    finally:
        consumer.close()


def test_bad_records_are_dead_lettered_with_reason_and_intake_continues(
    start_service: ServiceFactory, reader: ReaderFactory
) -> None:
    """Guarantee 4: each bad record lands in the DLQ, unchanged, with its reason; good ones fire."""
    service = start_service(BLACKBOX_MAX_MESSAGE_BYTES="2048")
    settings = service.settings
    bootstrap = settings.kafka["bootstrap.servers"]
    target = unique("good")
    values: list[bytes | None] = []
    for n, (bad, _) in enumerate(BAD):
        values += [bad, envelope(target, {"n": n}, 0)]
    produce(bootstrap, settings.intake_topic, values, headers=[("trace", b"abc")])

    dlq_reader, target_reader = reader(settings.dlq_topic), reader(target)
    dlq_reader.wait_count(len(BAD))
    target_reader.wait_count(len(BAD))
    wait_until(lambda: service.store.counts() == (0, 0), what="nothing pending")
    dead, good = dlq_reader.read_to_end(), target_reader.read_to_end()

    assert [d.header("blackbox-dlq-reason") for d in dead] == [r.value for _, r in BAD]
    assert [d.value for d in dead] == [bad for bad, _ in BAD]
    assert [int(d.header("blackbox-dlq-offset")) for d in dead] == list(range(0, 2 * len(BAD), 2))
    assert all(d.header("blackbox-dlq-topic") == settings.intake_topic for d in dead)
    assert all(d.header("trace") == "abc" and d.header("blackbox-dlq-detail") for d in dead)
    assert sorted(orjson.loads(g.value or b"")["n"] for g in good) == list(range(len(BAD)))
    assert len(dead) == len(BAD)
    assert service.metrics.value("blackbox_dead_letters_total", {"reason": "invalid_json"}) == 3
    wait_until(
        lambda: _committed(bootstrap, settings.group_id, settings.intake_topic) == 2 * len(BAD),
        what="intake offsets committed",
    )


def test_bad_caller_header_is_dead_lettered(
    start_service: ServiceFactory, reader: ReaderFactory
) -> None:
    """Guarantee 4: a CALLER_SERVICE header that is not UTF-8 text is refused with its reason."""
    service = start_service()
    settings = service.settings
    produce(settings.kafka["bootstrap.servers"], settings.intake_topic,
            [envelope(unique("t"), 1, 0)], headers=[("CALLER_SERVICE", b"\xff\xfe")])  # fmt: skip

    (dead,) = reader(settings.dlq_topic).wait_count(1)

    assert dead.header("blackbox-dlq-reason") == DeadLetterReason.INVALID_HEADER.value


def test_a_poll_of_several_parts_dead_letters_and_schedules_each_record_once(
    env: dict[str, str], start_service: ServiceFactory, reader: ReaderFactory
) -> None:
    """Guarantees 1 and 4: a poll larger than one part is sent to Redis part by part while
    the next part is parsed; bad records in any part are dead-lettered, every good one
    fires once, and the offsets are committed past all of them."""
    settings = Settings.from_env(env)
    bootstrap = settings.kafka["bootstrap.servers"]
    clients.ensure_topics(settings.kafka, settings.own_topics)
    target, count = unique("parts"), 2 * PART_RECORDS + 50
    bad = set(range(0, count, 60))  # in the first, second and third part
    values = [b"{not json" if n in bad else envelope(target, n, 0) for n in range(count)]
    produce(bootstrap, settings.intake_topic, values)  # before the start: one poll takes all

    service = start_service()
    dlq_reader, target_reader = reader(settings.dlq_topic), reader(target)
    dlq_reader.wait_count(len(bad))
    target_reader.wait_count(count - len(bad))
    wait_until(lambda: service.store.counts() == (0, 0), what="nothing pending")
    dead, good = dlq_reader.read_to_end(), target_reader.read_to_end()

    assert [int(d.header("blackbox-dlq-offset")) for d in dead] == sorted(bad)
    assert sorted(int(g.value or b"") for g in good) == sorted(set(range(count)) - bad)
    assert len(good) == count - len(bad)
    wait_until(
        lambda: _committed(bootstrap, settings.group_id, settings.intake_topic) == count,
        what="intake offsets committed",
    )


def test_a_dead_letter_topic_refusing_mid_poll_loses_no_answer(
    env: dict[str, str], reader: ReaderFactory
) -> None:
    """Guarantees 1 and 5: when the dead-letter topic refuses a record of a later part, the
    parts before it were applied already (a re-read skips them): they are answered before
    intake rewinds, and once the topic accepts, every record is answered once."""
    settings = Settings.from_env({
        **env, "KAFKA_PRODUCER_ALLOW_AUTO_CREATE_TOPICS": "false",
        "KAFKA_PRODUCER_TOPIC_METADATA_PROPAGATION_MAX_MS": "500",
    })  # fmt: skip
    bootstrap = settings.kafka["bootstrap.servers"]
    target, count, bad = unique("mid"), PART_RECORDS + 50, PART_RECORDS + 20
    clients.ensure_topics(settings.kafka, [settings.intake_topic, settings.events_topic, target])
    values = [b"{not json" if n == bad else envelope(target, n, 0) for n in range(count)]
    produce(bootstrap, settings.intake_topic, values)  # before the start: one poll takes all
    events = reader(settings.events_topic)

    service = Service(settings)
    service.start()
    try:
        events.wait_count(PART_RECORDS)  # the first part, answered while intake is paused
        assert service.metrics.value("blackbox_dependency_errors_total", {"dependency": "kafka"})
        clients.ensure_topics(settings.kafka, [settings.dlq_topic])
        (dead,) = reader(settings.dlq_topic).wait_count(1)
        answered = events.wait_count(count)
        reader(target).wait_count(count - 1)
    finally:
        service.stop()
    assert_none_crashed([service])

    assert int(dead.header("blackbox-dlq-offset")) == bad
    outcomes = [orjson.loads(e.value or b"") for e in answered]
    assert sorted(o["intake"]["offset"] for o in outcomes) == list(range(count))  # each once
    assert [o["intake"]["offset"] for o in outcomes if o["outcome"] == "dead_lettered"] == [bad]


def test_the_services_own_topics_are_refused_as_targets_without_a_policy(
    start_service: ServiceFactory, reader: ReaderFactory
) -> None:
    """Guarantee 4, the loop guard: with no policy file, a schedule to blackbox's own intake,
    dead-letter or events topic is forbidden_topic; nothing loops back into intake."""
    service = start_service()
    settings = service.settings
    bootstrap = settings.kafka["bootstrap.servers"]
    own = [settings.intake_topic, settings.dlq_topic, settings.events_topic]
    produce(bootstrap, settings.intake_topic, [envelope(topic, "loop", 0) for topic in own])
    dlq = reader(settings.dlq_topic)
    dlq.wait_count(len(own))
    settle(service)

    dead = dlq.read_to_end()
    assert [d.header("blackbox-dlq-reason") for d in dead] == ["forbidden_topic"] * 3
    assert [orjson.loads(d.value or b"")["topic"] for d in dead] == own
    assert end_offset(bootstrap, settings.intake_topic) == len(own)  # nothing looped back
    assert all(r.value != b"loop" for r in reader(settings.events_topic).read_to_end())


def test_stopping_commits_the_offset_of_every_record_handled(
    env: dict[str, str], reader: ReaderFactory
) -> None:
    """Guarantee 1, as Intake.run promises: on stop, the consumer closes committing what was
    stored, so a successor starts after the last record handled (no periodic commit here)."""
    settings = Settings.from_env({**env, "KAFKA_CONSUMER_AUTO_COMMIT_INTERVAL_MS": "3600000"})
    bootstrap = settings.kafka["bootstrap.servers"]
    clients.ensure_topics(settings.kafka, settings.own_topics)
    events = reader(settings.events_topic)
    service = Service(settings)
    service.start()
    try:
        produce(bootstrap, settings.intake_topic,
                [envelope(unique("later"), n, 60) for n in range(10)])  # fmt: skip
        events.wait_count(10)  # each record answered: handled
    finally:
        service.stop()
    assert_none_crashed([service])

    assert _committed(bootstrap, settings.group_id, settings.intake_topic) == 10
