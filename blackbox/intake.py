"""The intake loop: poll -> parse -> store in Redis / dead-letter -> store offsets.

Offsets are stored only after every record of a batch was either written to Redis or
acknowledged by the dead-letter topic. If Redis or the broker fails, the consumer is
rewound to the batch's first offsets and backs off, so nothing is committed and nothing
is lost; the writes are idempotent, so the retry cannot store anything twice.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import redis
import structlog
from confluent_kafka import (
    TIMESTAMP_NOT_AVAILABLE,
    Consumer,
    KafkaException,
    Message,
    TopicPartition,
)

from blackbox import deadletter, envelope
from blackbox.backoff import Backoff
from blackbox.clock import now_ms
from blackbox.deadletter import DeadLetter
from blackbox.envelope import Limits
from blackbox.errors import BlackboxError, InvalidEnvelope
from blackbox.metrics import Metrics
from blackbox.outbox import Outbox
from blackbox.schedule import Schedule, intake_id
from blackbox.store import IntakeSlice, RedisStore

log = structlog.get_logger("blackbox.intake")


class DeadLetterUnavailable(BlackboxError):
    """The dead-letter topic did not acknowledge a record; the batch must be retried."""


@dataclass(slots=True)
class _Batch:
    """The records of one poll: schedules by partition, dead letters, last offsets."""

    schedules: dict[tuple[str, int], list[tuple[int, Schedule]]] = field(default_factory=dict)
    last_offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    dead: list[DeadLetter] = field(default_factory=list)

    def saw(self, topic: str, partition: int, offset: int) -> None:
        self.schedules.setdefault((topic, partition), [])
        self.last_offsets[(topic, partition)] = offset

    def slices(self) -> list[IntakeSlice]:
        return [
            IntakeSlice(topic, partition, self.last_offsets[(topic, partition)], items)
            for (topic, partition), items in self.schedules.items()
        ]

    def next_offsets(self) -> list[TopicPartition]:
        """Per partition, the offset to commit: one past the last record handled."""
        return [TopicPartition(t, p, last + 1) for (t, p), last in self.last_offsets.items()]

    def earliest_due_ms(self) -> int | None:
        dues = [s.due_ms for items in self.schedules.values() for _, s in items]
        return min(dues, default=None)

    def schedule_count(self) -> int:
        return sum(len(items) for items in self.schedules.values())


def received_ms(message: Message, now: int) -> int:
    """The instant a countdown runs from: the record's timestamp, never later than now.

    Using the record's own time makes re-reads after a crash land on the same due time
    and lets records read late (after downtime) fire when their sender meant; a producer
    clock running ahead cannot push a schedule later than its countdown from now.
    """
    kind, stamp = message.timestamp()
    if kind == TIMESTAMP_NOT_AVAILABLE or stamp <= 0:
        return now
    return min(stamp, now)


class Intake:
    """Consumes the intake topic into the store."""

    def __init__(  # noqa: PLR0913 - its collaborators, each injected
        self,
        consumer: Consumer,
        store: RedisStore,
        dead_letters: Outbox,
        config: IntakeConfig,
        metrics: Metrics,
        *,
        on_scheduled: Callable[[int], None] = lambda _due_ms: None,
    ) -> None:
        self.on_scheduled = on_scheduled
        self.consumer = consumer
        self.store = store
        self.dead_letters = dead_letters
        self.config = config
        self.metrics = metrics
        self.backoff = Backoff(base=0.2, cap=10.0)

    def run(self, stop: threading.Event) -> None:
        """Consume until `stop` is set, then close the consumer (committing what was stored)."""
        self.consumer.subscribe(
            [self.config.topic], on_assign=_log_assigned, on_revoke=_log_revoked
        )
        log.info("intake_started", topic=self.config.topic)
        try:
            while not stop.is_set():
                self.poll_once(stop)
        finally:
            self.consumer.close()
            log.info("intake_stopped")

    def poll_once(self, stop: threading.Event) -> None:
        """Consume one batch and handle it, backing off and rewinding if a dependency fails."""
        messages = self.consumer.consume(self.config.batch, timeout=0.5)
        records = [m for m in messages if self._is_record(m)]
        if not records:
            return
        try:
            self.handle(records, stop)
            self.backoff.reset()
        except (redis.RedisError, KafkaException, DeadLetterUnavailable) as e:
            dependency = "redis" if isinstance(e, redis.RedisError) else "kafka"
            self.metrics.dependency_errors.labels(dependency=dependency).inc()
            delay = self.backoff.next()
            log.warning("intake_paused", dependency=dependency, error=str(e), retry_in_s=delay)
            self._rewind(records)
            stop.wait(delay)

    def handle(self, records: Sequence[Message], stop: threading.Event) -> None:
        """Dead-letter bad records, store the rest, then store every offset for commit.

        Dead letters go first: the Redis write moves the partition watermark past every
        record of the batch, so it must come only once all of them are handled.
        """
        now = now_ms()
        batch = _Batch()
        for message in records:
            self._sort(message, now, batch)
        self._send_dead_letters(batch.dead, stop)
        stored = self.store.schedule(batch.slices(), now)
        self.consumer.store_offsets(offsets=batch.next_offsets())
        self._count(batch, stored)
        earliest = batch.earliest_due_ms()
        if earliest is not None:
            self.on_scheduled(earliest)

    def _sort(self, message: Message, now: int, batch: _Batch) -> None:
        topic, partition, offset = (
            message.topic() or "",
            message.partition() or 0,
            message.offset() or 0,
        )
        batch.saw(topic, partition, offset)
        try:
            parsed = envelope.parse(
                message.value(), envelope.normalize_headers(message.headers()), self.config.limits
            )
        except InvalidEnvelope as e:
            batch.dead.append(deadletter.from_intake(message, e.reason, e.detail))
            log.warning("dead_lettered", reason=e.reason.value, detail=e.detail,
                        topic=topic, partition=partition, offset=offset)  # fmt: skip
            return
        schedule = Schedule.from_envelope(
            intake_id(topic, partition, offset), parsed, received_ms(message, now)
        )
        batch.schedules[(topic, partition)].append((offset, schedule))

    def _send_dead_letters(self, dead: list[DeadLetter], stop: threading.Event) -> None:
        results = deadletter.send(self.dead_letters, self.config.dlq_topic, dead, stop)
        errors = [e for _, e in results if e is not None]
        if errors:
            raise DeadLetterUnavailable(
                f"{len(errors)} dead letters unacknowledged: {errors[0].str()}"
            )
        for letter in dead:
            self.metrics.dead_letters.labels(reason=letter.reason.value).inc()

    def _count(self, batch: _Batch, stored: int) -> None:
        received = batch.schedule_count()
        self.metrics.intake_records.labels(outcome="scheduled").inc(stored)
        self.metrics.intake_records.labels(outcome="duplicate").inc(received - stored)
        self.metrics.intake_records.labels(outcome="dead_lettered").inc(len(batch.dead))
        log.debug("intake_batch", scheduled=stored, duplicate=received - stored,
                  dead_lettered=len(batch.dead))  # fmt: skip

    def _is_record(self, message: Message) -> bool:
        error = message.error()
        if error is None:
            return True
        log.warning("intake_consumer_error", error=error.str(), code=error.code())
        return False

    def _rewind(self, records: Sequence[Message]) -> None:
        """Seek each partition back to the first record of the failed batch."""
        first: dict[tuple[str, int], int] = {}
        for m in records:
            tp = (m.topic() or "", m.partition() or 0)
            first[tp] = min(first.get(tp, m.offset() or 0), m.offset() or 0)
        for (topic, partition), offset in first.items():
            try:
                self.consumer.seek(TopicPartition(topic, partition, offset))
            except (
                KafkaException
            ) as e:  # the partition was revoked meanwhile: its new owner reads it
                log.info("intake_rewind_skipped", topic=topic, partition=partition, error=str(e))


def _log_assigned(_consumer: Consumer, partitions: list[TopicPartition]) -> None:
    log.info("intake_assigned", partitions=sorted(p.partition for p in partitions))


def _log_revoked(_consumer: Consumer, partitions: list[TopicPartition]) -> None:
    log.info("intake_revoked", partitions=sorted(p.partition for p in partitions))


@dataclass(frozen=True, slots=True)
class IntakeConfig:
    """What the intake reads, how much at once, and what it accepts."""

    topic: str
    batch: int
    dlq_topic: str
    limits: Limits
