"""Settling: what became of the batches sent, written back to Redis.

Each batch is *concluded* by its delivery reports (waiting for the missing ones until its
deadline) and dead-lettered where it must be; then the acks of all of them go in one round
trip per Redis node, whatever their shards, and the rest is *recorded*: a series' next
occurrence stored in the step that forgets this one, what failed given back to due with a
backoff, what was claimed and not due given back at its own time. An id leaves Redis only
after its target topic (or the dead-letter topic) acknowledged it.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

import structlog
from confluent_kafka import KafkaError

from blackbox import tracing
from blackbox.clock import now_ms
from blackbox.errors import DeadLetterReason
from blackbox.firing.batch import Batch
from blackbox.firing.retry import RetryPolicy
from blackbox.firing.shares import Share
from blackbox.kafka import deadletter, storetopic
from blackbox.kafka.clients import lasting_reason
from blackbox.kafka.deadletter import DeadLetter
from blackbox.kafka.events import Event, Outcome
from blackbox.kafka.outbox import Outbox, Record
from blackbox.kafka.storetopic import StoreTopic
from blackbox.metrics import Metrics, observe_all
from blackbox.schedule import Schedule
from blackbox.storage.store import Acks, Advance, Claim, RedisStore

log = structlog.get_logger("blackbox.firing.settling")


@dataclass(slots=True)
class Verdict:
    """What became of one batch's ids."""

    done: list[str]
    retry: dict[int, list[str]]  # attempt -> ids
    delivered: int = 0
    fired: list[str] = field(default_factory=list)  # series' occurrences delivered
    # (error, kind) -> ids: logged once per batch, not once per message (an outage would
    # otherwise write a line per pending message per retry).
    failures: dict[tuple[str, str], list[str]] = field(default_factory=dict)


class Settler:
    """Settles sent batches in Redis."""

    def __init__(  # noqa: PLR0913 - its collaborators, each injected
        self, store: RedisStore, outbox: Outbox, policy: RetryPolicy, metrics: Metrics,
        share: Share, *, keeper: StoreTopic | None = None,
    ) -> None:  # fmt: skip
        """`keeper`: the store topic, where one is set (kafka/storetopic.py)."""
        self.keeper = keeper
        self.store = store
        self.outbox = outbox
        self.policy = policy
        self.metrics = metrics
        self.share = share

    def settle(self, batches: Sequence[Batch], stop: threading.Event) -> int:
        """Settle sent batches: the acks of all of them in one round trip (per Redis node),
        whatever their shards; how many were delivered."""
        if not batches:
            return 0
        verdicts = [self._conclude(batch, stop) for batch in batches]
        acks = [Acks([i for i in v.done if i not in b.advances], b.claim.token, b.claim.shard)
                for b, v in zip(batches, verdicts, strict=True)]  # fmt: skip
        ended: list[tuple[str, bool]] | None = None if self.keeper is None else []
        acked = self.store.ack_all(acks, ended)
        for batch, verdict, count in zip(batches, verdicts, acked, strict=True):
            self._record(batch.claim, verdict, batch.advances, count)
        if self.keeper is not None and ended is not None:
            self._keep(self.keeper, batches, verdicts, ended)
        for batch, verdict in zip(batches, verdicts, strict=True):
            if batch.advances:
                self._answer(_series_events(batch, verdict), stop)
            if batch.later:
                self.store.release(batch.later, batch.claim.token, batch.claim.shard)
                self.share.nudged(batch.claim.shard, min(due for _, due in batch.later))
        return sum(verdict.delivered for verdict in verdicts)

    def _keep(
        self, keeper: StoreTopic, batches: Sequence[Batch], verdicts: Sequence[Verdict],
        ended: list[tuple[str, bool]],
    ) -> None:  # fmt: skip
        """Tell the store topic what ended and where each series stands: a tombstone for
        each id the acks ended (`ended`: not an update that came while it flew, which is
        due again), telling whether a cancel did; a series' next occurrence, or its
        tombstone once it completed. Written behind: a tombstone lost leaves a version
        the target topic shows delivered."""
        how = {True: storetopic.CANCELLED, False: storetopic.FIRED}
        records = [storetopic.tombstone(i, keeper.topic, how[cancelled]) for i, cancelled in ended]
        # A series' next version as Redis stored it (advance.lua keeps a pause or resume
        # that came while it flew, an update stays, a cancel ends it), not as prepared.
        series = [i for b, v in zip(batches, verdicts, strict=True) for i in v.done
                  if i in b.advances]  # fmt: skip
        if series:
            records += self._series_records(keeper, series)
        keeper.write_behind(records)

    def _series_records(self, keeper: StoreTopic, series: list[str]) -> list[Record]:
        """Each settled series' version as Redis holds it, or its tombstone (telling
        whether a cancel ended it) where it ended."""
        held = self.store.payloads(series)
        flying = self.store.pending_of(series)
        gone = [i for i, raw, still in zip(series, held, flying, strict=True)
                if raw is None or not still]  # fmt: skip
        markers = dict(zip(gone, self.store.ended_markers(gone), strict=True)) if gone else {}
        return [
            storetopic.tombstone(i, keeper.topic,
                                 storetopic.CANCELLED if markers[i] == b"c" else storetopic.FIRED)
            if i in markers else Record(keeper.topic, raw, i.encode("utf-8"))
            for i, raw in zip(series, held, strict=True)
        ]  # fmt: skip

    def _conclude(self, batch: Batch, stop: threading.Event) -> Verdict:
        """Judge one sent batch by its reports (waiting for the missing ones until its
        deadline) and dead-letter what must be: what to ack and what to retry."""
        verdict = Verdict(done=[], retry=defaultdict(list))
        if batch.reports is not None:
            left_s = max(0.0, batch.deadline - time.monotonic())
            errors = self.outbox.wait(batch.reports, stop, left_s)
            acked_ms = batch.reports.last_ms or now_ms()  # settling may come runs later
            self._judge(batch.schedules, errors, acked_ms, verdict, batch.dead)
        self._dead_letter(batch, verdict, stop)
        verdict.done += batch.cancelled + batch.passed
        return verdict

    def _judge(
        self,
        schedules: Sequence[tuple[Schedule, int]],
        errors: Sequence[KafkaError | None],
        acked_ms: int,
        verdict: Verdict,
        dead: list[DeadLetter],
    ) -> None:
        late = []
        for (schedule, attempt), error in zip(schedules, errors, strict=True):
            if error is None:
                verdict.done.append(schedule.id)
                late.append(max(0, acked_ms - schedule.due_ms) / 1000)
                if schedule.series is not None:
                    verdict.fired.append(schedule.id)
            else:
                self._failed(schedule, attempt, error, verdict, dead)
        verdict.delivered = len(late)
        observe_all(self.metrics.lateness, late)
        self.metrics.delivered.inc(verdict.delivered)
        for (error_text, kind), ids in verdict.failures.items():
            log.warning("delivery_failed", error=error_text, kind=kind, count=len(ids),
                        blackbox_ids=ids[:5])  # fmt: skip

    def _failed(
        self,
        schedule: Schedule,
        attempt: int,
        error: KafkaError,
        verdict: Verdict,
        dead: list[DeadLetter],
    ) -> None:
        reason = lasting_reason(error)
        kind = "transient" if reason is None else "lasting"
        self.metrics.delivery_failures.labels(kind=kind).inc()
        verdict.failures.setdefault((error.str(), kind), []).append(schedule.id)
        if reason is not None and attempt >= self.policy.max_attempts:
            detail = f"{error.str()} (after {attempt} attempts)"
            dead.append(
                deadletter.from_schedule(
                    schedule.id, schedule.value, schedule.topic, reason, detail
                )
            )
        else:
            verdict.retry[attempt].append(schedule.id)

    def _dead_letter(self, batch: Batch, verdict: Verdict, stop: threading.Event) -> None:
        schedules = {s.id: s for s, _ in batch.schedules}
        events = []
        for letter, error in deadletter.send(self.outbox, self.policy.dlq_topic, batch.dead, stop):
            schedule_id = _id_of(letter)
            if error is None:
                verdict.done.append(schedule_id)
                self.metrics.dead_letters.labels(reason=letter.reason.value).inc()
                log.warning("dead_lettered", blackbox_id=schedule_id, reason=letter.reason.value)
                events.append(_dead_event(schedule_id, schedules.get(schedule_id), letter))
                _trace_dead_letter(self.policy.dlq_topic, schedules.get(schedule_id), letter)
            else:
                log.warning("dead_letter_failed", blackbox_id=schedule_id, error=error.str())
                verdict.retry[1].append(schedule_id)
        self._answer(events, stop)

    def _answer(self, events: list[Event], stop: threading.Event) -> None:
        """Tell callers what became of their schedules (best effort: logged if refused)."""
        if not events:
            return
        at = now_ms()
        records = [e.record(self.policy.events_topic, at) for e in events]
        errors = [e for e in self.outbox.send(records, stop) if e is not None]
        if errors:
            self.metrics.events_dropped.inc(len(errors))
            log.error("events_dropped", count=len(errors), error=errors[0].str())

    def _record(
        self, claim: Claim, verdict: Verdict, advances: dict[str, Advance], acked: int
    ) -> None:
        """After the acks (`acked` of them still ours): store a series' next occurrence in
        the step that forgets this one, and give what failed back to due, under the
        claim's lease."""
        settled = [advances[i] for i in verdict.done if i in advances]
        if settled:
            acked += self.store.advance(settled, claim.token, now_ms(), claim.shard)
            dues = [a.next.due_ms for a in settled if a.next is not None]
            if dues:
                self.share.nudged(claim.shard, min(dues))
        if acked < len(verdict.done):
            log.warning("lease_lost", expected=len(verdict.done), acked=acked)
        for attempt, ids in verdict.retry.items():
            retry_at = now_ms() + self.policy.retry_delay_ms(attempt)
            self.store.retry(ids, claim.token, retry_at, claim.shard)
            self.share.nudged(claim.shard, retry_at)


def _series_events(batch: Batch, verdict: Verdict) -> list[Event]:
    """`fired` for each occurrence delivered, `completed` for each series ended here."""
    delivered, settled = set(verdict.fired), set(verdict.done)
    events = [
        Event.of_stored(
            Outcome.FIRED,
            s.id,
            s.caller,
            due_ms=s.due_ms,
            topic=s.topic,
            occurrence_ms=s.series.occurrence_ms if s.series else None,
        )
        for s, _ in batch.schedules
        if s.series is not None and s.id in delivered
    ]
    for advance in batch.advances.values():
        if advance.next is None and advance.id in settled:
            events.append(_completed(advance.id, beyond=advance.id in batch.beyond))
    return events


def _completed(series_id: str, *, beyond: bool) -> Event:
    """A series ended: by its limit or end, or at the horizon (its next occurrence lay
    further ahead than its caller may schedule)."""
    if not beyond:
        return Event.of_stored(Outcome.COMPLETED, series_id, None)
    detail = "the next occurrence lay beyond the caller's horizon"
    return Event.of_stored(Outcome.COMPLETED, series_id, None,
                           reason=DeadLetterReason.BEYOND_HORIZON, detail=detail)  # fmt: skip


def _dead_event(schedule_id: str, schedule: Schedule | None, letter: DeadLetter) -> Event:
    detail = dict(letter.headers).get(deadletter.DETAIL_HEADER) or b""
    return Event.of_stored(
        Outcome.DEAD_LETTERED, schedule_id, None if schedule is None else schedule.caller,
        due_ms=None if schedule is None else schedule.due_ms,
        topic=None if schedule is None else schedule.topic,
        reason=letter.reason, detail=detail.decode("utf-8", "replace"),
    )  # fmt: skip


def _trace_dead_letter(topic: str, schedule: Schedule | None, letter: DeadLetter) -> None:
    """The dead-letter span of a schedule given up when it fired (spans on only): in its
    request's trace, or linked to its series' context."""
    if schedule is None or not tracing.active():
        return
    tracing.dead_lettered(topic, letter.reason.value, schedule.headers, schedule.id,
                          parented=schedule.series is None)  # fmt: skip


def _id_of(letter: DeadLetter) -> str:
    """Dead letters of schedules are keyed by the schedule id."""
    return (letter.key or b"").decode()
