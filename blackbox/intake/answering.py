"""Answering: the event the intake sends to the events topic for each request it applied
(what applying did) and for each record it refused (why), keyed by the caller's id."""

from __future__ import annotations

from collections.abc import Sequence

from blackbox import envelope
from blackbox.envelope import Request
from blackbox.errors import DeadLetterReason, InvalidEnvelope
from blackbox.kafka.events import Coordinates, Event, Outcome
from blackbox.storage.applying import Applied, Cancellation, Holding, Move, Write

# A record key longer than an id can be is not taken for one in a refusal's answer.
MAX_KEY_AS_ID_BYTES = 1024

OUTCOMES = {
    Applied.SCHEDULED: Outcome.SCHEDULED,
    Applied.UPDATED: Outcome.UPDATED,
    Applied.CANCELLED: Outcome.CANCELLED,
    Applied.ALREADY_FIRED: Outcome.ALREADY_FIRED,
    Applied.NOT_FOUND: Outcome.NOT_FOUND,
    Applied.ALREADY_PENDING: Outcome.ALREADY_PENDING,
    Applied.NOT_RECURRING: Outcome.NOT_RECURRING,
    Applied.PAUSED: Outcome.PAUSED,
    Applied.RESUMED: Outcome.RESUMED,
    Applied.RECURRING: Outcome.RECURRING,
}


def key_text(key: bytes | None) -> str | None:
    """A record key as an id, when it reads as one (short UTF-8 text)."""
    if key is None or len(key) > MAX_KEY_AS_ID_BYTES:
        return None
    try:
        return key.decode("utf-8")
    except UnicodeDecodeError:
        return None


# Refusals of a record whose caller could not be proven: anyone may write such a record
# naming any caller, so its answer names none (the caller's own answers stay its own; the
# dead letter keeps the record's headers for its operator).
UNPROVEN = frozenset({
    DeadLetterReason.BAD_SIGNATURE, DeadLetterReason.UNKNOWN_KEY,
    DeadLetterReason.SIGNATURE_EXPIRED, DeadLetterReason.UNVERIFIED_CALLER,
})  # fmt: skip

# Codes after which a schedule's due time is in Redis (a re-read's too: the replica that
# stored it may have died before it woke the dispatchers).
STORED = (Applied.SCHEDULED, Applied.UPDATED, Applied.REREAD_PENDING)


def label(code: Applied) -> str:
    if code in (Applied.REPLAYED, Applied.REREAD_PENDING):
        return "duplicate"
    return code.name.lower()


def event_of(coordinates: Coordinates, write: Write, code: Applied) -> Event:
    """The answer to one applied request: what became of it, as the caller reads it (a re-read
    request is answered as it was the first time)."""
    if isinstance(write, Cancellation):
        return Event.of_stored(OUTCOMES[code], write.id, None, intake=coordinates)
    if isinstance(write, Holding):
        if code is Applied.REREAD_PENDING:
            code = Applied.PAUSED if write.paused else Applied.RESUMED
        return Event.of_stored(OUTCOMES[code], write.id, write.caller, intake=coordinates)
    if code is Applied.REREAD_PENDING:  # answered again, as it was the first time
        code = Applied.UPDATED if isinstance(write, Move) else Applied.SCHEDULED
    if isinstance(write, Move):
        due_ms = write.due_ms if code is Applied.UPDATED else None
        return Event.of_stored(OUTCOMES[code], write.id, write.caller, due_ms=due_ms,
                               intake=coordinates)  # fmt: skip
    if code not in (Applied.SCHEDULED, Applied.UPDATED):  # an if_absent request changed nothing
        return Event.of_stored(OUTCOMES[code], write.id, write.caller, intake=coordinates)
    return Event.of_stored(
        OUTCOMES[code], write.id, write.caller,
        due_ms=write.due_ms, topic=write.topic, intake=coordinates,
    )  # fmt: skip


def refusal_of(
    coordinates: Coordinates, headers: Sequence[tuple[str, bytes | None]],
    request: Request | None, error: InvalidEnvelope, key: bytes | None,
) -> Event:  # fmt: skip
    """The dead_lettered answer to a refused record, with whatever of it could be read: where
    no id could be read, its record key stands for it (a request about an id is keyed by it),
    so the answer goes with that id's other answers."""
    try:
        caller = None if error.reason in UNPROVEN else envelope.caller_of(headers)
    except InvalidEnvelope:
        caller = None
    schedule_id = error.schedule_id if request is None else request.schedule_id
    return Event(
        Outcome.DEAD_LETTERED,
        caller,
        schedule_id=schedule_id or key_text(key),
        topic=request.topic if isinstance(request, envelope.Envelope) else error.topic,
        intake=coordinates,
        reason=error.reason,
        detail=error.detail,
    )
