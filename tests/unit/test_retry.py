"""Retry policy, backoff, dead-letter records and delivery records (Guarantees 1, 2 and 5)."""

from __future__ import annotations

import random

import pytest
from confluent_kafka import Message
from hypothesis import given, settings
from hypothesis import strategies as st

from blackbox.backoff import Backoff
from blackbox.envelope import CALLER_HEADER
from blackbox.errors import DeadLetterReason
from blackbox.firing.delivery import delivery_record
from blackbox.firing.retry import RetryPolicy
from blackbox.kafka import deadletter
from blackbox.kafka.clients import read_headers
from blackbox.kafka.deadletter import DETAIL_HEADER, MAX_DETAIL_BYTES, REASON_HEADER, DeadLetter
from blackbox.schedule import Schedule

PROPERTY = settings(max_examples=300, deadline=None, database=None)


def policy(backoff_ms: int = 1000, backoff_max_ms: int = 60_000) -> RetryPolicy:
    """A dispatcher policy with the given backoff and otherwise default settings."""
    return RetryPolicy(
        batch_limit=1000,
        lease_ms=30_000,
        max_attempts=5,
        backoff_ms=backoff_ms,
        backoff_max_ms=backoff_max_ms,
        dlq_topic="blackbox.dlq",
        events_topic="blackbox.events",
    )


def test_retry_delay_doubles_then_caps() -> None:
    """Guarantee 5: the retry delay is base * 2^(attempt-1), capped at backoff_max_ms."""
    delays = [policy().retry_delay_ms(attempt) for attempt in range(1, 10)]
    assert delays == [1000, 2000, 4000, 8000, 16000, 32000, 60000, 60000, 60000]


def test_retry_delay_of_a_huge_attempt_is_the_cap() -> None:
    """An attempt count in the millions still yields the cap, without overflowing."""
    assert policy().retry_delay_ms(10**6) == 60_000


def test_retry_delay_never_exceeds_a_cap_below_the_base() -> None:
    """A cap smaller than the base wins from the first attempt."""
    assert policy(backoff_ms=5000, backoff_max_ms=2000).retry_delay_ms(1) == 2000


@PROPERTY
@given(
    st.integers(min_value=1, max_value=10**7),
    st.integers(min_value=1, max_value=10**8),
    st.integers(min_value=1, max_value=10**4),
)
def test_retry_delay_is_monotonic_and_bounded(base: int, cap: int, attempt: int) -> None:
    """Retry delays never shrink from one attempt to the next and never pass the cap."""
    rules = policy(backoff_ms=base, backoff_max_ms=cap)
    first, second = rules.retry_delay_ms(attempt), rules.retry_delay_ms(attempt + 1)
    assert min(base, cap) <= first <= second <= cap


def test_backoff_bounds_follow_the_doubling_ceiling(monkeypatch: pytest.MonkeyPatch) -> None:
    """Backoff.next lies in [ceiling/2, ceiling], the ceiling doubling from base up to cap."""
    monkeypatch.setattr(random, "uniform", lambda low, high: high)
    highest = Backoff(base=1.0, cap=8.0)
    assert [highest.next() for _ in range(6)] == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    monkeypatch.setattr(random, "uniform", lambda low, high: low)
    lowest = Backoff(base=1.0, cap=8.0)
    assert [lowest.next() for _ in range(6)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]


def test_backoff_with_real_jitter_stays_in_bounds() -> None:
    """With real jitter every delay stays within [ceiling/2, ceiling] and failures are counted."""
    backoff = Backoff(base=0.1, cap=5.0)
    for failures in range(60):
        ceiling = min(5.0, 0.1 * 2.0**failures)
        assert ceiling / 2 <= backoff.next() <= ceiling
    assert backoff.failures == 60


def test_backoff_reset_restarts_from_base(monkeypatch: pytest.MonkeyPatch) -> None:
    """After reset() the next delay is back to the base, as after the first failure."""
    monkeypatch.setattr(random, "uniform", lambda low, high: high)
    backoff = Backoff(base=0.5, cap=30.0)
    for _ in range(10):
        backoff.next()
    backoff.reset()
    assert backoff.failures == 0
    assert backoff.next() == 0.5
    assert backoff.next() == 1.0


def test_backoff_after_very_many_failures_is_the_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    """A dependency away for a long time is retried every cap seconds, without overflow."""
    monkeypatch.setattr(random, "uniform", lambda low, high: high)
    backoff = Backoff(base=1.0, cap=60.0)
    backoff.failures = 10**6
    assert backoff.next() == 60.0


def test_dead_letter_from_schedule_carries_id_target_and_reason() -> None:
    """Guarantee 1: an undeliverable schedule is dead-lettered with value, id, target, reason."""
    letter = deadletter.from_schedule(
        "blackbox:0:7", b"\x00payload", "orders", DeadLetterReason.UNKNOWN_TOPIC, "no such topic"
    )
    assert letter == DeadLetter(
        value=b"\x00payload",
        key=b"blackbox:0:7",
        headers=[
            (REASON_HEADER, b"unknown_topic"),
            (DETAIL_HEADER, b"no such topic"),
            ("blackbox-id", b"blackbox:0:7"),
            ("blackbox-target-topic", b"orders"),
        ],
        reason=DeadLetterReason.UNKNOWN_TOPIC,
    )


def test_dead_letter_of_an_expired_payload_has_no_value_or_target() -> None:
    """Guarantee 1: an expired payload is still dead-lettered, by id, without a target header."""
    letter = deadletter.from_schedule("x:1:2", None, None, DeadLetterReason.EXPIRED, "gone")
    assert letter.value is None
    assert letter.key == b"x:1:2"
    assert letter.headers == [
        (REASON_HEADER, b"expired"),
        (DETAIL_HEADER, b"gone"),
        ("blackbox-id", b"x:1:2"),
    ]


def test_dead_letter_detail_is_truncated() -> None:
    """A long detail is cut to MAX_DETAIL_BYTES so a header never grows without bound."""
    letter = deadletter.from_schedule(
        "id", b"v", None, DeadLetterReason.DELIVERY_FAILED, "x" * 5000
    )
    assert dict(letter.headers)[DETAIL_HEADER] == b"x" * MAX_DETAIL_BYTES


@pytest.mark.parametrize("char", ["é", "€", "😀"])
def test_truncated_detail_stays_valid_utf8(char: str) -> None:
    """The readable detail header stays valid UTF-8 even when the cut falls inside a character."""
    reason = DeadLetterReason.INVALID_TOPIC
    letter = deadletter.from_schedule("id", b"v", None, reason, char * MAX_DETAIL_BYTES)
    detail = dict(letter.headers)[DETAIL_HEADER]
    assert detail is not None
    assert len(detail) <= MAX_DETAIL_BYTES
    assert detail.decode("utf-8").strip(char) == ""


def test_dead_letter_from_intake_copies_the_record_and_adds_origin() -> None:
    """Guarantee 4: a refused record is copied unchanged, with reason, detail and coordinates."""
    message = Message(
        topic="blackbox",
        partition=3,
        offset=42,
        key=b"k",
        value=b"not json",
        headers=[(CALLER_HEADER, b"billing"), ("trace", "abc"), ("empty", None)],
    )
    letter = deadletter.from_intake(
        message, read_headers(message), DeadLetterReason.INVALID_JSON, "value is not JSON"
    )
    assert letter == DeadLetter(
        value=b"not json",
        key=b"k",
        headers=[
            (CALLER_HEADER, b"billing"),
            ("trace", b"abc"),
            ("empty", None),
            (REASON_HEADER, b"invalid_json"),
            (DETAIL_HEADER, b"value is not JSON"),
            ("blackbox-dlq-topic", b"blackbox"),
            ("blackbox-dlq-partition", b"3"),
            ("blackbox-dlq-offset", b"42"),
        ],
        reason=DeadLetterReason.INVALID_JSON,
    )


def test_dead_letter_from_a_tombstone_without_headers() -> None:
    """Guarantee 4: a tombstone with no headers is dead-lettered with only blackbox's headers."""
    message = Message(topic="blackbox", partition=0, offset=1, key=None, value=None)
    letter = deadletter.from_intake(message, [], DeadLetterReason.EMPTY_VALUE, "tombstone")
    assert letter.value is None
    assert [name for name, _ in letter.headers] == [
        REASON_HEADER,
        DETAIL_HEADER,
        "blackbox-dlq-topic",
        "blackbox-dlq-partition",
        "blackbox-dlq-offset",
    ]


def test_dead_letter_of_unreadable_headers_says_they_were_left_out() -> None:
    """Guarantee 4: a record whose headers could not be read (a name not UTF-8) keeps its
    value and key, and a header says its own headers are missing."""
    message = Message(topic="blackbox", partition=0, offset=7, key=b"\xff", value=b"v")
    letter = deadletter.from_intake(message, None, DeadLetterReason.INVALID_HEADER, "bad name")
    assert (letter.value, letter.key) == (b"v", b"\xff")
    assert letter.headers[0] == ("blackbox-dlq-headers-omitted", b"unreadable")
    assert letter.headers[1] == (REASON_HEADER, b"invalid_header")


def test_a_dead_letter_whose_headers_are_too_large_keeps_only_blackboxs() -> None:
    """Guarantee 4: the last resort for a refused record whose own headers are too large
    keeps blackbox's headers (the last of each name: a record's own copy is dropped)."""
    message = Message(topic="blackbox", partition=1, offset=9, key=b"k", value=b"v")
    headers: list[tuple[str, bytes | None]] = [
        ("big", b"x" * 100),
        (REASON_HEADER, b"forged"),
        ("trace", b"t"),
    ]
    letter = deadletter.from_intake(message, headers, DeadLetterReason.INVALID_JSON, "bad")
    small = deadletter.without_record_headers(deadletter.without_value(letter))
    names = [name for name, _ in small.headers]
    assert names == [REASON_HEADER, DETAIL_HEADER, "blackbox-dlq-topic", "blackbox-dlq-partition",
                     "blackbox-dlq-offset", "blackbox-dlq-value-omitted",
                     "blackbox-dlq-headers-omitted"]  # fmt: skip
    assert dict(small.headers)[REASON_HEADER] == b"invalid_json"
    assert (small.value, small.key) == (None, b"k")


def test_delivery_record_carries_dedup_headers() -> None:
    """Guarantee 2: a delivered record carries caller, stable blackbox-id, due time and attempt."""
    schedule = Schedule("blackbox:0:5", "orders", b"\x00bin", 1_700_000_000_000, b"billing")
    record = delivery_record(schedule, attempt=2)
    assert (record.topic, record.value, record.key) == ("orders", b"\x00bin", None)
    assert list(record.headers) == [
        (CALLER_HEADER, b"billing"),
        ("blackbox-id", b"blackbox:0:5"),
        ("blackbox-due-ms", b"1700000000000"),
        ("blackbox-attempt", b"2"),
    ]


def test_delivery_record_without_caller_has_no_caller_header() -> None:
    """A schedule sent without CALLER_SERVICE is delivered without that header."""
    record = delivery_record(Schedule("x:0:1", "orders", b"v", 9), attempt=1)
    assert list(record.headers) == [
        ("blackbox-id", b"x:0:1"),
        ("blackbox-due-ms", b"9"),
        ("blackbox-attempt", b"1"),
    ]


def test_redelivery_keeps_the_same_blackbox_id() -> None:
    """Guarantee 2: a second attempt of one schedule carries the same blackbox-id as the first."""
    schedule = Schedule("blackbox:2:8", "orders", b"v", 100)
    first = dict(delivery_record(schedule, 1).headers)
    second = dict(delivery_record(schedule, 2).headers)
    assert first["blackbox-id"] == second["blackbox-id"] == b"blackbox:2:8"
    assert (first["blackbox-attempt"], second["blackbox-attempt"]) == (b"1", b"2")
