"""Parse an intake record into a request: pure, no I/O, exact about why a record is bad.

Two modes share one intake topic:

* JSON mode: the value is a JSON object ``{"topic": T, "message": M, "countdown": N}``,
  with optional ``deliver_at`` (instead of countdown), ``message_base64`` (instead of
  message), ``key``, ``headers`` and ``id``; ``{"id": X, "cancel": true}`` cancels and
  ``{"id": X, "reschedule": true, "countdown" | "deliver_at": ...}`` moves X's due time.
  A recurring schedule (a series) has an id and ``cron`` or ``every`` instead of a due time,
  with optional ``timezone``, ``start``, ``end``, ``limit``, ``jitter``, ``missed`` and
  ``grace``; ``{"id": X, "pause": true}`` and ``{"id": X, "resume": true}`` hold and release it.
* Header mode (etf1's kafka-message-scheduler): headers ``scheduler-epoch``,
  ``scheduler-target-topic`` and optionally ``scheduler-target-key``; the value is the
  payload byte for byte and the record key is the schedule id.

In both modes a tombstone (no value) whose record key is an id cancels that id. The
``CALLER_SERVICE`` header names the sender and scopes its ids. Anything else raises
InvalidEnvelope with a reason from the closed DeadLetterReason set and a readable detail.
"""

from __future__ import annotations

import base64
import binascii
import functools
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import orjson

from blackbox import retries
from blackbox.errors import DeadLetterReason, InvalidEnvelope
from blackbox.recurrence import InvalidRecurrence, Missed, Recurrence

CALLER_HEADER = "CALLER_SERVICE"
# A signed record's signature (see signing.py): verified before parsing, never delivered.
SIGNATURE_HEADER = "blackbox-signature"
EPOCH_HEADER = "scheduler-epoch"
TARGET_TOPIC_HEADER = "scheduler-target-topic"
TARGET_KEY_HEADER = "scheduler-target-key"
SCHEDULER_HEADERS = frozenset({EPOCH_HEADER, TARGET_TOPIC_HEADER, TARGET_KEY_HEADER})
# etf1's headers, in and out: never passed through (blackbox sets the output ones itself).
SCHEDULER_HEADER_PREFIX = "scheduler-"
# Headers blackbox sets on what it delivers: a sender may not forge them.
RESERVED_HEADER_PREFIX = "blackbox-"
MAX_CALLER_CHARS = 255
MAX_ID_CHARS = 255
# What a stored schedule can hold (u16 counts and name lengths).
MAX_HEADERS = 0xFFFF
MAX_HEADER_NAME_BYTES = 0xFFFF
# The longest countdown any limit may allow: due times stay far inside 64-bit milliseconds.
ABSOLUTE_MAX_COUNTDOWN_SECONDS = 1000 * 365.25 * 86400
MAX_TOPIC_CHARS = 249
_TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_SECOND = timedelta(seconds=1)
# RFC 3339 section 5.6 date-time: full-date "T" full-time, the offset required. Digits
# are ASCII only (\d would take any Unicode digit); hour, minute and offset ranges are
# checked here, the day of the month by the calendar. A leap second (:60) is refused:
# no clock here can name it.
_RFC3339 = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt]([01][0-9]|2[0-3]):([0-5][0-9]):([0-5][0-9])"
    r"(?:\.([0-9]+))?([Zz]|([+-])(?:([01][0-9]|2[0-3]):([0-5][0-9])))"
)
_R = DeadLetterReason

Header = tuple[str, bytes | None]
Headers = Sequence[Header]
RawHeaders = Sequence[tuple[str, str | bytes | None]] | Mapping[str, str | bytes | None]


@dataclass(frozen=True, slots=True)
class Limits:
    """What intake accepts whoever sends it: record size and topics never to target."""

    max_value_bytes: int
    forbidden_topics: frozenset[str]


# Not frozen: one is built per record on the hot path (a frozen one is several
# times slower to build). Treat it as immutable all the same.
@dataclass(slots=True)
class Envelope:
    """A valid schedule request: deliver `value` to `topic` after `countdown_ms` or at `at_ms`.

    Exactly one of `countdown_ms` and `at_ms` is set. `schedule_id` is the sender's own id
    (scoped by `caller`); without one, the record's intake coordinates identify it.
    `etf1` marks a header-mode record, delivered with etf1's headers.
    """

    topic: str
    value: bytes
    caller: bytes | None
    countdown_ms: int | None = None
    at_ms: int | None = None
    key: bytes | None = None
    headers: tuple[Header, ...] = ()
    schedule_id: str | None = None
    etf1: bool = False
    # Schedule only if the id is neither pending nor ended lately ({"if_absent": true}): a
    # retried create then never schedules twice, even after the first one fired.
    if_absent: bool = False
    # A series: delivered at each occurrence of this rule (countdown and at_ms unset).
    recurrence: Recurrence | None = None
    # A consumer's retry (retries.py): its topic and countdown are set when it is applied.
    retry: retries.Retry | None = None
    # The target partition asked for (a retry's "partition": "same"); None: the partitioner.
    partition: int | None = None

    def due_ms(self, received_ms: int) -> int:
        """When to deliver: never before `received_ms` (a time in the past fires at once)."""
        if self.at_ms is not None:
            return max(self.at_ms, received_ms)
        return received_ms + (self.countdown_ms or 0)


# Not frozen: one is built per record on the hot path (a frozen one is several
# times slower to build). Treat it as immutable all the same.
@dataclass(slots=True)
class Cancel:
    """A request to cancel the sender's pending schedule `schedule_id`."""

    schedule_id: str
    caller: bytes | None


# Not frozen, as Cancel.
@dataclass(slots=True)
class Reschedule:
    """A request to move the sender's pending schedule `schedule_id` to a new due time,
    its message kept: after `countdown_ms` or at `at_ms` (exactly one is set)."""

    schedule_id: str
    caller: bytes | None
    countdown_ms: int | None = None
    at_ms: int | None = None

    def due_ms(self, received_ms: int) -> int:
        """When to deliver: never before `received_ms`, as an envelope's."""
        if self.at_ms is not None:
            return max(self.at_ms, received_ms)
        return received_ms + (self.countdown_ms or 0)


# Not frozen, as Cancel.
@dataclass(slots=True)
class Hold:
    """A request to pause (`paused`) or resume the sender's series `schedule_id`."""

    schedule_id: str
    caller: bytes | None
    paused: bool


Request = Envelope | Cancel | Reschedule | Hold
# A series' fields: with none of them, a record is a one-off schedule.
_SERIES_FIELDS = frozenset({"cron", "every", "timezone", "start", "end", "limit", "jitter",
                            "missed", "grace"})  # fmt: skip


def parse(
    value: bytes | None, headers: Headers | None, limits: Limits, key: bytes | None = None
) -> Request:
    """Return what a record asks for, or raise InvalidEnvelope saying why it cannot be done."""
    caller = caller_of(headers)
    if value is None:
        if headers and retries.is_request(headers):  # never a cancel of the key's schedule
            raise InvalidEnvelope(
                _R.INVALID_RETRY, "a retry needs a value: send a null one as empty bytes"
            )
        return _tombstone(key, caller)
    if len(value) > limits.max_value_bytes:
        raise InvalidEnvelope(
            _R.OVERSIZED, f"value is {len(value)} bytes, the limit is {limits.max_value_bytes}"
        )
    if headers and retries.is_request(headers):
        return _retry_request(value, key, headers, caller)
    if headers and any(name in SCHEDULER_HEADERS for name, _ in headers):
        try:
            return _header_mode(value, key, headers or (), caller, limits)
        except InvalidEnvelope as e:
            e.schedule_id = _readable(key)
            raise
    document = _decode(value)
    try:
        return _json_request(document, caller, limits)
    except InvalidEnvelope as e:
        e.schedule_id, e.topic = (
            _text_or_none(document.get("id")),
            _text_or_none(document.get("topic")),
        )
        raise


def _json_request(document: dict[str, Any], caller: bytes | None, limits: Limits) -> Request:
    if "cancel" in document and _cancel_flag(document):
        return Cancel(_id(_field(document, "id"), "id"), caller)
    if "reschedule" in document and _flag(document, "reschedule"):
        countdown_ms, at_ms = _due(document)
        return Reschedule(_id(_field(document, "id"), "id"), caller, countdown_ms, at_ms)
    for verb in ("pause", "resume"):
        if verb in document and _flag(document, verb):
            return Hold(_id(_field(document, "id"), "id"), caller, paused=verb == "pause")
    recurrence = None
    if not _SERIES_FIELDS.isdisjoint(document):
        recurrence = _recurrence(document)
        countdown_ms, at_ms = None, None
    else:
        countdown_ms, at_ms = _due(document)
    return Envelope(
        topic=target_topic(_field(document, "topic"), limits),
        value=_message_bytes(document),
        caller=caller,
        countdown_ms=countdown_ms,
        at_ms=at_ms,
        key=_optional_text(document, "key"),
        headers=_json_headers(document.get("headers")),
        schedule_id=None if document.get("id") is None else _id(document["id"], "id"),
        if_absent=_if_absent(document),
        recurrence=recurrence,
    )


def _recurrence(document: dict[str, Any]) -> Recurrence:
    """The rule of a series: `cron` or `every`, its zone, bounds and policies."""
    if "countdown" in document or "deliver_at" in document:
        raise InvalidEnvelope(
            _R.CONFLICTING_FIELDS, "a series has cron or every, not countdown or deliver_at"
        )
    if "cron" in document and "every" in document:
        raise InvalidEnvelope(_R.CONFLICTING_FIELDS, "give cron or every, not both")
    if document.get("cron") is None and document.get("every") is None:
        raise InvalidEnvelope(_R.MISSING_FIELD, "a series needs cron or every")
    if document.get("id") is None:
        raise InvalidEnvelope(_R.MISSING_FIELD, "a series needs an id (to update or cancel it)")
    zone = document.get("timezone", "UTC")
    if not isinstance(zone, str):
        raise InvalidEnvelope(_R.WRONG_TYPE, f"timezone must be a string, not {_kind(zone)}")
    try:
        return Recurrence(
            timezone=zone,
            cron=_text_field(document, "cron"),
            every_ms=_seconds_field(document, "every"),
            start_ms=_instant_field(document, "start"),
            end_ms=_instant_field(document, "end"),
            limit=_count_field(document, "limit"),
            jitter_ms=_seconds_field(document, "jitter") or 0,
            missed=_missed(document),
            grace_ms=_seconds_field(document, "grace", 60_000) or 0,
        )
    except InvalidRecurrence as e:
        reason = _R.UNKNOWN_TIMEZONE if e.timezone else _R.INVALID_RECURRENCE
        raise InvalidEnvelope(reason, str(e)) from e


def _text_field(document: dict[str, Any], name: str) -> str | None:
    value = document.get(name)
    if value is not None and not isinstance(value, str):
        raise InvalidEnvelope(_R.WRONG_TYPE, f"{name} must be a string, not {_kind(value)}")
    return value


def _seconds_field(document: dict[str, Any], name: str, default: int | None = None) -> int | None:
    value = document.get(name)
    if value is None:
        return default
    if type(value) is not int and type(value) is not float:
        raise InvalidEnvelope(_R.WRONG_TYPE, f"{name} must be seconds, not {_kind(value)}")
    if not math.isfinite(value) or not 0 <= value <= ABSOLUTE_MAX_COUNTDOWN_SECONDS:
        raise InvalidEnvelope(_R.INVALID_RECURRENCE, f"{name} {value} is not usable seconds")
    return _seconds_to_ms(value)


def _instant_field(document: dict[str, Any], name: str) -> int | None:
    value = document.get(name)
    if value is None:
        return None
    try:
        return _deliver_at_ms(value)
    except InvalidEnvelope as e:
        detail = e.detail.replace("deliver_at", name)
        raise InvalidEnvelope(
            _R.WRONG_TYPE if e.reason is _R.WRONG_TYPE else _R.INVALID_RECURRENCE, detail
        ) from e


def _count_field(document: dict[str, Any], name: str) -> int | None:
    value = document.get(name)
    if value is not None and type(value) is not int:
        raise InvalidEnvelope(_R.WRONG_TYPE, f"{name} must be a whole number, not {_kind(value)}")
    return value


def _missed(document: dict[str, Any]) -> Missed:
    value = document.get("missed", "once")
    try:
        return Missed(value)
    except ValueError:
        choices = ", ".join(m.value for m in Missed)
        raise InvalidEnvelope(
            _R.INVALID_RECURRENCE, f"missed must be one of {choices}, not {str(value)[:40]!r}"
        ) from None


def _readable(key: bytes | None) -> str | None:
    try:
        return None if key is None else key.decode("utf-8")[:MAX_ID_CHARS]
    except UnicodeDecodeError:
        return None


def _text_or_none(value: object) -> str | None:
    return value[:MAX_ID_CHARS] if isinstance(value, str) else None


def normalize_headers(raw: RawHeaders | None) -> list[Header]:
    """Kafka client headers as (name, bytes) pairs, in order, repeats kept."""
    if not raw:  # most records carry none: confluent-kafka gives None
        return []
    pairs = raw.items() if isinstance(raw, Mapping) else raw
    return [(k, v.encode() if isinstance(v, str) else v) for k, v in pairs]


def caller_of(headers: Headers | None) -> bytes | None:
    """The CALLER_SERVICE header value, checked to be short UTF-8 text; None when absent."""
    raw = _single_header(headers, CALLER_HEADER)
    if raw is None:
        return None
    text = _header_text(raw, CALLER_HEADER)
    if not text or len(text) > MAX_CALLER_CHARS or not text.isprintable():
        raise InvalidEnvelope(
            _R.INVALID_HEADER, f"{CALLER_HEADER} must be 1-{MAX_CALLER_CHARS} printable characters"
        )
    return raw


def _single_header(headers: Headers | None, name: str) -> bytes | None:
    """The value of a header that may appear at most once, with a value; None when absent."""
    if not headers:
        return None
    values = [v for k, v in headers if k == name]
    if not values:
        return None
    if len(values) > 1:
        raise InvalidEnvelope(_R.INVALID_HEADER, f"{name} is repeated")
    if values[0] is None:
        raise InvalidEnvelope(_R.INVALID_HEADER, f"{name} has no value")
    return values[0]


def _header_text(raw: bytes, name: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InvalidEnvelope(_R.INVALID_HEADER, f"{name} is not UTF-8") from e


def _tombstone(key: bytes | None, caller: bytes | None) -> Cancel:
    if key is None:
        raise InvalidEnvelope(
            _R.EMPTY_VALUE, "the record has no value and no key (a tombstone cancels by key)"
        )
    return Cancel(_id(_key_text(key), "record key"), caller)


# The trace context (traceparent, tracestate, baggage) is checked and carried by the intake.
_NOT_PASSED = frozenset({CALLER_HEADER, SIGNATURE_HEADER, "traceparent", "tracestate", "baggage"})


def _header_mode(
    value: bytes, key: bytes | None, headers: Headers, caller: bytes | None, limits: Limits
) -> Envelope:
    """An etf1-style record: headers say where and when, the value is the payload."""
    epoch, topic = (
        _single_header(headers, EPOCH_HEADER),
        _single_header(headers, TARGET_TOPIC_HEADER),
    )
    if epoch is None or topic is None:
        missing = EPOCH_HEADER if epoch is None else TARGET_TOPIC_HEADER
        raise InvalidEnvelope(_R.MISSING_FIELD, f"the header {missing!r} is missing")
    if key is None:
        raise InvalidEnvelope(_R.INVALID_ID, "a header-mode record needs a record key (its id)")
    try:
        seconds = float(_header_text(epoch, EPOCH_HEADER))
    except ValueError as e:
        raise InvalidEnvelope(
            _R.INVALID_DELIVER_AT, f"{EPOCH_HEADER} must be unix seconds, not {epoch[:40]!r}"
        ) from e
    passed = tuple(
        (name, v)
        for name, v in headers
        if not name.startswith(SCHEDULER_HEADER_PREFIX) and name not in _NOT_PASSED
    )
    return Envelope(
        topic=target_topic(_header_text(topic, TARGET_TOPIC_HEADER), limits),
        value=value,
        caller=caller,
        at_ms=_epoch_ms(seconds, EPOCH_HEADER),
        key=_single_header(headers, TARGET_KEY_HEADER),
        headers=_checked_headers(passed),
        schedule_id=_id(_key_text(key), "record key"),
        etf1=True,
    )


def _retry_request(
    value: bytes, key: bytes | None, headers: Headers, caller: bytes | None
) -> Envelope:
    """A consumer's failed record sent back (retries.py): value, key and its own headers
    kept byte for byte; where and when it goes is decided when it is applied."""
    retry, passed = retries.read(headers)
    kept = tuple((name, v) for name, v in passed if name not in (CALLER_HEADER, SIGNATURE_HEADER))
    if len(kept) > MAX_HEADERS - len(retries.DELIVERED_HEADERS):
        raise InvalidEnvelope(_R.INVALID_HEADER, f"{len(kept)} headers, too many to carry")
    longest = max((len(name.encode("utf-8", "surrogatepass")) for name, _ in kept), default=0)
    if longest > MAX_HEADER_NAME_BYTES:
        raise InvalidEnvelope(_R.INVALID_HEADER, f"a header name of {longest} bytes")
    return Envelope(
        topic=retry.source.topic,
        value=value,
        caller=caller,
        countdown_ms=0,
        key=key,
        headers=kept,
        schedule_id=retry.id_for(retry.source.topic),  # the topic is known when applied
        if_absent=True,
        retry=retry,
    )


def _decode(value: bytes) -> dict[str, Any]:
    try:
        document = orjson.loads(value)
    except orjson.JSONDecodeError as e:
        raise InvalidEnvelope(_R.INVALID_JSON, f"value is not JSON: {e}") from e
    if not isinstance(document, dict):
        raise InvalidEnvelope(_R.NOT_AN_OBJECT, f"value is a JSON {_kind(document)}")
    return document


def _if_absent(document: dict[str, Any]) -> bool:
    if "if_absent" not in document or not _flag(document, "if_absent"):
        return False
    if document.get("id") is None:
        raise InvalidEnvelope(_R.MISSING_FIELD, "if_absent needs an id (what must be absent)")
    return True


def _flag(document: dict[str, Any], name: str) -> bool:
    flag = document[name]
    if not isinstance(flag, bool):
        raise InvalidEnvelope(_R.WRONG_TYPE, f"{name} must be true or false, not {_kind(flag)}")
    return flag


def _cancel_flag(document: dict[str, Any]) -> bool:
    flag = document["cancel"]
    if not isinstance(flag, bool):
        raise InvalidEnvelope(_R.WRONG_TYPE, f"cancel must be true or false, not {_kind(flag)}")
    return flag


def target_topic(topic: object, limits: Limits) -> str:
    """`topic` if a schedule may target it: a legal name, not internal, not forbidden."""
    if not isinstance(topic, str):
        raise InvalidEnvelope(_R.WRONG_TYPE, f"topic must be a string, not {_kind(topic)}")
    if not legal_topic_name(topic):
        raise InvalidEnvelope(_R.INVALID_TOPIC, f"{topic[:300]!r} is not a Kafka topic name")
    if topic.startswith("__") or topic in limits.forbidden_topics:
        raise InvalidEnvelope(_R.FORBIDDEN_TOPIC, f"{topic!r} may not be a target")
    return topic


# A deployment targets few topics, each many times. Only names of legal length are
# looked up, so hostile input can hold at most 4096 x 249 characters here.
@functools.lru_cache(maxsize=4096)
def legal_topic_name(topic: str) -> bool:
    """Whether Kafka accepts `topic` as a topic name."""
    return (
        len(topic) <= MAX_TOPIC_CHARS
        and _TOPIC_NAME.fullmatch(topic) is not None
        and topic not in {".", ".."}
    )


def _message_bytes(document: dict[str, Any]) -> bytes:
    """A JSON string is delivered as its UTF-8 text, any other JSON value as its encoding,
    and `message_base64` as the bytes it encodes."""
    if "message" in document and "message_base64" in document:
        raise InvalidEnvelope(_R.CONFLICTING_FIELDS, "give message or message_base64, not both")
    if "message_base64" in document:
        encoded = document["message_base64"]
        if not isinstance(encoded, str):
            raise InvalidEnvelope(
                _R.WRONG_TYPE, f"message_base64 must be a string, not {_kind(encoded)}"
            )
        try:
            return base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError) as e:
            raise InvalidEnvelope(_R.INVALID_BASE64, f"message_base64 is not base64: {e}") from e
    message = _field(document, "message")
    if isinstance(message, str):
        return message.encode("utf-8")
    try:
        return orjson.dumps(message)
    except orjson.JSONEncodeError as e:  # orjson writes at most 254 levels, reads 1024
        raise InvalidEnvelope(_R.INVALID_JSON, f"message cannot be re-encoded: {e}") from e


def _due(document: dict[str, Any]) -> tuple[int | None, int | None]:
    """(countdown_ms, None) or (None, at_ms): exactly one of the two fields is given."""
    has_countdown, has_at = "countdown" in document, "deliver_at" in document
    if has_countdown and has_at:
        raise InvalidEnvelope(_R.CONFLICTING_FIELDS, "give countdown or deliver_at, not both")
    if has_at:
        return None, _deliver_at_ms(document["deliver_at"])
    return _countdown_ms(_field(document, "countdown")), None


def _countdown_ms(countdown: object) -> int:
    # Exact types, as JSON gives them: bool (an int subclass) is not a number here.
    if type(countdown) is not int and type(countdown) is not float:
        raise InvalidEnvelope(_R.WRONG_TYPE, f"countdown must be a number, not {_kind(countdown)}")
    if not math.isfinite(countdown) or countdown < 0:
        raise InvalidEnvelope(_R.INVALID_COUNTDOWN, f"countdown {countdown} is not >= 0")
    if countdown > ABSOLUTE_MAX_COUNTDOWN_SECONDS:
        raise InvalidEnvelope(
            _R.INVALID_COUNTDOWN, f"countdown {countdown} s is beyond any horizon (1,000 years)"
        )
    return _seconds_to_ms(countdown)


def _deliver_at_ms(at: object) -> int:
    """RFC 3339 text with an offset, or epoch seconds as a number."""
    if isinstance(at, bool) or not isinstance(at, int | float | str):
        raise InvalidEnvelope(
            _R.WRONG_TYPE, f"deliver_at must be a string or a number, not {_kind(at)}"
        )
    if not isinstance(at, str):
        return _epoch_ms(at, "deliver_at")
    return _rfc3339_ms(at)


def _rfc3339_ms(text: str) -> int:
    """RFC 3339 date-time (section 5.6) as epoch ms, rounded up; nothing else ISO 8601 allows."""
    match = _RFC3339.fullmatch(text)
    if match is None:
        raise InvalidEnvelope(
            _R.INVALID_DELIVER_AT,
            f"deliver_at {text[:60]!r} is not an RFC 3339 time with an offset"
            " (YYYY-MM-DDThh:mm:ss[.fff]Z or +hh:mm)",
        )
    try:
        year, month, day, hour, minute, second = map(int, match.group(1, 2, 3, 4, 5, 6))
        moment = datetime(year, month, day, hour, minute, second, tzinfo=_offset(match))
    except ValueError as e:
        raise InvalidEnvelope(
            _R.INVALID_DELIVER_AT, f"deliver_at {text[:60]!r} is not a calendar time: {e}"
        ) from e
    seconds = (moment - _EPOCH) // _SECOND
    _check_epoch(seconds, "deliver_at")
    return seconds * 1000 + _fraction_ms(match.group(7) or "")


def _offset(match: re.Match[str]) -> timezone:
    sign, hours, minutes = match.group(9, 10, 11)
    if sign is None:  # Z or z
        return UTC
    offset = timedelta(hours=int(hours), minutes=int(minutes))
    return timezone(-offset if sign == "-" else offset)


def _fraction_ms(digits: str) -> int:
    """A fraction of a second in milliseconds, rounded up, read as text (any length)."""
    return int(digits[:3].ljust(3, "0")) + (1 if digits[3:].strip("0") else 0)


def _epoch_ms(seconds: float, name: str) -> int:
    _check_epoch(seconds, name)
    return _seconds_to_ms(seconds)


def _seconds_to_ms(seconds: float) -> int:
    """Seconds as the sender wrote them, in milliseconds rounded up.

    A float is read as its shortest decimal text (what JSON carried): in binary,
    2.007 * 1000 is 2007.0000000000002, which would round up to 2008.
    """
    if type(seconds) is int:
        return seconds * 1000
    return math.ceil(Decimal(repr(seconds)).scaleb(3))


def _check_epoch(seconds: float, name: str) -> None:
    if not math.isfinite(seconds) or not 0 <= seconds <= 2 * ABSOLUTE_MAX_COUNTDOWN_SECONDS:
        raise InvalidEnvelope(_R.INVALID_DELIVER_AT, f"{name} {seconds} is not a usable time")


def _optional_text(document: dict[str, Any], name: str) -> bytes | None:
    value = document.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidEnvelope(_R.WRONG_TYPE, f"{name} must be a string, not {_kind(value)}")
    return value.encode("utf-8")


def _json_headers(headers: object) -> tuple[Header, ...]:
    if headers is None:
        return ()
    if not isinstance(headers, dict) or not all(isinstance(v, str) for v in headers.values()):
        raise InvalidEnvelope(_R.WRONG_TYPE, "headers must be an object of string values")
    return _checked_headers(tuple((k, v.encode("utf-8")) for k, v in headers.items()))


def _checked_headers(headers: tuple[Header, ...]) -> tuple[Header, ...]:
    if len(headers) > MAX_HEADERS:
        raise InvalidEnvelope(_R.INVALID_HEADER, f"{len(headers)} headers, at most {MAX_HEADERS}")
    for name, _ in headers:
        if not name or name.lower().startswith(RESERVED_HEADER_PREFIX) or name == CALLER_HEADER:
            raise InvalidEnvelope(
                _R.INVALID_HEADER,
                f"header {name[:60]!r} is reserved (blackbox-*, {CALLER_HEADER}) or empty",
            )
        if len(name.encode("utf-8", "surrogatepass")) > MAX_HEADER_NAME_BYTES:
            raise InvalidEnvelope(
                _R.INVALID_HEADER, f"header {name[:60]!r}... is over {MAX_HEADER_NAME_BYTES} bytes"
            )
    return headers


def _id(value: object, name: str) -> str:
    if not isinstance(value, str):
        raise InvalidEnvelope(_R.WRONG_TYPE, f"{name} must be a string, not {_kind(value)}")
    if not value or len(value) > MAX_ID_CHARS or not value.isprintable():
        raise InvalidEnvelope(
            _R.INVALID_ID, f"{name} must be 1-{MAX_ID_CHARS} printable characters"
        )
    return value


def _key_text(key: bytes) -> str:
    try:
        return key.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InvalidEnvelope(_R.INVALID_ID, "the record key (the id) is not UTF-8") from e


def _field(document: dict[str, Any], name: str) -> Any:
    if name not in document:
        raise InvalidEnvelope(_R.MISSING_FIELD, f"the field {name!r} is missing")
    return document[name]


def _kind(value: object) -> str:
    names = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}
    return names.get(type(value), "number")
