"""Dead-letter records: what they carry, so an operator can see why and replay.

A dead-lettered intake record is copied unchanged (value, key, headers) with the reason,
a readable detail and its original coordinates added as headers. An undeliverable
schedule carries its stored value, its id and its target topic.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from confluent_kafka import KafkaError, Message

from blackbox.envelope import Header
from blackbox.errors import DeadLetterReason
from blackbox.kafka import lasting_reason
from blackbox.outbox import Outbox, Record

REASON_HEADER = "blackbox-dlq-reason"
DETAIL_HEADER = "blackbox-dlq-detail"
MAX_DETAIL_BYTES = 1024
# In place of a record's own headers when they could not be read.
HEADERS_OMITTED: Header = ("blackbox-dlq-headers-omitted", b"unreadable")


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One record for the dead-letter topic."""

    value: bytes | None
    key: bytes | None
    headers: list[Header]
    reason: DeadLetterReason


def _reason_headers(reason: DeadLetterReason, detail: str) -> list[Header]:
    return [
        (REASON_HEADER, reason.value.encode()),
        (DETAIL_HEADER, _truncate(detail, MAX_DETAIL_BYTES)),
    ]


def _truncate(text: str, limit: int) -> bytes:
    """At most `limit` bytes of UTF-8, never ending inside a character."""
    return text.encode("utf-8", "replace")[:limit].decode("utf-8", "ignore").encode("utf-8")


def from_intake(
    message: Message, headers: list[Header] | None, reason: DeadLetterReason, detail: str
) -> DeadLetter:
    """The unchanged intake record, with why it was refused and where it came from.

    `headers` are the record's own, as read once by the intake; None when they could not
    be read (a name not UTF-8), and then a header says they were left out."""
    kept: list[Header] = [HEADERS_OMITTED] if headers is None else headers
    added: list[Header] = [
        ("blackbox-dlq-topic", (message.topic() or "").encode()),
        ("blackbox-dlq-partition", str(message.partition()).encode()),
        ("blackbox-dlq-offset", str(message.offset()).encode()),
    ]
    value, key = message.value(), message.key()
    return DeadLetter(value, key, [*kept, *_reason_headers(reason, detail), *added], reason)


def from_schedule(
    schedule_id: str,
    value: bytes | None,
    target: str | None,
    reason: DeadLetterReason,
    detail: str,
) -> DeadLetter:
    """A schedule that could not be delivered, with its id and intended target."""
    added = [("blackbox-id", schedule_id.encode())]
    if target is not None:
        added.append(("blackbox-target-topic", target.encode()))
    return DeadLetter(
        value, schedule_id.encode(), [*_reason_headers(reason, detail), *added], reason
    )


def without_value(letter: DeadLetter) -> DeadLetter:
    """The same dead letter with its value left out (the header says so and how large)."""
    size = len(letter.value or b"")
    omitted = ("blackbox-dlq-value-omitted", f"{size} bytes".encode())
    return DeadLetter(None, letter.key, [*letter.headers, omitted], letter.reason)


def send(
    outbox: Outbox, topic: str, letters: list[DeadLetter], stop: threading.Event | None = None
) -> list[tuple[DeadLetter, KafkaError | None]]:
    """Produce dead letters; return each with its final error (None when acknowledged).

    A letter refused for a lasting reason (its value too large for the dead-letter topic
    too) is sent again without its value, loudly marked, rather than blocking forever.
    """
    first = _send(outbox, topic, letters, stop)
    retry = [without_value(d) for d, e in first if e is not None and lasting_reason(e)]
    second = iter(_send(outbox, topic, retry, stop))
    return [next(second) if e is not None and lasting_reason(e) else (d, e) for d, e in first]


def _send(
    outbox: Outbox, topic: str, letters: list[DeadLetter], stop: threading.Event | None
) -> list[tuple[DeadLetter, KafkaError | None]]:
    if not letters:
        return []
    records = [Record(topic, d.value, d.key, d.headers) for d in letters]
    return list(zip(letters, outbox.send(records, stop), strict=True))
