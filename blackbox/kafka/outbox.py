"""Produce a batch of records and wait for the broker's report on each, within a deadline.

Used for every write blackbox makes to Kafka (deliveries and dead letters): nothing is
considered sent until its delivery report says so.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

import structlog
from confluent_kafka import KafkaError, KafkaException, Message, Producer

from blackbox.clock import now_ms
from blackbox.envelope import Header
from blackbox.kafka import clients

log = structlog.get_logger("blackbox.kafka.outbox")

# A report still missing when the wait ended; the message may or may not have landed.
NO_REPORT = KafkaError(KafkaError._TIMED_OUT, "no delivery report before the deadline")
_QUEUE_FULL_RETRIES = 100
_Callback = Callable[[KafkaError | None, Message], None]


# Not frozen: one is built per message on the hot path, and a frozen dataclass is
# several times slower to build. Treat it as immutable all the same.
@dataclass(slots=True)
class Record:
    """One record to produce."""

    topic: str
    value: bytes | None
    key: bytes | None = None
    headers: Sequence[Header] = ()
    partition: int | None = None  # None: the producer's partitioner places it


class Reports:
    """Delivery reports of one batch, filled in by the producer's callbacks."""

    def __init__(self, size: int, producer: Producer | None = None) -> None:
        self.errors: list[KafkaError | None] = [NO_REPORT] * size
        self.pending = size
        self.last_ms = 0  # when the latest report came (epoch ms)
        self.producer = producer  # the one the records were handed to

    def report(self, index: int, error: KafkaError | None, _message: Message | None) -> None:
        self.errors[index] = error
        self.pending -= 1
        self.last_ms = now_ms()

    def withdraw_after(self, count: int) -> None:
        """Only the first `count` records were produced: the rest are no part of the batch."""
        self.pending -= len(self.errors) - count
        del self.errors[count:]

    def all_landed(self) -> None:
        """Every record without a report landed (a producer that reports only errors)."""
        self.errors = [None if e is NO_REPORT else e for e in self.errors]
        self.pending = 0


class Placed(Reports):
    """Reports that keep where each acknowledged record landed: (partition, offset)."""

    def __init__(self, size: int, producer: Producer | None = None) -> None:
        super().__init__(size, producer)
        self.places: list[tuple[int, int] | None] = [None] * size

    def report(self, index: int, error: KafkaError | None, message: Message | None) -> None:
        if error is None and message is not None:
            self.places[index] = (message.partition() or 0, message.offset() or 0)
        super().report(index, error, message)


# Errors after which an idempotent producer can send nothing more: only a new one can.
_FENCED = frozenset({
    KafkaError._FATAL, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH,
    KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER,
})  # fmt: skip


def is_fenced(error: KafkaError | None) -> bool:
    """Whether an error leaves the producer unusable (librdkafka's fatal errors)."""
    return error is not None and (error.fatal() or error.code() in _FENCED)


class Outbox:
    """A producer that sends batches and returns one error (or None) per record.

    When the producer is fenced (a fatal error of the idempotent producer, seen after a
    broker outage), it is replaced by a new one from `renew`; the failed records are
    reported as failed, and their senders retry them on the new producer.

    With `only_errors`, the producer (and every one `renew` makes) reports failures only
    (`delivery.report.only.error`): a batch has landed once the producer's queue is empty.
    That spares a report per record, but the outbox must then have its producer to itself
    and wait for one batch at a time.
    """

    def __init__(
        self,
        producer: Producer,
        wait_seconds: float,
        renew: Callable[[], Producer] | None = None,
        *,
        only_errors: bool = False,
    ) -> None:
        self.producer = producer
        self.wait_seconds = wait_seconds
        self.renew = renew
        self.only_errors = only_errors

    def send(
        self, records: Sequence[Record], stop: threading.Event | None = None
    ) -> list[KafkaError | None]:
        """Produce all records, then wait for their reports (None means acknowledged)."""
        return self.wait(self.submit(records), stop)

    def place(self, records: Sequence[Record], stop: threading.Event | None = None) -> Placed:
        """Produce all records and wait for their reports, keeping where each landed (an
        outbox that reports every record, not `only_errors`)."""
        reports = Placed(len(records), self.producer)
        for index, record in enumerate(records):
            self.produce(record, reports, index)
        self.producer.poll(0)
        self.wait(reports, stop)
        return reports

    def submit(self, records: Sequence[Record]) -> Reports:
        """Hand all records to the producer; their reports arrive while others work."""
        reports = self.reports(len(records))
        for index, record in enumerate(records):
            self.produce(record, reports, index)
        self.producer.poll(0)
        return reports

    def reports(self, size: int) -> Reports:
        """The reports of a batch of `size` records, each handed over later by `produce`."""
        return Reports(size, self.producer)

    def produce(self, record: Record, reports: Reports, index: int) -> None:
        """Hand one record of a batch to the producer: its report fills `reports[index]`."""
        self._produce(record, partial(reports.report, index), reports, index)

    def wait(
        self, reports: Reports, stop: threading.Event | None = None, seconds: float | None = None
    ) -> list[KafkaError | None]:
        """Wait for a submitted batch's reports, within the deadline (or `seconds`)."""
        self._wait(reports, stop, self.wait_seconds if seconds is None else seconds)
        if any(is_fenced(e) for e in reports.errors):
            self._replace_producer(next(e for e in reports.errors if is_fenced(e)))
        return reports.errors

    def _replace_producer(self, error: KafkaError | None) -> None:
        if self.renew is None:
            return
        log.error("producer_replaced", error=None if error is None else error.str())
        old, self.producer = self.producer, self.renew()
        old.purge()
        old.poll(0)  # serve the purged records' reports: their senders retry them

    def _produce(self, record: Record, callback: _Callback, reports: Reports, index: int) -> None:
        # -1: librdkafka's "unassigned", the partitioner's choice.
        partition = -1 if record.partition is None else record.partition
        for _ in range(_QUEUE_FULL_RETRIES):
            try:
                self.producer.produce(
                    record.topic, record.value, record.key, partition,
                    # None, not []: an empty list still costs a conversion per record
                    headers=list(record.headers) if record.headers else None,
                    on_delivery=callback,
                )  # fmt: skip
                return
            except BufferError:
                self.producer.poll(0.05)
            except KafkaException as e:
                reports.report(index, e.args[0], None)
                return
        reports.report(index, KafkaError(KafkaError._QUEUE_FULL, "producer queue full"), None)

    def _wait(self, reports: Reports, stop: threading.Event | None, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while self._unsettled(reports) and time.monotonic() < deadline:
            if stop is not None and stop.is_set():
                # Shutting down: drop what never left, keep waiting briefly for the rest.
                self.producer.purge(in_queue=True, in_flight=False)
                self.producer.flush(1.0)
                break
            self.producer.flush(min(0.1, max(0.0, deadline - time.monotonic())))
        # Only the producer the records went to can vouch for them: one replaced meanwhile
        # (fenced) leaves its unreported records unreported, and so retried.
        if self.only_errors and reports.producer is self.producer and len(self.producer) == 0:
            reports.all_landed()

    def _unsettled(self, reports: Reports) -> bool:
        return len(self.producer) > 0 if self.only_errors else reports.pending > 0

    def close(self, timeout: float = 5.0) -> int:
        """Flush what is still queued, then close the producer (its connections end with
        it, not when the collector gets to it); return how many messages were left
        undelivered."""
        left = int(self.producer.flush(timeout))
        clients.close_producer(self.producer)
        return left
