"""Dead-letter records: what they carry, so an operator can see why and replay.

A dead-lettered intake record is copied unchanged (value, key, headers) with the reason,
a readable detail and its original coordinates added as headers. An undeliverable
schedule carries its stored value, its id and its target topic.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from confluent_kafka import KafkaError, Message

from blackbox.envelope import Header
from blackbox.errors import DeadLetterReason
from blackbox.kafka.clients import lasting_reason
from blackbox.kafka.outbox import Outbox, Record

REASON_HEADER = "blackbox-dlq-reason"
DETAIL_HEADER = "blackbox-dlq-detail"
MAX_DETAIL_BYTES = 1024
# The headers blackbox adds to a dead letter, after the record's own.
OWN_HEADERS = frozenset({
    REASON_HEADER, DETAIL_HEADER, "blackbox-dlq-topic", "blackbox-dlq-partition",
    "blackbox-dlq-offset", "blackbox-dlq-value-omitted", "blackbox-id", "blackbox-target-topic",
})  # fmt: skip
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


def without_record_headers(letter: DeadLetter) -> DeadLetter:
    """The dead letter with only blackbox's own headers: the record's were too large too."""
    size = sum(len(name) + len(value or b"") for name, value in letter.headers)
    kept: dict[str, bytes | None] = {}
    for name, value in reversed(letter.headers):  # blackbox's come last: a record's own
        if name in OWN_HEADERS and name not in kept:  # of the same name is left out
            kept[name] = value
    omitted = ("blackbox-dlq-headers-omitted", f"too large: {size} bytes".encode())
    return DeadLetter(letter.value, letter.key, [*reversed(kept.items()), omitted], letter.reason)


def send(
    outbox: Outbox, topic: str, letters: list[DeadLetter], stop: threading.Event | None = None
) -> list[tuple[DeadLetter, KafkaError | None]]:
    """Produce dead letters; return each with its final error (None when acknowledged).

    A letter refused for a lasting reason (its value too large for the dead-letter topic
    too) is sent again without its value, then, if its headers alone are too large, without
    the record's own headers too, loudly marked, rather than blocking intake forever.
    """
    results = _send(outbox, topic, letters, stop)
    for smaller in (without_value, without_record_headers):
        results = _again_smaller(outbox, topic, results, smaller, stop)
    return results


def _again_smaller(
    outbox: Outbox, topic: str, results: list[tuple[DeadLetter, KafkaError | None]],
    smaller: Callable[[DeadLetter], DeadLetter], stop: threading.Event | None,
) -> list[tuple[DeadLetter, KafkaError | None]]:  # fmt: skip
    """The letters refused for a lasting reason sent again made `smaller`."""
    refused = [d for d, e in results if e is not None and lasting_reason(e)]
    if not refused:
        return results
    again = iter(_send(outbox, topic, [smaller(d) for d in refused], stop))
    return [next(again) if e is not None and lasting_reason(e) else (d, e) for d, e in results]


def _send(
    outbox: Outbox, topic: str, letters: list[DeadLetter], stop: threading.Event | None
) -> list[tuple[DeadLetter, KafkaError | None]]:
    if not letters:
        return []
    records = [Record(topic, d.value, d.key, d.headers) for d in letters]
    return list(zip(letters, outbox.send(records, stop), strict=True))
