"""The intake loop: a poll's walk, one stage per module, in the order a reader follows it.

A poll's records are *gathered* (`_consume`), *sorted* each into a write or a refusal
(sorting.py), refusals *dead-lettered*, writes *kept* in the store topic where one is set
(keeping.py) and *applied* in Redis part by part (applying.py), then *answered*
(answering.py, answers.py), their offsets stored once the answers landed.

Offsets are stored only after every record of a batch was either written to Redis or
acknowledged by the dead-letter topic. If Redis or the broker fails, the consumer is
rewound to the batch's first offsets and backs off, so nothing is committed and nothing
is lost; the writes are idempotent, so the retry cannot store anything twice.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence

import redis
import structlog
from confluent_kafka import (
    Consumer,
    KafkaException,
    Message,
    TopicPartition,
)

from blackbox.backoff import Backoff
from blackbox.clock import now_ms
from blackbox.errors import BlackboxError
from blackbox.firing.nudges import Nudge
from blackbox.intake import answering, retrying
from blackbox.intake.answers import Answers
from blackbox.intake.batch import Batch
from blackbox.intake.config import IntakeConfig
from blackbox.intake.crashguard import CrashGuard
from blackbox.intake.gaps import GapCheck, Partition
from blackbox.intake.identity import Identity
from blackbox.intake.incarnations import Incarnations
from blackbox.intake.keeping import Keeping
from blackbox.intake.nonces import Nonces
from blackbox.intake.placement import Placement
from blackbox.intake.quotas import Quotas
from blackbox.intake.restating import Restating
from blackbox.intake.sorting import Sorting
from blackbox.kafka import deadletter
from blackbox.kafka.deadletter import DeadLetter
from blackbox.kafka.outbox import Outbox
from blackbox.kafka.storetopic import StoreUnavailable
from blackbox.metrics import Metrics
from blackbox.schedule import Schedule
from blackbox.storage.applying import (
    Applied,
    Move,
)
from blackbox.storage.store import RedisStore
from blackbox.storage.watermarks import Watermarks

log = structlog.get_logger("blackbox.intake.loop")
# How long one poll waits for a record; also how soon intake sees a stop.
POLL_SECONDS = 0.5
# A pause this long ends the window of gathering records early (see _consume; the window
# is IntakeConfig's, BLACKBOX_INTAKE_WINDOW_MS).
PAUSE_SECONDS = 0.005
# How long a stopping intake waits for its last answers before committing.
FINAL_ANSWER_SECONDS = 3.0
# Records parsed before their part is sent to Redis: small enough that Redis applies one
# part while the next is parsed, large enough that a script call carries many.
PART_RECORDS = 100


class DeadLetterUnavailable(BlackboxError):
    """The dead-letter topic did not acknowledge a record; the batch must be retried."""


class Intake:
    """Consumes the intake topic into the store."""

    def __init__(  # noqa: PLR0913 - its collaborators, each injected
        self,
        consumer: Consumer,
        store: RedisStore,
        outbox: Outbox,
        config: IntakeConfig,
        metrics: Metrics,
        *,
        incarnations: Incarnations,
        guard: CrashGuard,
        nonces: Nonces,
        keeping: Keeping | None = None,
        restating: Restating | None = None,
        on_scheduled: Nudge = lambda _shard, _due_ms: None,
        on_refused_for_memory: Callable[[bool], None] = lambda _refused: None,
        on_stopped: Callable[[Sequence[Partition]], None] = lambda _partitions: None,
    ) -> None:
        """`on_stopped` is told the partitions whose Redis lost data, whenever they change;
        `keeping` writes to the store topic, where one is set (keeping.py), and
        `restating` writes again what Redis holds of ids stored anew as they ended
        (restating.py)."""
        self.keeping = keeping
        self.restating = restating
        self.on_scheduled = on_scheduled
        self.incarnations = incarnations
        self.guard = guard
        self.nonces = nonces
        self.identity = Identity(config.policy)
        self.quotas = Quotas(store, config.policy)
        self.placement = Placement(consumer, store)
        self.on_refused_for_memory = on_refused_for_memory
        self.consumer = consumer
        self.store = store
        self.outbox = outbox
        self.config = config
        self.metrics = metrics
        self.backoff = Backoff(base=0.2, cap=10.0)
        self.answers = Answers(consumer, outbox, config.events_topic, metrics)
        self.known = Watermarks()
        self.gaps = GapCheck(
            consumer, store, self.known, config.gaps, metrics, seek=self._seek,
            tag=lambda topic: self.incarnations.tags([topic])[topic], on_stopped=on_stopped,
        )  # fmt: skip
        self.sorting = self._sorting()

    def _sorting(self) -> Sorting:
        """The stage that makes each record a write or a refusal (sorting.py)."""
        return Sorting(self.config, self.metrics, self.store, identity=self.identity,
                       placement=self.placement, quotas=self.quotas, nonces=self.nonces,
                       gaps=self.gaps, known=self.known)  # fmt: skip

    def run(self, stop: threading.Event) -> None:
        """Consume until `stop` is set, then close the consumer (committing what was stored)."""
        self.consumer.subscribe(
            list(self.config.topics), on_assign=self._assigned, on_revoke=self._revoked
        )
        log.info("intake_started", topics=list(self.config.topics))
        died = True
        try:
            while not stop.is_set():
                self.poll_once(stop)
            died = False
        finally:
            # Let the last answers land (briefly: the service stops within seconds), then commit.
            self.answers.settle(threading.Event(), retry=False, wait_seconds=FINAL_ANSWER_SECONDS)
            if died:  # its crash notes stay for the next owner (crashguard.py)
                self.guard.died()
            else:
                self.guard.stopped()
            self.consumer.close()
            log.info("intake_stopped")

    def poll_once(self, stop: threading.Event) -> None:
        """Consume one batch and handle it, backing off and rewinding if a dependency fails."""
        self.gaps.run()
        if self.restating is not None:
            self.restating.run(self.gaps.assigned - self.gaps.stopped.keys(), stop)
        records = self._unheld(self._admitted([m for m in self._consume() if self._is_record(m)]))
        if not records:
            self.answers.settle(stop)
            return
        try:
            records = self._one_at_a_time_after_crashes(records)
            self.handle(records, stop)
            self.backoff.reset()
            self.on_refused_for_memory(False)
        except (redis.RedisError, KafkaException, DeadLetterUnavailable, StoreUnavailable) as e:
            # A full Redis refuses intake's writes until firing has freed room.
            self.on_refused_for_memory(isinstance(e, redis.exceptions.OutOfMemoryError))
            dependency = "redis" if isinstance(e, redis.RedisError) else "kafka"
            self.metrics.dependency_errors.labels(dependency=dependency).inc()
            if dependency == "redis":  # it may have failed over: check what it still holds
                self.gaps.suspect()
            delay = self.backoff.next()
            log.warning("intake_paused", dependency=dependency, error=str(e), retry_in_s=delay)
            self.guard.interrupted(records)
            self._rewind(records)
            stop.wait(delay)

    def _consume(self) -> list[Message]:
        """Up to a batch of records: the first as soon as it comes, then what comes within
        the window after it (a backlog fills the batch at once), while records keep coming:
        the window ends at the first pause of PAUSE_SECONDS. A steady stream then costs a
        Redis write, a crash note and an answer request per window, not per record; a
        lone record waits the pause only. A record waits the window at most (its due time
        runs from its timestamp, so only a countdown shorter than the window is late by
        it)."""
        first = self.consumer.poll(POLL_SECONDS)
        if first is None or self.config.batch == 1:
            return [] if first is None else [first]
        records = [first, *self.consumer.consume(self.config.batch - 1, timeout=0)]
        closes = time.monotonic() + self.config.window_s
        while len(records) < self.config.batch and (left := closes - time.monotonic()) > 0:
            more = self.consumer.consume(
                self.config.batch - len(records), timeout=min(left, PAUSE_SECONDS)
            )
            if not more:
                break
            records += more
        return records

    def _one_at_a_time_after_crashes(self, records: list[Message]) -> list[Message]:
        """The records to handle now; where a handler died, the rest are read again."""
        now, later = self.guard.careful(records)
        if later:
            self._rewind(later)
        return now

    def _admitted(self, records: list[Message]) -> list[Message]:
        """The records up to the first of a restarted topic; the rest are read again."""
        count = self.incarnations.admit(records)
        if count < len(records):
            first = records[count]
            log.warning("intake_topic_restarted", topic=first.topic(),
                        partition=first.partition(), offset=first.offset())  # fmt: skip
            self._rewind(records[count:])
        return records[:count]

    def _unheld(self, records: list[Message]) -> list[Message]:
        """The records of partitions checked for gaps and not stopped; the rest are read
        again once their partition may be read (gaps.py)."""
        if not self.gaps.holding:
            return records
        held = [m for m in records if self.gaps.held((m.topic() or "", m.partition() or 0))]
        if held:
            self._rewind(held)
            return [m for m in records if not self.gaps.held((m.topic() or "", m.partition() or 0))]
        return records

    def handle(self, records: Sequence[Message], stop: threading.Event) -> None:
        """Dead-letter bad records, apply the rest, answer each, store the offsets, then
        clear the crash guard's note of them.
        The partition counts a signed record is checked against are read first: a broker
        that cannot tell them fails the batch before anything of it is applied."""
        self.placement.prepare({(m.topic() or "", m.partition() or 0) for m in records})
        now = now_ms()
        self.quotas.sweep(now)
        batch = Batch(self.incarnations.tags({m.topic() or "" for m in records}))
        batch.poisoned = self.guard.note(records)
        codes = self._apply_in_parts(records, now, batch, stop)
        self.gaps.record_refreshed()
        try:
            self._keep_after(batch, codes, stop)
        except (StoreUnavailable, redis.RedisError):
            self._answer(batch, codes, now, stop, offsets=[])  # a re-read skips them
            raise
        self._answer(batch, codes, now, stop, batch.next_offsets())
        # Last: a death anywhere before (answering, encoding, the producer's native code)
        # is charged to the records it met.
        self.guard.ended(records)

    def _apply_in_parts(
        self, records: Sequence[Message], now: int, batch: Batch, stop: threading.Event
    ) -> list[Applied]:
        """Parse the records and send them to Redis part by part: Redis applies one part
        while the next is parsed. A part's dead letters go first: its Redis write moves
        the partition watermark past every record parsed so far.

        If the dead-letter topic refuses, or Redis refuses a part for memory, the parts
        applied before are answered before the error goes up: re-read after the rewind,
        they are skipped as applied already.
        """
        with self.store.applying(now, self.known) as applying:
            for start in range(0, len(records), PART_RECORDS):
                for message in records[start : start + PART_RECORDS]:
                    self.sorting.sort(message, now, batch)
                try:
                    self.sorting.refuse_replays(batch)
                    self.sorting.refuse_over_quota(batch, now)
                    self._keep_ahead(batch, stop)
                    self._send_dead_letters(batch.unlanded(), stop)
                except (DeadLetterUnavailable, StoreUnavailable, redis.RedisError):
                    self._answer(batch, applying.codes(), now, stop, offsets=[])
                    raise
                batch.all_landed()
                applying.send(batch.take_slices())
            try:
                return applying.codes()
            except redis.exceptions.OutOfMemoryError:
                # Redis filled up part way: answer the parts that ran (a re-read skips them).
                self._answer(batch, applying.partial, now, stop, offsets=[])
                raise

    def _keep_ahead(self, batch: Batch, stop: threading.Event) -> None:
        """Write the part's requests to the store topic before Redis applies them."""
        if self.keeping is not None:
            writes = [write for items in batch.unsent.values() for _, write in items]
            kept = iter(self.keeping.ahead(writes, stop))
            for items in batch.unsent.values():  # index mode: each carries its reference
                items[:] = [(offset, next(kept)) for offset, _ in items]

    def _keep_after(self, batch: Batch, codes: Sequence[Applied], stop: threading.Event) -> None:
        """Write what Redis holds where it did not apply a request as written ahead."""
        if self.keeping is not None:
            self.keeping.after(((write, code) for _, write, code in batch.applied(codes)), stop)

    def _answer(
        self, batch: Batch, codes: Sequence[Applied | None], now: int, stop: threading.Event,
        offsets: list[TopicPartition],
    ) -> None:  # fmt: skip
        """Count what applying did, wake the dispatcher for the soonest due time, and answer
        each request applied (None: not applied) and each refusal dead-lettered; `offsets`
        are stored for commit once the answers land."""
        events, earliest = batch.refusals[: batch.landed], dict[int, int]()
        shard_of = self.store.layout.shard_of
        for coordinates, write, code in batch.applied(codes):
            if code is None or code is Applied.REPLAYED:
                continue
            where = (coordinates.topic, coordinates.partition, coordinates.offset)
            if not self.gaps.handled_before(*where):  # answered before the gap: not again
                events.append(answering.event_of(coordinates, write, code))
            if isinstance(write, Schedule) and code is Applied.SCHEDULED:
                retrying.count(write, self.metrics)
            if isinstance(write, Schedule | Move) and code in answering.STORED:
                shard = shard_of(write.id)
                earliest[shard] = min(earliest.get(shard, write.due_ms), write.due_ms)
        for code, count in Counter(c for c in codes if c is not None).items():
            self.metrics.intake_records.labels(outcome=answering.label(code)).inc(count)
        self.metrics.intake_records.labels(outcome="dead_lettered").inc(batch.landed)
        for shard, due_ms in earliest.items():  # before waiting for the last poll's answers
            self.on_scheduled(shard, due_ms)
        self.answers.settle(stop)
        self.answers.submit(events, now, offsets)

    def _send_dead_letters(self, dead: list[DeadLetter], stop: threading.Event) -> None:
        results = deadletter.send(self.outbox, self.config.dlq_topic, dead, stop)
        errors = [e for _, e in results if e is not None]
        if errors:
            raise DeadLetterUnavailable(
                f"{len(errors)} dead letters unacknowledged: {errors[0].str()}"
            )
        for letter in dead:
            self.metrics.dead_letters.labels(reason=letter.reason.value).inc()

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
                self._seek(topic, partition, offset)
            except (
                KafkaException
            ) as e:  # the partition was revoked meanwhile: its new owner reads it
                log.info("intake_rewind_skipped", topic=topic, partition=partition, error=str(e))

    def _seek(self, topic: str, partition: int, offset: int) -> None:
        """Move the consumer to `offset` of the partition (KafkaException if it cannot)."""
        self.incarnations.rewound(topic, partition, offset)
        self.guard.moved([(topic, partition)])
        self.consumer.seek(TopicPartition(topic, partition, offset))

    def _assigned(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """New partitions: their topic may have been created again since intake last read
        it, and their last owner may have died on a record (crashguard.py)."""
        self.incarnations.forget((p.topic, p.partition) for p in partitions)
        self.placement.forget({p.topic for p in partitions})  # a topic may have grown
        self.guard.assigned((p.topic, p.partition) for p in partitions)
        self.gaps.assign((p.topic, p.partition) for p in partitions)
        log.info("intake_assigned", partitions=sorted(p.partition for p in partitions))

    def _revoked(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.guard.revoked((p.topic, p.partition) for p in partitions)
        self.gaps.revoke((p.topic, p.partition) for p in partitions)
        log.info("intake_revoked", partitions=sorted(p.partition for p in partitions))
