"""Moving a caller's pending id through the intake topic, in the order of its records."""

from __future__ import annotations

import orjson

from blackbox.client import Client
from blackbox.envelope import CALLER_HEADER
from tests.integration.conftest import ReaderFactory, ServiceFactory, settle
from tests.kafkatools import produce, unique


def test_a_reschedule_record_moves_the_id_and_keeps_its_message(
    start_service: ServiceFactory, reader: ReaderFactory
) -> None:
    """Guarantee 2: `{"id", "reschedule", "countdown"}` moves a pending id: its message
    arrives byte for byte at the new time with an `updated` answer; an unknown id answers
    not_found, and a move beyond the caller's horizon is dead-lettered."""
    service = start_service(BLACKBOX_MAX_COUNTDOWN="7200")
    settings = service.settings
    bootstrap, intake = settings.kafka["bootstrap.servers"], settings.intake_topic
    target = unique("moved")
    events = reader(settings.events_topic)
    with Client({"bootstrap.servers": bootstrap}, caller="ops", intake_topic=intake) as client:
        client.send_later(target, b"\x00kept\xff", delay=3600, id="late", key="k1")
    events.wait_for(lambda r: any(orjson.loads(e.value or b"")["outcome"] == "scheduled"
                                  for e in r))  # fmt: skip
    for document in ({"id": "late", "reschedule": True, "countdown": 0},
                     {"id": "ghost", "reschedule": True, "countdown": 0},
                     {"id": "late", "reschedule": True, "countdown": 99_999}):  # fmt: skip
        produce(bootstrap, intake, [orjson.dumps(document)], [(CALLER_HEADER, b"ops")],
                key=str(document["id"]).encode())  # fmt: skip

    (delivered,) = reader(target).wait_count(1)
    settle(service)
    answers = [orjson.loads(e.value or b"") for e in events.wait_count(4)]
    assert (delivered.value, delivered.key) == (b"\x00kept\xff", b"k1")
    assert [(a["outcome"], a["id"]) for a in answers] == [
        ("scheduled", "late"), ("updated", "late"), ("not_found", "ghost"),
        ("dead_lettered", "late")]  # fmt: skip
    assert answers[1]["due_ms"] <= delivered.received_ms
    assert answers[3]["reason"] == "beyond_horizon"
