"""One input row -> one intake envelope, judged by the service's own rules. Pure: no Spark.

The schedule job runs `Judge.row` in its Python workers. A row becomes the JSON-mode
envelope the intake reads (`envelope.parse`) and passes the caller's policy
(`CallerPolicy.check`) or is rejected with the same reason the dead-letter topic would give.
The job adds rules of its own: every row needs an id, so a re-run finds what it sent; a
row whose message column is empty (null) is rejected `missing_field` rather than sent as
the JSON `null`; and a row that could not be read at all is `malformed_row`.
"""

from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import orjson

from blackbox import envelope
from blackbox.envelope import CALLER_HEADER, Envelope, Limits
from blackbox.errors import DeadLetterReason, InvalidEnvelope
from blackbox.intake.policy import CallerPolicy
from blackbox.schedule import scoped_id

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_R = DeadLetterReason
# The job's own reject reason, beside the dead-letter ones: the input row could not be read.
MALFORMED_ROW = "malformed_row"


class MessageKind(enum.StrEnum):
    """How the message column becomes the delivered bytes."""

    TEXT = "text"  # a string, delivered as its UTF-8 text
    JSON = "json"  # JSON text (a struct the job serialised), delivered as that JSON
    BINARY = "binary"  # bytes, delivered byte for byte


class DueKind(enum.StrEnum):
    """What the due column holds (the job turns each into epoch ms or a delay first)."""

    AT_MS = "at_ms"  # an instant, epoch milliseconds
    DELAY = "delay"  # seconds from when blackbox takes the request
    WALL_CLOCK = "wall_clock"  # "YYYY-MM-DD HH:MM[:SS]" local time in the row's zone


@dataclass(frozen=True, slots=True)
class Judged:
    """A row's verdict: the intake record to send, or why not."""

    schedule_id: str | None
    blackbox_id: str | None
    topic: str | None
    due_ms: int | None
    value: bytes | None
    reason: str | None = None
    detail: str | None = None


@dataclass(frozen=True, slots=True)
class Judge:
    """Turns rows (dicts with the job's canonical columns) into verdicts for one caller.

    Canonical columns: `id`, `topic`, `message`, `key`, `due`, `zone` (`zone` only with
    WALL_CLOCK); `jitter_ms` spreads each due time by a stable share of the id's hash.
    """

    caller: str
    limits: Limits
    policy: CallerPolicy
    message_kind: MessageKind
    due_kind: DueKind
    jitter_ms: int = 0

    @property
    def headers(self) -> list[tuple[str, bytes | None]]:
        return [(CALLER_HEADER, self.caller.encode("utf-8"))]

    def row(self, row: dict[str, Any], now_ms: int) -> Judged:
        """The verdict on one row, as if blackbox received it at `now_ms`."""
        schedule_id = None if row.get("id") is None else str(row["id"])
        try:
            if not schedule_id:
                raise InvalidEnvelope(_R.INVALID_ID, "the id column is empty")
            value = orjson.dumps(self.document(row, schedule_id))
            request = envelope.parse(value, self.headers, self.limits)
            assert isinstance(request, Envelope)  # a document without "cancel" schedules
            due_ms = request.due_ms(now_ms)
            self.policy.check(request, due_ms, now_ms)
        except InvalidEnvelope as e:
            topic = row.get("topic")
            return Judged(schedule_id, None, topic if isinstance(topic, str) else None,
                          None, None, e.reason.value, e.detail)  # fmt: skip
        blackbox_id = scoped_id(request.caller, schedule_id)
        return Judged(schedule_id, blackbox_id, request.topic, due_ms, value)

    def document(self, row: dict[str, Any], schedule_id: str) -> dict[str, Any]:
        """The JSON-mode envelope of a row (the wire format `blackbox.client` sends)."""
        document: dict[str, Any] = {"topic": row.get("topic"), "id": schedule_id}
        document.update(self.message(row.get("message")))
        document.update(self.due(row.get("due"), row.get("zone"), schedule_id))
        if row.get("key") is not None:
            document["key"] = str(row["key"])
        return document

    def message(self, message: Any) -> dict[str, Any]:
        if message is None:
            raise InvalidEnvelope(_R.MISSING_FIELD, "the message column is empty")
        if self.message_kind is MessageKind.BINARY:
            return {"message_base64": _base64(message)}
        if self.message_kind is MessageKind.JSON and isinstance(message, str):
            return {"message": orjson.Fragment(message)}
        return {"message": message}

    def due(self, value: Any, zone: Any, schedule_id: str) -> dict[str, Any]:
        """`countdown` or `deliver_at`, the jitter added; a bad value is left for parse."""
        jitter = jitter_ms(schedule_id, self.jitter_ms)
        if self.due_kind is DueKind.DELAY:
            if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0:
                return {"countdown": value + jitter / 1000}
            return {"countdown": value}
        at_ms = value if self.due_kind is DueKind.AT_MS else wall_clock_ms(value, zone)
        if isinstance(at_ms, int) and not isinstance(at_ms, bool):
            return {"deliver_at": rfc3339(at_ms + jitter)}
        return {"deliver_at": at_ms}


def _base64(message: Any) -> str | None:
    import base64  # noqa: PLC0415 - only binary messages need it

    if isinstance(message, bytes | bytearray):
        return base64.b64encode(bytes(message)).decode("ascii")
    if isinstance(message, str):
        return base64.b64encode(message.encode("utf-8")).decode("ascii")
    return None


def jitter_ms(schedule_id: str, window_ms: int) -> int:
    """A stable offset in [0, window_ms) for an id: the same row gets the same on a re-run,
    and many ids spread evenly over the window."""
    if window_ms <= 0:
        return 0
    digest = hashlib.blake2b(schedule_id.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % window_ms


def rfc3339(at_ms: int) -> str:
    """Epoch ms as RFC 3339 text, exact to the millisecond (no float on the way)."""
    return (_EPOCH + timedelta(milliseconds=at_ms)).isoformat(timespec="milliseconds")


def wall_clock_ms(text: Any, zone: Any) -> int:
    """Local wall-clock time in an IANA zone -> epoch ms; InvalidEnvelope if either is bad.

    A time that a clock change skips or repeats resolves as `zoneinfo` does (fold=0)."""
    if not isinstance(zone, str) or not zone:
        raise InvalidEnvelope(_R.INVALID_DELIVER_AT, "the time-zone column is empty")
    try:
        tz = ZoneInfo(zone)
    except (ZoneInfoNotFoundError, ValueError) as e:
        raise InvalidEnvelope(_R.INVALID_DELIVER_AT, f"unknown time zone {zone[:60]!r}") from e
    if not isinstance(text, str):
        raise InvalidEnvelope(_R.INVALID_DELIVER_AT, "the wall-clock time is empty")
    try:
        local = datetime.fromisoformat(text)
    except ValueError as e:
        raise InvalidEnvelope(
            _R.INVALID_DELIVER_AT, f"{text[:60]!r} is not a local date and time"
        ) from e
    if local.tzinfo is not None:
        raise InvalidEnvelope(_R.INVALID_DELIVER_AT, f"{text[:60]!r} has an offset already")
    return (local.replace(tzinfo=tz) - _EPOCH) // timedelta(milliseconds=1)
