"""Which producer errors mean the producer itself must be replaced; what a batch's reports hold."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError

from blackbox.clock import now_ms
from blackbox.kafka.outbox import NO_REPORT, Outbox, Record, Reports, is_fenced


@pytest.mark.parametrize(
    "code",
    [KafkaError._FATAL, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH,
     KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER],
)  # fmt: skip
def test_fatal_producer_errors_are_fenced(code: int) -> None:
    """After these an idempotent producer sends nothing more (seen after a broker outage)."""
    assert is_fenced(KafkaError(code))


@pytest.mark.parametrize(
    "error",
    [None, NO_REPORT, KafkaError(KafkaError._MSG_TIMED_OUT),
     KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART), KafkaError(KafkaError.MSG_SIZE_TOO_LARGE)],
)  # fmt: skip
def test_ordinary_failures_keep_the_producer(error: KafkaError | None) -> None:
    """Timeouts and per-record refusals are retried or dead-lettered on the same producer."""
    assert not is_fenced(error)


def test_an_error_flagged_fatal_is_fenced_whatever_its_code() -> None:
    assert is_fenced(KafkaError(KafkaError._MSG_TIMED_OUT, "fatal", fatal=True))


def test_reports_keep_each_error_and_when_the_last_came() -> None:
    """The lateness metric uses when the broker answered, not when the batch was settled."""
    reports = Reports(2)
    assert reports.errors == [NO_REPORT, NO_REPORT] and reports.pending == 2
    before = now_ms()
    reports.report(1, None, None)
    reports.report(0, KafkaError(KafkaError._MSG_TIMED_OUT), None)
    assert reports.pending == 0
    assert reports.errors[1] is None and reports.errors[0] is not None
    assert before <= reports.last_ms <= now_ms()


def test_all_landed_clears_only_the_records_without_a_report() -> None:
    """A producer reporting only failures: a record never reported landed, a failure stays."""
    reports = Reports(3)
    failure = KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)
    reports.report(1, failure, None)
    reports.all_landed()
    assert reports.errors == [None, failure, None] and reports.pending == 0


class _HeldProducer:
    """Holds what it is given and reports nothing: a broker that never answers."""

    def __init__(self) -> None:
        self.held = 0
        self.closed = False

    def produce(self, *_args: object, **_kwargs: object) -> None:
        self.held += 1

    def poll(self, _timeout: float = 0) -> int:
        return 0

    def flush(self, _timeout: float = 0) -> int:
        return self.held

    def purge(self, *_args: object, **_kwargs: object) -> None:
        self.held = 0

    def close(self) -> bool:
        self.closed = True
        return True

    def __len__(self) -> int:
        return self.held


def test_an_empty_new_producer_does_not_vouch_for_records_sent_on_the_old_one() -> None:
    """Guarantee 1: with failure-only reports, records handed to a producer that was since
    replaced stay unreported (and so are sent again), however empty the new one is."""
    old, new = _HeldProducer(), _HeldProducer()
    outbox = Outbox(old, wait_seconds=0.05, only_errors=True)  # type: ignore[arg-type]
    reports = outbox.submit([Record("t", b"a"), Record("t", b"b")])
    outbox.producer = new  # type: ignore[assignment]  # as _replace_producer does
    assert outbox.wait(reports) == [NO_REPORT, NO_REPORT]
    outbox.producer = old  # type: ignore[assignment]
    old.held = 0  # the broker answered at last
    assert outbox.wait(reports) == [None, None]


def test_closing_counts_what_was_left_and_closes_the_producer() -> None:
    """Closing an outbox tells how many records never landed, then closes its producer (its
    connections end now, not whenever the collector frees it), nothing left to wait for."""
    producer = _HeldProducer()
    outbox = Outbox(producer, wait_seconds=0.05)  # type: ignore[arg-type]
    outbox.submit([Record("t", b"a"), Record("t", b"b")])
    assert outbox.close(0.01) == 2
    assert producer.closed and producer.held == 0
