"""Schedules callers can address: ids, updates, cancels, absolute times, binary payloads,
etf1's header mode and the answers on the events topic."""

from __future__ import annotations

import base64
import os
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest

from blackbox.cli import main as cli
from blackbox.client import Client
from blackbox.envelope import CALLER_HEADER
from blackbox.exits import EXIT_OK, EXIT_UNCHANGED
from blackbox.kafka import clients
from tests.integration.conftest import ReaderFactory, ServiceFactory, settle
from tests.kafkatools import Received, TopicReader, assert_on_time, produce, unique
from tests.process import BlackboxProcess

Header = tuple[str, bytes | None]


def _send(env: dict[str, str], document: dict[str, Any], caller: str | None = None) -> None:
    headers: list[Header] = [] if caller is None else [(CALLER_HEADER, caller.encode())]
    produce(
        env["KAFKA_BOOTSTRAP_SERVERS"],
        env["BLACKBOX_INTAKE_TOPIC"],
        [orjson.dumps(document)],
        headers,
    )


def _answers(events: Sequence[Received], schedule_id: str, caller: str | None = None) -> list[str]:
    """The outcomes of one caller's id, in the order the events topic holds them."""
    found = []
    for record in sorted(events, key=lambda r: (r.partition, r.offset)):
        event = orjson.loads(record.value or b"{}")
        if (event["caller"], event["id"]) == (caller, schedule_id):
            found.append(event["outcome"])
    return found


def _wait_answers(
    events: TopicReader, schedule_id: str, count: int, caller: str | None = None
) -> list[str]:
    events.wait_for(lambda records: len(_answers(records, schedule_id, caller)) >= count)
    return _answers(events.records, schedule_id, caller)


def test_an_update_moves_the_due_time_earlier_and_later(
    start_service: ServiceFactory, reader: ReaderFactory, env: dict[str, str]
) -> None:
    """Sending an id again replaces its payload and due time, whichever way it moves."""
    service = start_service()
    target, events = reader(unique("updates")), reader(env["BLACKBOX_EVENTS_TOPIC"])
    sent = time.time() * 1000
    _send(env, {"topic": target.topic, "message": "early-v1", "countdown": 60, "id": "early"})
    _send(env, {"topic": target.topic, "message": "late-v1", "countdown": 1, "id": "late"})
    _send(env, {"topic": target.topic, "message": "early-v2", "countdown": 1, "id": "early"})
    _send(env, {"topic": target.topic, "message": "late-v2", "countdown": 4, "id": "late"})

    records = target.wait_count(2, timeout=30)
    by_value = {r.value: r for r in records}

    assert set(by_value) == {b"early-v2", b"late-v2"}
    assert by_value[b"early-v2"].received_ms < sent + 30_000
    assert_on_time(by_value[b"late-v2"], sent + 4_000)
    assert int(by_value[b"late-v2"].header("blackbox-due-ms")) >= sent + 4_000
    assert _wait_answers(events, "early", 2) == ["scheduled", "updated"]
    assert _wait_answers(events, "late", 2) == ["scheduled", "updated"]
    settle(service)
    assert len(target.read_to_end()) == 2, "the first versions must never fire"


def test_cancel_answers_cancelled_already_fired_and_not_found(
    start_service: ServiceFactory, reader: ReaderFactory, env: dict[str, str]
) -> None:
    """A caller who cancels learns whether it worked; a cancelled message never arrives."""
    service = start_service()
    target, events = reader(unique("cancels")), reader(env["BLACKBOX_EVENTS_TOPIC"])
    _send(env, {"topic": target.topic, "message": "fired", "countdown": 0, "id": "fired"})
    target.wait_count(1)
    _send(env, {"topic": target.topic, "message": "never", "countdown": 3, "id": "pending"})
    _send(env, {"id": "pending", "cancel": True})
    _send(env, {"id": "fired", "cancel": True})
    _send(env, {"id": "unknown", "cancel": True})
    _send(env, {"topic": target.topic, "message": "after", "countdown": 4})

    target.wait_for(lambda records: any(r.value == b"after" for r in records), timeout=30)
    settle(service)

    assert sorted(r.value or b"" for r in target.read_to_end()) == [b"after", b"fired"]
    assert _wait_answers(events, "pending", 2) == ["scheduled", "cancelled"]
    assert _wait_answers(events, "fired", 2) == ["scheduled", "already_fired"]
    assert _wait_answers(events, "unknown", 1) == ["not_found"]


def test_a_tombstone_keyed_by_the_id_cancels_it(
    start_service: ServiceFactory, reader: ReaderFactory, env: dict[str, str]
) -> None:
    """A record with no value whose key is an id cancels it, for the same caller only."""
    service = start_service()
    target, events = reader(unique("tombstones")), reader(env["BLACKBOX_EVENTS_TOPIC"])
    _send(env, {"topic": target.topic, "message": "gone", "countdown": 2, "id": "t1"}, "svc")
    _send(env, {"topic": target.topic, "message": "kept", "countdown": 2, "id": "t1"}, "other")
    bootstrap, intake = env["KAFKA_BOOTSTRAP_SERVERS"], env["BLACKBOX_INTAKE_TOPIC"]
    produce(bootstrap, intake, [None], [(CALLER_HEADER, b"svc")], key=b"t1")

    assert _wait_answers(events, "t1", 2, "svc") == ["scheduled", "cancelled"]
    target.wait_count(1)
    settle(service)
    (record,) = target.read_to_end()
    assert record.value == b"kept"
    assert record.header(CALLER_HEADER) == "other"


def test_two_callers_using_the_same_id_do_not_interfere(
    start_service: ServiceFactory, reader: ReaderFactory, env: dict[str, str]
) -> None:
    """Ids are scoped by CALLER_SERVICE: an update or cancel touches only the sender's own."""
    service = start_service()
    target, events = reader(unique("scoped")), reader(env["BLACKBOX_EVENTS_TOPIC"])
    for caller in ("alpha", "beta", None):
        _send(env, {"topic": target.topic, "message": f"{caller}-v1", "countdown": 3,
                    "id": "same"}, caller)  # fmt: skip
    _send(env, {"topic": target.topic, "message": "beta-v2", "countdown": 1, "id": "same"}, "beta")
    _send(env, {"id": "same", "cancel": True}, "alpha")

    target.wait_count(2, timeout=30)
    settle(service)
    records = target.read_to_end()

    assert sorted(r.value or b"" for r in records) == [b"None-v1", b"beta-v2"]
    assert len({r.header("blackbox-id") for r in records}) == 2
    assert _wait_answers(events, "same", 2, "alpha") == ["scheduled", "cancelled"]
    assert _wait_answers(events, "same", 2, "beta") == ["scheduled", "updated"]
    assert _wait_answers(events, "same", 1) == ["scheduled"]


def test_an_id_sent_again_after_it_fired_is_scheduled_anew(
    start_service: ServiceFactory, reader: ReaderFactory, env: dict[str, str]
) -> None:
    """After firing, the same id is a new schedule; `blackbox-version` tells the two apart."""
    start_service()
    target = reader(unique("again"))
    _send(env, {"topic": target.topic, "message": "one", "countdown": 0, "id": "again"})
    target.wait_count(1)
    _send(env, {"topic": target.topic, "message": "two", "countdown": 0, "id": "again"})

    first, second = sorted(target.wait_count(2), key=lambda r: r.offset)

    assert (first.value, second.value) == (b"one", b"two")
    assert first.header("blackbox-id") == second.header("blackbox-id")
    assert first.header("blackbox-version") != second.header("blackbox-version")


def test_deliver_at_fires_at_that_instant_and_a_past_time_at_once(
    start_service: ServiceFactory, reader: ReaderFactory, env: dict[str, str]
) -> None:
    """An absolute time in RFC 3339 or epoch seconds; a time in the past fires at once."""
    start_service()
    target = reader(unique("absolute"))
    at = datetime.now(UTC) + timedelta(seconds=8)  # well past the group join
    _send(env, {"topic": target.topic, "message": "rfc", "deliver_at": at.isoformat()})
    _send(env, {"topic": target.topic, "message": "epoch", "deliver_at": at.timestamp()})
    sent = time.time() * 1000
    _send(env, {"topic": target.topic, "message": "past", "deliver_at": "2001-01-01T00:00:00Z"})

    records = {r.value: r for r in target.wait_count(3, timeout=30)}

    due_ms = at.timestamp() * 1000
    assert_on_time(records[b"rfc"], due_ms)
    assert_on_time(records[b"epoch"], due_ms)
    assert_on_time(records[b"past"], sent)
    assert int(records[b"past"].header("blackbox-due-ms")) >= sent - 1000


def test_a_64_kib_binary_payload_arrives_byte_identical_in_both_modes(
    start_service: ServiceFactory, reader: ReaderFactory, env: dict[str, str]
) -> None:
    """message_base64 (JSON mode) and a raw value (header mode) are delivered byte for byte."""
    start_service()
    target = reader(unique("binary"))
    json_payload, header_payload = os.urandom(64 * 1024), os.urandom(64 * 1024)
    encoded = base64.b64encode(json_payload).decode()
    _send(env, {"topic": target.topic, "message_base64": encoded, "countdown": 0, "key": "k1"})
    epoch = str(int(time.time()))
    headers: list[Header] = [
        ("scheduler-epoch", epoch.encode()),
        ("scheduler-target-topic", target.topic.encode()),
        ("scheduler-target-key", b"k2"),
    ]
    produce(env["KAFKA_BOOTSTRAP_SERVERS"], env["BLACKBOX_INTAKE_TOPIC"], [header_payload],
            headers, key=b"binary-schedule")  # fmt: skip

    records = {r.key: r for r in target.wait_count(2, timeout=30)}

    assert records[b"k1"].value == json_payload
    assert records[b"k2"].value == header_payload


def test_etf1_header_mode_schedules_fire_with_etf1_headers(
    start_service: ServiceFactory, reader: ReaderFactory, env: dict[str, str]
) -> None:
    """An etf1 producer's record works unchanged; its consumer sees etf1's headers."""
    service = start_service()
    target, events = reader(unique("etf1")), reader(env["BLACKBOX_EVENTS_TOPIC"])
    intake, bootstrap = env["BLACKBOX_INTAKE_TOPIC"], env["KAFKA_BOOTSTRAP_SERVERS"]
    epoch = int(time.time()) + 2
    headers: list[Header] = [
        ("scheduler-epoch", str(epoch).encode()),
        ("scheduler-target-topic", target.topic.encode()),
        ("scheduler-target-key", b"vid1"),
        ("customer-header", b"dummy"),
    ]
    produce(bootstrap, intake, [b"video 1"], headers, key=b"vid1-online")
    produce(bootstrap, intake, [b"video 2"], headers, key=b"vid2-online")
    produce(bootstrap, intake, [None], key=b"vid2-online")  # etf1's tombstone cancels

    (record,) = target.wait_count(1, timeout=30)

    assert (record.key, record.value) == (b"vid1", b"video 1")
    assert_on_time(record, epoch * 1000)
    assert record.header("customer-header") == "dummy"
    assert record.header("scheduler-key") == "vid1-online"
    assert record.header("scheduler-topic") == intake
    assert abs(int(record.header("scheduler-timestamp")) - time.time()) < 60
    assert "scheduler-epoch" not in record.headers
    assert _wait_answers(events, "vid2-online", 2) == ["scheduled", "cancelled"]
    settle(service)
    assert len(target.read_to_end()) == 1


def test_the_client_sends_and_cancels_as_its_caller(
    start_service: ServiceFactory, reader: ReaderFactory, env: dict[str, str]
) -> None:
    """blackbox.client builds the envelope and sets CALLER_SERVICE."""
    start_service()
    target, events = reader(unique("client")), reader(env["BLACKBOX_EVENTS_TOPIC"])
    config = {"bootstrap.servers": env["KAFKA_BOOTSTRAP_SERVERS"]}
    with Client(config, caller="shop", intake_topic=env["BLACKBOX_INTAKE_TOPIC"]) as client:
        client.send_later(target.topic, {"n": 1}, delay=0.5, key="order-1",
                          headers={"trace": "abc"})  # fmt: skip
        client.send_later(target.topic, b"\x00\xff", at=time.time() + 60, id="reminder")
        client.cancel("reminder")

    (record,) = target.wait_count(1)

    assert orjson.loads(record.value or b"") == {"n": 1}
    assert (record.key, record.header("trace")) == (b"order-1", "abc")
    assert record.header(CALLER_HEADER) == "shop"
    assert _wait_answers(events, "reminder", 2, "shop") == ["scheduled", "cancelled"]


def test_blackbox_send_file_then_cancel_prints_the_answer(
    start_service: ServiceFactory, reader: ReaderFactory, env: dict[str, str], tmp_path: Path
) -> None:
    """`send --file` sends every line; `cancel` waits for the answer and prints it."""
    start_service()
    target = reader(unique("cli-file"))
    lines = [{"topic": target.topic, "message": n, "countdown": 0} for n in range(50)]
    lines.append({"topic": target.topic, "message": "later", "countdown": 60, "id": "later"})
    batch = tmp_path / "batch.jsonl"
    batch.write_bytes(b"\n".join(orjson.dumps(line) for line in lines) + b"\n")

    sender = BlackboxProcess(env, tmp_path / "send.log", "send", "--file", str(batch),
                             "--caller", "ops")  # fmt: skip
    assert sender.wait() == 0, sender.output()
    records = target.wait_count(50)
    canceller = BlackboxProcess(env, tmp_path / "cancel.log", "cancel", "later",
                                "--caller", "ops", "--wait", "20")  # fmt: skip

    assert canceller.wait(40) == 0, canceller.output()
    assert "cancelled" in canceller.output().splitlines()
    assert sorted(orjson.loads(r.value or b"") for r in records) == list(range(50))
    assert {r.header(CALLER_HEADER) for r in records} == {"ops"}


def test_cancel_pause_and_resume_exit_3_when_they_change_nothing(
    start_service: ServiceFactory, reader: ReaderFactory, env: dict[str, str],
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """A script learns from the exit code whether its request did anything: `cancel`,
    `pause` and `resume` of an unknown id print not_found and exit 3 (EXIT_UNCHANGED), as
    do a pause of a one-off schedule (not_recurring) and a cancel of one that fired
    (already_fired); a cancel that cancels prints cancelled and exits 0."""
    start_service()
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    fired = reader(unique("fired"))
    _send(env, {"topic": unique("later"), "message": 1, "countdown": 600, "id": "later"}, "ops")
    _send(env, {"topic": fired.topic, "message": 1, "countdown": 0, "id": "fired"}, "ops")
    fired.wait_count(1)
    asked = [("cancel", "nothing", "not_found"), ("pause", "nothing", "not_found"),
             ("resume", "nothing", "not_found"), ("pause", "later", "not_recurring"),
             ("cancel", "fired", "already_fired"), ("cancel", "later", "cancelled")]  # fmt: skip

    answered = {}
    for command, schedule_id, _ in asked:
        code = cli.main([command, schedule_id, "--caller", "ops", "--wait", "20"])
        printed = capsys.readouterr().out.splitlines()  # the log's lines, then the answer
        answered[command, schedule_id] = (printed[-1], code)

    assert answered == {
        (command, schedule_id): (outcome, EXIT_OK if outcome == "cancelled" else EXIT_UNCHANGED)
        for command, schedule_id, outcome in asked
    }


def test_blackbox_send_file_with_a_bad_line_sends_nothing(
    env: dict[str, str], tmp_path: Path
) -> None:
    """Every line is checked before anything is sent; the error names the line."""
    batch = tmp_path / "batch.jsonl"
    batch.write_text('{"topic": "t", "message": 1, "countdown": 1}\n{"topic": "t"}\n')
    intake = TopicReader(env["KAFKA_BOOTSTRAP_SERVERS"], env["BLACKBOX_INTAKE_TOPIC"])

    sender = BlackboxProcess(env, tmp_path / "send.log", "send", "--file", str(batch))

    assert sender.wait() == 2
    assert "line 2: missing_field" in sender.output()
    assert intake.read_to_end() == []
    intake.close()


def test_the_client_keeps_an_id_in_order_across_intake_partitions(
    start_service: ServiceFactory, reader: ReaderFactory, env: dict[str, str]
) -> None:
    """Requests with an id are keyed by it: schedule, update and cancel share a partition."""
    clients.ensure_topics({"bootstrap.servers": env["KAFKA_BOOTSTRAP_SERVERS"]},
                        [env["BLACKBOX_INTAKE_TOPIC"]], partitions=4)  # fmt: skip
    start_service()
    target, events = reader(unique("ordered")), reader(env["BLACKBOX_EVENTS_TOPIC"])
    config = {"bootstrap.servers": env["KAFKA_BOOTSTRAP_SERVERS"]}
    ids = [f"job-{n}" for n in range(40)]
    with Client(config, caller="jobs", intake_topic=env["BLACKBOX_INTAKE_TOPIC"]) as client:
        for schedule_id in ids:
            client.send_later(target.topic, "v1", delay=2, id=schedule_id)
            client.send_later(target.topic, "v2", delay=3, id=schedule_id)
            client.cancel(schedule_id)
        client.send_later(target.topic, "sentinel", delay=4)

    target.wait_for(lambda records: any(r.value == b"sentinel" for r in records), timeout=40)

    assert [r.value for r in target.records] == [b"sentinel"]
    for schedule_id in ids:
        assert _wait_answers(events, schedule_id, 3, "jobs") == ["scheduled", "updated",
                                                                  "cancelled"]  # fmt: skip
