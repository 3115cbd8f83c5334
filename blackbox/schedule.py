"""A Schedule: what is kept in Redis for one pending message, and its compact encoding.

Encoding: a small JSON header, a NUL byte, then the value bytes untouched. JSON text never
holds a raw NUL (orjson escapes control characters), so the first NUL ends the header and
binary values cost no base64.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from blackbox.envelope import Envelope
from blackbox.errors import CorruptSchedule

_SEPARATOR = b"\0"


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
        header: dict[str, object] = {"t": self.topic, "d": self.due_ms}
        if self.caller is not None:
            header["c"] = self.caller.decode("utf-8")
        return orjson.dumps(header) + _SEPARATOR + self.value

    @classmethod
    def decode(cls, schedule_id: str, raw: bytes) -> Schedule:
        head, _, value = raw.partition(_SEPARATOR)
        try:
            header = orjson.loads(head)
            caller, topic = header.get("c"), header["t"]
            if not isinstance(topic, str):
                raise TypeError("the stored topic is not text")
            return cls(
                id=schedule_id,
                topic=topic,
                value=value,
                due_ms=int(header["d"]),
                caller=caller.encode("utf-8") if caller is not None else None,
            )
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as e:
            raise CorruptSchedule(f"schedule {schedule_id!r} cannot be decoded") from e


def intake_id(topic: str, partition: int, offset: int) -> str:
    """The id of a schedule taken from an intake record: stable across re-reads."""
    return f"{topic}:{partition}:{offset}"
