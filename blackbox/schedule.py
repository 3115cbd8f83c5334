"""A Schedule: what is kept in Redis for one pending message, and its compact encoding.

Millions may be pending, so the encoding is binary and small. A plain schedule (no key,
headers or caller's id) uses version 1:

    version  u8      1
    due_ms   i64     big-endian epoch milliseconds
    topic    u8 len  + UTF-8 (Kafka topic names are at most 249 bytes)
    caller   u16 len + UTF-8, 0xFFFF when there is no caller
    value    the rest, untouched (binary-safe, no base64)

Anything richer uses version 2, where a flags byte says which optional parts follow:

    version  u8      2
    due_ms   i64
    flags    u8      1 caller, 2 key, 4 headers, 8 origin, 16 etf1, 32 series, 64 paused,
                     128 partition
    topic    u8 len  + UTF-8
    caller   u16 len + bytes                        (flag 1)
    key      u32 len + bytes                        (flag 2)
    headers  u16 count, each u16 len + name, u32 len + value (0xFFFFFFFF: none) (flag 4)
    origin   u16 len + "topic:partition:offset[:tag]"  (flag 8; up to 289 bytes)
    sent_ms  i64     the intake record's timestamp  (flag 16)
    series   u16 len + JSON: the rule, the occurrence stored and how many fired (flag 32)
    partition i32    the target partition asked for (a consumer's retry)  (flag 128)
    value    the rest

A series' due time is its stored occurrence plus that occurrence's jitter. The paused flag
(64) is the only bit a script sets in place (intake.lua's pause and resume): it sits in the
flags byte, at offset 9.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, replace
from urllib.parse import quote, unquote

import orjson

from blackbox import reference
from blackbox.envelope import MAX_CALLER_CHARS, Envelope, Header
from blackbox.errors import CorruptSchedule, DeadLetterReason, InvalidEnvelope
from blackbox.recurrence import InvalidRecurrence, Recurrence
from blackbox.retries import Retry

_HEAD = struct.Struct(">BqB")
_U16, _U32, _I32, _I64 = (
    struct.Struct(">H"),
    struct.Struct(">I"),
    struct.Struct(">i"),
    struct.Struct(">q"),
)
_NO_CALLER = 0xFFFF
_NO_VALUE = 0xFFFFFFFF
_MAX_TOPIC_BYTES = 255
_CALLER, _KEY, _HEADERS, _ORIGIN, _ETF1, _SERIES, _PAUSED, _PARTITION = 1, 2, 4, 8, 16, 32, 64, 128
_V2_TOPIC_AT = 11  # version, due_ms, flags, topic length
# The caller ends within this many bytes of either encoding (it comes right after the topic,
# and is at most MAX_CALLER_CHARS characters of 4 UTF-8 bytes): what `caller_from_prefix` needs.
CALLER_WITHIN = _V2_TOPIC_AT + _MAX_TOPIC_BYTES + _U16.size + 4 * MAX_CALLER_CHARS
# The latest occurrence a stored series may hold: what intake can store (a due time at
# most 2,000 years after 1970, see envelope.py), far inside what a calendar can name.
MAX_OCCURRENCE_MS = 2 * 1000 * 31_557_600_000
# Ids a caller chose start with this; intake-derived ids start with a topic name.
SCOPED_PREFIX = "@"


@dataclass(frozen=True, slots=True)
class Series:
    """Where a recurring schedule stands: its rule, the occurrence stored (nominal epoch
    ms, before jitter), how many occurrences have fired, and whether it is paused."""

    rule: Recurrence
    occurrence_ms: int
    fired: int = 0
    paused: bool = False

    def encode(self) -> bytes:
        document = {**self.rule.to_json(), "occurrence_ms": self.occurrence_ms,
                    "fired": self.fired}  # fmt: skip
        return orjson.dumps(document)

    @classmethod
    def decode(cls, raw: bytes, paused: bool) -> Series:
        try:
            document = orjson.loads(raw)
            occurrence_ms, fired = document.pop("occurrence_ms"), document.pop("fired")
            if not _whole(occurrence_ms, MAX_OCCURRENCE_MS) or not _whole(fired, 2**63):
                raise ValueError(f"occurrence {occurrence_ms!r}, fired {fired!r}")
            return cls(Recurrence.from_json(document), occurrence_ms, fired, paused)
        except (InvalidRecurrence, KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"series: {e!r}") from e


# Not frozen: one is built per message on the hot path, and a frozen dataclass is
# several times slower to build. Treat it as immutable all the same.
@dataclass(slots=True)
class Schedule:
    """One message to produce to `topic` at `due_ms` (epoch ms), under a stable id.

    `origin` names the intake record ("topic:partition:offset") this version came from,
    when the id is the caller's (so it outlives one version); `sent_ms` is that record's
    timestamp, kept for etf1's `scheduler-timestamp` header.
    """

    id: str
    topic: str
    value: bytes
    due_ms: int
    caller: bytes | None = None
    key: bytes | None = None
    headers: tuple[Header, ...] = ()
    origin: str | None = None
    sent_ms: int | None = None
    # Intake only, never stored: apply only if the id is neither pending nor ended lately.
    if_absent: bool = False
    series: Series | None = None
    # Intake only, never stored: the consumer's retry this schedule carries (metrics).
    retry: Retry | None = None
    # The target partition, when one is asked for (else the producer's partitioner).
    partition: int | None = None
    # Intake only, never stored as such: what Redis keeps in place of the encoding (index
    # mode's reference to its store record, storage/reference.py); None: the encoding.
    stored: bytes | None = None

    @classmethod
    def from_envelope(
        cls, envelope: Envelope, origin: str, received_ms: int, sent_ms: int
    ) -> Schedule:
        """The schedule an intake record at `origin` asks for."""
        scoped = envelope.schedule_id is not None
        schedule_id = scoped_id(envelope.caller, envelope.schedule_id) if scoped else origin  # type: ignore[arg-type]
        series, due_ms = None, 0
        if envelope.recurrence is not None:
            try:
                series = first_occurrence(envelope.recurrence, received_ms)
            except InvalidRecurrence as e:
                raise InvalidEnvelope(DeadLetterReason.INVALID_RECURRENCE, str(e)) from e
            due_ms = series.rule.due_of(schedule_id, series.occurrence_ms)
        return cls(
            id=schedule_id,
            topic=envelope.topic,
            value=envelope.value,
            due_ms=envelope.due_ms(received_ms) if series is None else due_ms,
            caller=envelope.caller,
            key=envelope.key,
            headers=envelope.headers,
            origin=origin if scoped else None,
            sent_ms=sent_ms if envelope.etf1 else None,
            if_absent=envelope.if_absent,
            series=series,
            retry=envelope.retry,
            partition=envelope.partition,
        )

    @property
    def version(self) -> str:
        """What identifies this version of the schedule: its origin, else its id."""
        return self.origin or self.id

    def encode(self) -> bytes:
        topic = self.topic.encode("utf-8")
        if len(topic) > _MAX_TOPIC_BYTES:
            raise ValueError(f"topic of {len(topic)} bytes exceeds {_MAX_TOPIC_BYTES}")
        plain = self.origin is None and self.sent_ms is None and self.series is None
        plain = plain and self.partition is None
        if plain and self.key is None and not self.headers:
            caller = _NO_CALLER if self.caller is None else len(self.caller)
            head = _HEAD.pack(1, self.due_ms, len(topic)) + topic
            return b"".join((head, _U16.pack(caller), self.caller or b"", self.value))
        return self._encode_v2(topic)

    def _encode_v2(self, topic: bytes) -> bytes:
        flags, parts = 0, [b""]
        if self.caller is not None:
            flags |= _CALLER
            parts += [_U16.pack(len(self.caller)), self.caller]
        if self.key is not None:
            flags |= _KEY
            parts += [_U32.pack(len(self.key)), self.key]
        if self.headers:
            flags |= _HEADERS
            parts.append(_U16.pack(len(self.headers)))
            for name, value in self.headers:
                raw = name.encode("utf-8")
                parts += [_U16.pack(len(raw)), raw]
                parts += [_U32.pack(_NO_VALUE)] if value is None else [_U32.pack(len(value)), value]
        if self.origin is not None:
            flags |= _ORIGIN
            origin = self.origin.encode("utf-8")
            parts += [_U16.pack(len(origin)), origin]
        if self.sent_ms is not None:
            flags |= _ETF1
            parts.append(_I64.pack(self.sent_ms))
        if self.series is not None:
            flags |= _SERIES | (_PAUSED if self.series.paused else 0)
            rule = self.series.encode()
            parts += [_U16.pack(len(rule)), rule]
        if self.partition is not None:
            flags |= _PARTITION
            parts.append(_I32.pack(self.partition))
        parts[0] = struct.pack(">BqBB", 2, self.due_ms, flags, len(topic)) + topic
        return b"".join([*parts, self.value])

    @classmethod
    def decode(cls, schedule_id: str, raw: bytes) -> Schedule:
        try:
            if raw[:1] == b"\x01":
                return cls._decode_v1(schedule_id, raw)
            if raw[:1] == b"\x02":
                return _Reader(raw).schedule(schedule_id)
            raise ValueError(f"unknown encoding version {raw[:1]!r}")
        except (struct.error, ValueError, IndexError) as e:
            raise CorruptSchedule(f"schedule {schedule_id!r} cannot be decoded: {e}") from e

    @classmethod
    def _decode_v1(cls, schedule_id: str, raw: bytes) -> Schedule:
        _, due_ms, topic_len = _HEAD.unpack_from(raw)
        at = _HEAD.size + topic_len
        topic = raw[_HEAD.size : at].decode("utf-8")
        (caller_len,) = _U16.unpack_from(raw, at)
        at += _U16.size
        caller = None if caller_len == _NO_CALLER else raw[at : at + caller_len]
        if caller is not None and len(caller) != caller_len:
            raise ValueError("truncated caller")
        value = raw[at + (0 if caller is None else caller_len) :]
        return cls(id=schedule_id, topic=topic, value=value, due_ms=due_ms, caller=caller)


def caller_from_prefix(raw: bytes) -> bytes | None:
    """The caller of an encoded schedule, read from a prefix of its encoding (the first
    CALLER_WITHIN bytes always hold it); nothing after the caller is read. Raises
    CorruptSchedule when the prefix cannot hold one."""
    try:
        if raw[:1] == b"\x01":
            return _caller_at(raw, _HEAD.size + raw[_HEAD.size - 1], absent=_NO_CALLER)
        if raw[:1] == b"\x02":
            if not raw[_V2_TOPIC_AT - 2] & _CALLER:  # the flags byte
                return None
            return _caller_at(raw, _V2_TOPIC_AT + raw[_V2_TOPIC_AT - 1], absent=None)
        if raw[:1] == reference.VERSION:  # index mode's reference (storage/reference.py)
            return _caller_at(raw, reference.CALLER_AT, absent=_NO_CALLER)
        raise ValueError(f"unknown encoding version {raw[:1]!r}")
    except (struct.error, ValueError, IndexError) as e:
        raise CorruptSchedule(f"a schedule's caller cannot be read: {e}") from e


def _caller_at(raw: bytes, at: int, absent: int | None) -> bytes | None:
    """The u16-length caller at `at`; None where its length is the `absent` mark."""
    (size,) = _U16.unpack_from(raw, at)
    if size == absent:
        return None
    caller = raw[at + _U16.size : at + _U16.size + size]
    if len(caller) != size:
        raise ValueError("truncated caller")
    return caller


class _Reader:
    """Reads a version 2 encoding front to back, refusing truncation."""

    def __init__(self, raw: bytes) -> None:
        self.raw, self.at = raw, 0

    def unpack(self, form: struct.Struct) -> int:
        (value,) = form.unpack_from(self.raw, self.at)
        self.at += form.size
        return int(value)

    def take(self, size: int) -> bytes:
        part = self.raw[self.at : self.at + size]
        if len(part) != size:
            raise ValueError("truncated")
        self.at += size
        return part

    def schedule(self, schedule_id: str) -> Schedule:
        _, due_ms, flags, topic_len = struct.unpack_from(">BqBB", self.raw)
        self.at = 11
        topic = self.take(topic_len).decode("utf-8")
        caller = self.take(self.unpack(_U16)) if flags & _CALLER else None
        key = self.take(self.unpack(_U32)) if flags & _KEY else None
        headers = self.headers() if flags & _HEADERS else ()
        origin = self.take(self.unpack(_U16)).decode("utf-8") if flags & _ORIGIN else None
        sent_ms = self.unpack(_I64) if flags & _ETF1 else None
        series = None
        if flags & _SERIES:
            series = Series.decode(self.take(self.unpack(_U16)), bool(flags & _PAUSED))
        partition = self.unpack(_I32) if flags & _PARTITION else None
        return Schedule(
            schedule_id, topic, self.raw[self.at :], due_ms, caller, key, headers, origin,
            sent_ms, series=series, partition=partition,
        )  # fmt: skip

    def headers(self) -> tuple[Header, ...]:
        read: list[Header] = []
        for _ in range(self.unpack(_U16)):
            name = self.take(self.unpack(_U16)).decode("utf-8")
            size = self.unpack(_U32)
            read.append((name, None if size == _NO_VALUE else self.take(size)))
        return tuple(read)


def _whole(value: object, most: int) -> bool:
    return type(value) is int and 0 <= value <= most


def first_occurrence(rule: Recurrence, received_ms: int) -> Series:
    """A new series: its first occurrence at or after `received_ms`, counted from then
    (`every`) unless it names a `start`. Raises InvalidRecurrence when it has none."""
    if rule.every_ms is not None:
        rule = replace(rule, anchor_ms=received_ms if rule.start_ms is None else rule.start_ms)
    first = rule.first(received_ms)
    if first is None:
        raise InvalidRecurrence("the series has no occurrence: its end has passed")
    return Series(rule, first)


def intake_id(topic: str, partition: int, offset: int, incarnation: str = "") -> str:
    """The id of a schedule taken from an intake record: stable across re-reads, and
    distinct for a topic created again under the same name (its `incarnation` tag)."""
    origin = f"{topic}:{partition}:{offset}"
    return f"{origin}:{incarnation}" if incarnation else origin


def origin_topic(origin: str) -> str:
    """The intake topic named by an intake id (topic names hold no ':')."""
    return origin.split(":", 1)[0]


def scoped_id(caller: bytes | None, schedule_id: str) -> str:
    """The stored id of a caller's own id: ``@caller/id``, unique across callers.

    The caller is percent-encoded, so it holds no '/' and the split is unambiguous; a
    record without CALLER_SERVICE has the empty caller (``@/id``).
    """
    owner = "" if caller is None else quote(caller.decode("utf-8"), safe="")
    return f"{SCOPED_PREFIX}{owner}/{schedule_id}"


def owner_of(stored_id: str, caller: bytes | None) -> str:
    """Whose schedule an id is, as its scoped ids name it (percent-encoded, "" for no
    caller): the caller in a scoped id, else `caller` (the record's, for an intake id)."""
    if stored_id.startswith(SCOPED_PREFIX) and "/" in stored_id:
        return stored_id[1 : stored_id.index("/")]
    return "" if caller is None else quote(caller.decode("utf-8"), safe="")


def split_scoped(stored_id: str) -> tuple[bytes | None, str] | None:
    """The (caller, caller's id) a scoped id was built from; None for an intake-derived id."""
    if not stored_id.startswith(SCOPED_PREFIX) or "/" not in stored_id:
        return None
    owner, schedule_id = stored_id[1:].split("/", 1)
    return (unquote(owner).encode("utf-8") if owner else None), schedule_id
