"""Events: one JSON answer per request on the events topic, keyed and labelled by caller."""

from __future__ import annotations

import orjson
import pytest

from blackbox.envelope import CALLER_HEADER
from blackbox.errors import DeadLetterReason
from blackbox.kafka.events import Coordinates, Event, Outcome
from blackbox.schedule import intake_id, scoped_id

AT_MS = 1_763_789_000_000
INTAKE = Coordinates("blackbox", 0, 1234)


def test_record_is_the_documented_json() -> None:
    """Every field of the documented event is present, with its JSON type."""
    event = Event.of_stored(
        Outcome.CANCELLED,
        "@billing/order-42",
        None,
        due_ms=1_763_790_000_000,
        topic="invoices",
        intake=INTAKE,
    )
    record = event.record("blackbox.events", AT_MS)
    assert record.topic == "blackbox.events"
    assert record.value is not None
    assert orjson.loads(record.value) == {
        "outcome": "cancelled",
        "caller": "billing",
        "id": "order-42",
        "blackbox_id": "@billing/order-42",
        "due_ms": 1_763_790_000_000,
        "topic": "invoices",
        "reason": None,
        "detail": None,
        "intake": {"topic": "blackbox", "partition": 0, "offset": 1234},
        "at_ms": AT_MS,
    }


def test_record_is_keyed_by_the_callers_id_and_labelled_with_the_caller() -> None:
    """Events about one id share a key (so they stay in order) and carry CALLER_SERVICE."""
    record = Event.of_stored(Outcome.SCHEDULED, "@billing/order-42", None).record("ev", AT_MS)
    assert record.key == b"order-42"
    assert list(record.headers) == [(CALLER_HEADER, b"billing")]


def test_record_without_an_id_of_its_own_is_keyed_by_the_blackbox_id() -> None:
    """A schedule sent without an id is keyed by its stored (intake-derived) id."""
    stored = intake_id("blackbox", 2, 7)
    record = Event.of_stored(Outcome.SCHEDULED, stored, b"billing").record("ev", AT_MS)
    assert record.key == b"blackbox:2:7"
    assert orjson.loads(record.value or b"")["id"] is None
    assert list(record.headers) == [(CALLER_HEADER, b"billing")]


def test_record_without_a_caller_has_no_caller_header() -> None:
    """No CALLER_SERVICE on the request means none on its answer, and a null caller."""
    record = Event.of_stored(Outcome.SCHEDULED, "@/job-1", b"ignored").record("ev", AT_MS)
    assert list(record.headers) == []
    assert record.key == b"job-1"
    assert orjson.loads(record.value or b"")["caller"] is None


def test_dead_letter_event_carries_reason_and_detail() -> None:
    """A refused request is answered with its reason and readable detail."""
    event = Event(
        Outcome.DEAD_LETTERED,
        b"billing",
        schedule_id="order-42",
        intake=INTAKE,
        reason=DeadLetterReason.FORBIDDEN_TOPIC,
        detail="'billing' may not schedule to 'orders' (policy)",
    )
    document = orjson.loads(event.record("ev", AT_MS).value or b"")
    assert (document["outcome"], document["reason"]) == ("dead_lettered", "forbidden_topic")
    assert document["detail"] == "'billing' may not schedule to 'orders' (policy)"
    assert document["blackbox_id"] is None


def test_an_event_about_nothing_stored_has_no_key() -> None:
    """A refusal of a record with neither id nor stored id is produced without a key."""
    event = Event(Outcome.DEAD_LETTERED, None, reason=DeadLetterReason.INVALID_JSON)
    assert event.record("ev", AT_MS).key is None


@pytest.mark.parametrize(
    "caller", [b"billing", b"a/b", b"100%", b"a:b", "été".encode(), None], ids=repr
)
def test_of_stored_recovers_caller_and_id_from_a_scoped_id(caller: bytes | None) -> None:
    """The caller and its own id come back from the stored id, whatever the caller holds."""
    event = Event.of_stored(Outcome.ALREADY_FIRED, scoped_id(caller, "order/42"), b"other")
    assert (event.caller, event.schedule_id) == (caller, "order/42")


def test_of_stored_keeps_the_given_caller_for_an_intake_id() -> None:
    """An intake-derived id names no caller: the caller given is kept, and there is no own id."""
    event = Event.of_stored(Outcome.NOT_FOUND, "blackbox:0:5", b"billing", topic="orders")
    assert event == Event(Outcome.NOT_FOUND, b"billing", "blackbox:0:5", None, topic="orders")
