"""A Schedule: what is kept in Redis for one pending message, and its compact encoding.

Millions may be pending, so the encoding is binary and small (version 1):

    version  u8      1
    due_ms   i64     big-endian epoch milliseconds
    topic    u8 len  + UTF-8 (Kafka topic names are at most 249 bytes)
    caller   u16 len + UTF-8, 0xFFFF when there is no caller
    value    the rest, untouched (binary-safe, no base64)
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from blackbox.envelope import Envelope
from blackbox.errors import CorruptSchedule

_VERSION = 1
_HEAD = struct.Struct(">BqB")
_CALLER = struct.Struct(">H")
_NO_CALLER = 0xFFFF
_MAX_TOPIC_BYTES = 255


@dataclass(frozen=True, slots=True)
class Schedule:
    """One message to produce to `topic` at `due_ms` (epoch ms), under a stable id."""

    id: str
    topic: str
    value: bytes
    due_ms: int
    caller: bytes | None = None

    @classmethod
    def from_envelope(cls, schedule_id: str, envelope: Envelope, received_ms: int) -> Schedule:
        return cls(
            id=schedule_id,
            topic=envelope.topic,
            value=envelope.value,
            due_ms=received_ms + envelope.countdown_ms,
            caller=envelope.caller,
        )

    def encode(self) -> bytes:
        topic = self.topic.encode("utf-8")
        if len(topic) > _MAX_TOPIC_BYTES:
            raise ValueError(f"topic of {len(topic)} bytes exceeds {_MAX_TOPIC_BYTES}")
        caller = _NO_CALLER if self.caller is None else len(self.caller)
        head = _HEAD.pack(_VERSION, self.due_ms, len(topic)) + topic
        return b"".join((head, _CALLER.pack(caller), self.caller or b"", self.value))

    @classmethod
    def decode(cls, schedule_id: str, raw: bytes) -> Schedule:
        try:
            version, due_ms, topic_len = _HEAD.unpack_from(raw)
            if version != _VERSION:
                raise ValueError(f"unknown encoding version {version}")
            at = _HEAD.size + topic_len
            topic = raw[_HEAD.size : at].decode("utf-8")
            (caller_len,) = _CALLER.unpack_from(raw, at)
            at += _CALLER.size
            caller = None if caller_len == _NO_CALLER else raw[at : at + caller_len]
            if caller is not None and len(caller) != caller_len:
                raise ValueError("truncated caller")
            value = raw[at + (0 if caller is None else caller_len) :]
        except (struct.error, ValueError) as e:
            raise CorruptSchedule(f"schedule {schedule_id!r} cannot be decoded: {e}") from e
        return cls(id=schedule_id, topic=topic, value=value, due_ms=due_ms, caller=caller)


def intake_id(topic: str, partition: int, offset: int) -> str:
    """The id of a schedule taken from an intake record: stable across re-reads."""
    return f"{topic}:{partition}:{offset}"
