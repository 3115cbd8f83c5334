"""Answers: the events answering one poll's records, on their way to the events topic
while the next poll is parsed and applied; the poll's offsets are stored for commit once
they landed.

The requests are applied already (a re-read would skip them), so a failed answer is sent
again here rather than by rewinding; only a lasting refusal, or stopping, drops one.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass

import structlog
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from blackbox.backoff import Backoff
from blackbox.kafka.clients import lasting_reason
from blackbox.kafka.events import Event
from blackbox.kafka.outbox import Outbox, Record, Reports
from blackbox.metrics import Metrics

log = structlog.get_logger("blackbox.intake.answers")


@dataclass(frozen=True, slots=True)
class _OnTheirWay:
    """A handled poll's answers; its offsets are stored once they land."""

    reports: Reports
    records: list[Record]
    offsets: list[TopicPartition]


class Answers:
    """Sends a poll's answers, and stores its offsets once they landed."""

    def __init__(
        self, consumer: Consumer, outbox: Outbox, events_topic: str, metrics: Metrics
    ) -> None:
        self.consumer = consumer
        self.outbox = outbox
        self.events_topic = events_topic
        self.metrics = metrics
        self._last: _OnTheirWay | None = None

    def submit(self, events: Sequence[Event], now: int, offsets: list[TopicPartition]) -> None:
        """Send one poll's answers in the order their records were read (a refusal after
        an applied request about the same id, never before it); `offsets` (none for a poll
        read again) are stored when they land. The last poll's must be settled first."""
        assert self._last is None, "the last poll's answers are settled first"
        records = [e.record(self.events_topic, now) for e in sorted(events, key=_intake_order)]
        self._last = _OnTheirWay(self.outbox.submit(records), records, offsets)

    def settle(
        self, stop: threading.Event, *, retry: bool = True, wait_seconds: float | None = None
    ) -> None:
        """Wait for the last poll's answers (sending failed ones again until `stop`, unless
        not `retry`), then store its offsets for commit."""
        last, self._last = self._last, None
        if last is None:
            return
        errors = self.outbox.wait(last.reports, stop, wait_seconds)
        unsent = self._resend(last.records, errors, stop if retry else None)
        if unsent:
            self.metrics.events_dropped.inc(len(unsent))
            log.error("events_lost_on_stop", count=len(unsent))
        if not last.offsets:  # answers to a poll that is read again
            return
        try:
            self.consumer.store_offsets(offsets=last.offsets)
        except KafkaException as e:  # revoked meanwhile: its new owner re-reads and skips
            log.info("offsets_not_stored", error=str(e))

    def _resend(
        self, records: list[Record], errors: list[KafkaError | None], stop: threading.Event | None
    ) -> list[Record]:
        """Send failed answers again until they land or `stop`; return those never sent."""
        records = self._passing_failures(records, errors)
        backoff = Backoff(base=0.2, cap=10.0)
        while records and stop is not None and not stop.is_set():
            self.metrics.dependency_errors.labels(dependency="kafka").inc()
            log.warning("events_unacknowledged", count=len(records))
            stop.wait(backoff.next())
            records = self._passing_failures(records, self.outbox.send(records, stop))
        return records

    def _passing_failures(
        self, records: list[Record], errors: list[KafkaError | None]
    ) -> list[Record]:
        """The records that failed for a reason that may pass; lasting refusals are dropped."""
        passing = []
        for record, error in zip(records, errors, strict=True):
            if error is None:
                continue
            if lasting_reason(error) is None:
                passing.append(record)
            else:
                self.metrics.events_dropped.inc()
                log.error("event_dropped", error=error.str())
        return passing


def _intake_order(event: Event) -> tuple[str, int, int]:
    """Where an answer's record lies on the intake topic."""
    where = event.intake
    return ("", -1, -1) if where is None else (where.topic, where.partition, where.offset)
