"""Answers: one event per schedule, update, cancel and dead letter, on the events topic.

An event is a JSON object keyed by the caller's id (so one id's events stay in order):

    {"outcome": "cancelled", "caller": "billing", "id": "order-42",
     "blackbox_id": "@billing/order-42", "due_ms": 1763790000000, "topic": "invoices",
     "reason": null, "detail": null,
     "intake": {"topic": "blackbox", "partition": 0, "offset": 1234}, "at_ms": 1763789000000}

The `CALLER_SERVICE` header is set to the caller, so a caller can filter its own answers.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import orjson

from blackbox.envelope import CALLER_HEADER
from blackbox.errors import DeadLetterReason
from blackbox.kafka.outbox import Record
from blackbox.schedule import split_scoped


class Outcome(enum.StrEnum):
    """What became of a request."""

    SCHEDULED = "scheduled"
    UPDATED = "updated"
    CANCELLED = "cancelled"
    ALREADY_FIRED = "already_fired"
    NOT_FOUND = "not_found"
    DEAD_LETTERED = "dead_lettered"
    ALREADY_PENDING = "already_pending"  # an if_absent request for an id pending already
    PAUSED = "paused"  # a series held: its occurrences are passed over until resumed
    RESUMED = "resumed"
    NOT_RECURRING = "not_recurring"  # a pause or resume of a one-off schedule
    RECURRING = "recurring"  # a reschedule of a series (its rule says when; send it again)
    FIRED = "fired"  # one occurrence of a series delivered
    COMPLETED = "completed"  # a series ended by its limit or its end


# Not frozen: one is built per record on the hot path (a frozen one is several
# times slower to build). Treat it as immutable all the same.
@dataclass(slots=True)
class Coordinates:
    """Where a record sits in Kafka."""

    topic: str
    partition: int
    offset: int


# Not frozen: one is built per record on the hot path (a frozen one is several
# times slower to build). Treat it as immutable all the same.
@dataclass(slots=True)
class Event:
    """One answer. `blackbox_id` is the stored id; `caller` and `schedule_id` what the caller
    sent (`schedule_id` is None for a schedule without an id of its own)."""

    outcome: Outcome
    caller: bytes | None
    blackbox_id: str | None = None
    schedule_id: str | None = None
    due_ms: int | None = None
    topic: str | None = None
    intake: Coordinates | None = None
    reason: DeadLetterReason | None = None
    detail: str | None = None
    occurrence_ms: int | None = None  # a series' occurrence (fired, completed)

    @classmethod
    def of_stored(  # noqa: PLR0913 - an event's fields, by name
        cls,
        outcome: Outcome,
        blackbox_id: str,
        caller: bytes | None,
        *,
        due_ms: int | None = None,
        topic: str | None = None,
        intake: Coordinates | None = None,
        reason: DeadLetterReason | None = None,
        detail: str | None = None,
        occurrence_ms: int | None = None,
    ) -> Event:
        """An event about a stored id; a caller's id and its caller are read from the id."""
        own = None
        scoped = split_scoped(blackbox_id)
        if scoped is not None:
            caller, own = scoped
        return cls(
            outcome, caller, blackbox_id, own, due_ms, topic, intake, reason, detail, occurrence_ms
        )

    def record(self, topic: str, at_ms: int) -> Record:
        """The Kafka record carrying this event to `topic`."""
        document = {
            "outcome": self.outcome.value,
            "caller": None if self.caller is None else self.caller.decode("utf-8", "replace"),
            "id": self.schedule_id,
            "blackbox_id": self.blackbox_id,
            "due_ms": self.due_ms,
            "topic": self.topic,
            "reason": None if self.reason is None else self.reason.value,
            "detail": self.detail,
            "intake": None if self.intake is None else {
                "topic": self.intake.topic,
                "partition": self.intake.partition,
                "offset": self.intake.offset,
            },
            "at_ms": at_ms,
        }  # fmt: skip
        if self.occurrence_ms is not None:
            document["occurrence_ms"] = self.occurrence_ms
        key = self.schedule_id or self.blackbox_id
        headers = [] if self.caller is None else [(CALLER_HEADER, self.caller)]
        return Record(topic, orjson.dumps(document), None if key is None else key.encode(), headers)
