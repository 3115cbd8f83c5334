"""A reference: what Redis keeps of a one-off schedule in index mode, in place of its
encoding (schedule.py): its due time, its caller, and where its record lies in the store
topic (kafka/storetopic.py), whose value is the schedule's encoding.

    version   u8      3
    due_ms    i64     big-endian epoch ms (where the encodings keep it: a move rewrites
                      bytes 1 to 9 of either alike)
    flags     u8      0 (never a series: a series stays whole in Redis)
    partition i32     the store record's partition
    offset    i64     and offset
    size      u32     its value's bytes (what a claim's byte budget counts)
    caller    u16 len + bytes, 0xFFFF when there is none (what quotas and the API's
                      ownership checks read, as they read an encoding's)

Firing reads the record back and delivers it with the reference's due time (`resolved`).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

VERSION = b"\x03"
_HEAD = struct.Struct(">BqBiqIH")
_NO_CALLER = 0xFFFF
_DUE = struct.Struct(">q")
CALLER_AT = _HEAD.size - 2  # where the caller's u16 length lies


@dataclass(frozen=True, slots=True)
class Reference:
    """A store record's place, with the due time and caller Redis keeps beside it."""

    due_ms: int
    partition: int
    offset: int
    size: int
    caller: bytes | None = None

    def encode(self) -> bytes:
        caller = _NO_CALLER if self.caller is None else len(self.caller)
        head = _HEAD.pack(3, self.due_ms, 0, self.partition, self.offset, self.size, caller)
        return head + (self.caller or b"")

    @classmethod
    def decode(cls, raw: bytes) -> Reference:
        """Raises ValueError for bytes that are not a whole reference."""
        try:
            version, due_ms, _, partition, offset, size, length = _HEAD.unpack_from(raw)
        except struct.error as e:
            raise ValueError(f"a reference of {len(raw)} bytes: {e}") from e
        if version != 3:
            raise ValueError(f"not a reference: version {version}")
        caller = None if length == _NO_CALLER else raw[_HEAD.size : _HEAD.size + length]
        if caller is not None and len(caller) != length:
            raise ValueError("truncated caller")
        return cls(due_ms, partition, offset, size, caller)


def is_reference(raw: bytes | None) -> bool:
    """Whether a stored payload is a reference rather than an encoding."""
    return raw is not None and raw[:1] == VERSION


def of(encoding: bytes, partition: int, offset: int, caller: bytes | None) -> bytes:
    """The reference to a store record holding `encoding` at (partition, offset)."""
    (due_ms,) = _DUE.unpack_from(encoding, 1)
    return Reference(due_ms, partition, offset, len(encoding), caller).encode()


def resolved(reference: Reference, value: bytes) -> bytes:
    """The encoding a reference stands for: its record's value, due at the reference's
    time (a move rewrites only Redis's copy of it)."""
    return value[:1] + _DUE.pack(reference.due_ms) + value[1 + _DUE.size :]
