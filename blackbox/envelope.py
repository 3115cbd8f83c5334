"""Parse an intake record into an Envelope: pure, no I/O, exact about why a record is bad.

The record value is a JSON object ``{"topic": T, "message": M, "countdown": N}``; the
``CALLER_SERVICE`` header names the sender. Anything else raises InvalidEnvelope with a
reason from the closed DeadLetterReason set and a readable detail.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from blackbox.errors import DeadLetterReason, InvalidEnvelope

CALLER_HEADER = "CALLER_SERVICE"
MAX_CALLER_CHARS = 255
# The longest countdown any limit may allow: due times stay far inside 64-bit milliseconds.
ABSOLUTE_MAX_COUNTDOWN_SECONDS = 1000 * 365.25 * 86400
_TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")

Headers = Sequence[tuple[str, bytes | None]]
RawHeaders = Sequence[tuple[str, str | bytes | None]] | Mapping[str, str | bytes | None]


@dataclass(frozen=True, slots=True)
class Limits:
    """What intake accepts: sizes, horizons and the topics that may never be targets."""

    max_value_bytes: int
    max_countdown_seconds: float
    forbidden_topics: frozenset[str]


@dataclass(frozen=True, slots=True)
class Envelope:
    """A valid schedule request: deliver `value` to `topic` after `countdown_ms`."""

    topic: str
    value: bytes
    countdown_ms: int
    caller: bytes | None


def parse(value: bytes | None, headers: Headers | None, limits: Limits) -> Envelope:
    """Return the Envelope a record asks for, or raise InvalidEnvelope saying why not."""
    caller = caller_of(headers)
    document = _decode(value, limits)
    return Envelope(
        topic=_target_topic(document, limits),
        value=_message_bytes(document),
        countdown_ms=_countdown_ms(document, limits),
        caller=caller,
    )


def normalize_headers(raw: RawHeaders | None) -> list[tuple[str, bytes | None]]:
    """Kafka client headers as (name, bytes) pairs, in order, repeats kept."""
    pairs = raw.items() if isinstance(raw, Mapping) else raw or ()
    return [(k, v.encode() if isinstance(v, str) else v) for k, v in pairs]


def caller_of(headers: Headers | None) -> bytes | None:
    """The CALLER_SERVICE header value, checked to be short UTF-8 text; None when absent."""
    values = [v for k, v in headers or () if k == CALLER_HEADER]
    if not values:
        return None
    if len(values) > 1:
        raise InvalidEnvelope(DeadLetterReason.INVALID_HEADER, f"{CALLER_HEADER} is repeated")
    (raw,) = values
    if raw is None:
        raise InvalidEnvelope(DeadLetterReason.INVALID_HEADER, f"{CALLER_HEADER} has no value")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InvalidEnvelope(
            DeadLetterReason.INVALID_HEADER, f"{CALLER_HEADER} is not UTF-8"
        ) from e
    if not text or len(text) > MAX_CALLER_CHARS or not text.isprintable():
        raise InvalidEnvelope(
            DeadLetterReason.INVALID_HEADER,
            f"{CALLER_HEADER} must be 1-{MAX_CALLER_CHARS} printable characters",
        )
    return raw


def _decode(value: bytes | None, limits: Limits) -> dict[str, Any]:
    if value is None:
        raise InvalidEnvelope(DeadLetterReason.EMPTY_VALUE, "the record has no value (a tombstone)")
    if len(value) > limits.max_value_bytes:
        raise InvalidEnvelope(
            DeadLetterReason.OVERSIZED,
            f"value is {len(value)} bytes, the limit is {limits.max_value_bytes}",
        )
    try:
        document = orjson.loads(value)
    except orjson.JSONDecodeError as e:
        raise InvalidEnvelope(DeadLetterReason.INVALID_JSON, f"value is not JSON: {e}") from e
    if not isinstance(document, dict):
        raise InvalidEnvelope(DeadLetterReason.NOT_AN_OBJECT, f"value is a JSON {_kind(document)}")
    return document


def _target_topic(document: dict[str, Any], limits: Limits) -> str:
    topic = _field(document, "topic")
    if not isinstance(topic, str):
        raise InvalidEnvelope(
            DeadLetterReason.WRONG_TYPE, f"topic must be a string, not {_kind(topic)}"
        )
    if not _TOPIC_NAME.fullmatch(topic) or topic in {".", ".."}:
        raise InvalidEnvelope(
            DeadLetterReason.INVALID_TOPIC, f"{topic[:300]!r} is not a Kafka topic name"
        )
    if topic.startswith("__") or topic in limits.forbidden_topics:
        raise InvalidEnvelope(DeadLetterReason.FORBIDDEN_TOPIC, f"{topic!r} may not be a target")
    return topic


def _message_bytes(document: dict[str, Any]) -> bytes:
    """A JSON string is delivered as its UTF-8 text; any other JSON value as its encoding."""
    message = _field(document, "message")
    if isinstance(message, str):
        return message.encode("utf-8")
    return orjson.dumps(message)


def _countdown_ms(document: dict[str, Any], limits: Limits) -> int:
    countdown = _field(document, "countdown")
    if isinstance(countdown, bool) or not isinstance(countdown, int | float):
        raise InvalidEnvelope(
            DeadLetterReason.WRONG_TYPE, f"countdown must be a number, not {_kind(countdown)}"
        )
    if not math.isfinite(countdown) or countdown < 0:
        raise InvalidEnvelope(
            DeadLetterReason.INVALID_COUNTDOWN, f"countdown {countdown} is not >= 0"
        )
    if countdown > min(limits.max_countdown_seconds, ABSOLUTE_MAX_COUNTDOWN_SECONDS):
        raise InvalidEnvelope(
            DeadLetterReason.INVALID_COUNTDOWN,
            f"countdown {countdown} s is beyond the limit of {limits.max_countdown_seconds} s",
        )
    return math.ceil(countdown * 1000)


def _field(document: dict[str, Any], name: str) -> Any:
    if name not in document:
        raise InvalidEnvelope(DeadLetterReason.MISSING_FIELD, f"the field {name!r} is missing")
    return document[name]


def _kind(value: object) -> str:
    names = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}
    return names.get(type(value), "number")
