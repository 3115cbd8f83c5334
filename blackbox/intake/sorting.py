"""Sorting: each record of a poll made a write for Redis, or refused with a dead letter.

One stage of a poll's walk through the intake (loop.py): gathered, *sorted*, kept in the
store topic where one is set, applied in Redis, answered. A record is read once (its
headers, then its envelope); its caller is established where an identity rule applies
(identity.py, on its key's partition: placement.py) and its caller's policy judges it;
it then becomes a write (applying.py). What can only be judged over the part as a whole
follows: a signed record's nonce (nonces.py) and a new schedule's quota (quotas.py).

Nothing a record holds escapes as an exception: one that no check foresaw is refused as
`unreadable`, the error logged. A refusal is dead-lettered and answered once: a record
refused before a gap in Redis (gaps.py) and read again is not refused again.
"""

from __future__ import annotations

from collections.abc import Sequence

import structlog
from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, Message

from blackbox import envelope
from blackbox.envelope import Cancel, Header, Hold, Request, Reschedule
from blackbox.errors import DeadLetterReason, InvalidEnvelope
from blackbox.intake import answering, retrying, traces
from blackbox.intake.batch import Batch, Counted, Signed
from blackbox.intake.config import IntakeConfig
from blackbox.intake.crashguard import CRASH_LIMIT
from blackbox.intake.gaps import GapCheck
from blackbox.intake.identity import Identity, Proof
from blackbox.intake.nonces import Nonces
from blackbox.intake.placement import Placement
from blackbox.intake.quotas import Quotas
from blackbox.kafka import deadletter
from blackbox.kafka.clients import read_headers
from blackbox.kafka.events import Coordinates
from blackbox.metrics import Metrics
from blackbox.schedule import Schedule, intake_id, scoped_id
from blackbox.signing import Parts
from blackbox.storage.applying import Cancellation, Holding, Move, Write, watermark_field
from blackbox.storage.store import RedisStore
from blackbox.storage.watermarks import Watermarks
from blackbox.tracecontext import Carried

log = structlog.get_logger("blackbox.intake.sorting")
UNREADABLE_HEADERS = "a header name is not UTF-8; the record's headers could not be read"

Where = tuple[str, int, int]  # topic, partition, offset


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


def record_ms(message: Message, now: int) -> int:
    """The record's own timestamp (now where it has none)."""
    kind, stamp = message.timestamp()
    return now if kind == TIMESTAMP_NOT_AVAILABLE or stamp <= 0 else stamp


def where_of(message: Message) -> Where:
    return message.topic() or "", message.partition() or 0, message.offset() or 0


class Sorting:
    """Makes each record of a part a write or a refusal, into the part's Batch."""

    def __init__(  # noqa: PLR0913 - its collaborators, each injected
        self, config: IntakeConfig, metrics: Metrics, store: RedisStore, *, identity: Identity,
        placement: Placement, quotas: Quotas, nonces: Nonces, gaps: GapCheck,
        known: Watermarks,
    ) -> None:  # fmt: skip
        """`known`: the watermarks this process saw confirmed (a record at or below its
        shard's mark was handled before, and is not counted against a quota again)."""
        self.config = config
        self.metrics = metrics
        self.store = store  # its layout: which shard an id is in
        self.identity = identity
        self.placement = placement
        self.quotas = quotas
        self.nonces = nonces
        self.gaps = gaps
        self.known = known

    def sort(self, message: Message, now: int, batch: Batch) -> None:
        """Parse one record into a write, or refuse it with a dead letter."""
        where = where_of(message)
        batch.saw(*where)
        if where in batch.poisoned:  # set aside unparsed; its headers kept where readable
            headers = read_headers(message) if batch.poisoned[where] else None
            error = _unreadable(f"handling it stopped the intake {CRASH_LIMIT} times")
            self.refuse(batch, message, where, headers=headers, request=None, error=error)
            return
        headers = read_headers(message)  # once: a second read of bad names crashed the client
        context = traces.context_of(headers, self.metrics)
        with traces.logged(context):
            self._sort_read(message, where, headers, context=context, now=now, batch=batch)

    def refuse_replays(self, batch: Batch) -> None:
        """Refuse the signed records whose nonce another record used first."""
        signed = batch.take_signed()
        firsts = self.nonces.first_uses([(s.proof, s.origin) for s in signed])
        for record, first in zip(signed, firsts, strict=True):
            if first is None:
                continue
            batch.unsend(record.where)
            error = InvalidEnvelope(
                DeadLetterReason.BAD_SIGNATURE, f"a replay: its nonce was used by {first}"
            )
            self.refuse(batch, record.message, record.where, headers=record.headers,
                        request=None, error=error)  # fmt: skip

    def refuse_over_quota(self, batch: Batch, now: int) -> None:
        """Refuse the new schedules that would take a caller past its quota (quotas.py)."""
        counted = batch.take_counted()
        if not counted:
            return
        writes = [(c, c.write) for c in counted]
        for record, error in self.quotas.refusals(writes, now, batch.quota_tally):
            batch.unsend(record.where)
            shard = self.store.layout.shard_of(record.write.id)
            batch.passed.setdefault(record.where[:2], set()).add(shard)
            self.refuse(batch, record.message, record.where, headers=record.headers,
                        request=None, error=error)  # fmt: skip

    # What a replay of records accepted before changes (rebuild.py): the hooks below.

    def identified(
        self, message: Message, headers: list[Header], now: int
    ) -> tuple[Sequence[Header], Proof | None]:
        """The headers to parse with and a signature's proof (identity.py), a signed record
        on its key's partition (placement.py); nothing is computed for a record no identity
        rule applies to."""
        if not self.identity.applies_to(headers):
            return headers, None
        parts = Parts(message.topic() or "", message.key(), message.value(), headers)
        stamp = record_ms(message, now)
        # Read again after Redis lost it: its age was judged when first read, not now.
        read_at = stamp if self.gaps.handled_before(*where_of(message)) else now
        checked, proof = self.identity.establish(parts, stamp, read_at)
        if proof is not None:
            self.placement.check(parts.topic, message.partition() or 0, parts.key)
        return checked, proof

    def judged_by_policy(self, message: Message) -> bool:
        """Whether the caller's policy judges this record: always (a replay of what was
        accepted before does not, see rebuild.py)."""
        return True

    def write(
        self, request: Request, message: Message, now: int, origin: str, proof: Proof | None
    ) -> Write:
        """What to apply in Redis for a valid request; the caller's policy may still refuse."""
        if isinstance(request, Cancel):
            return Cancellation(scoped_id(request.caller, request.schedule_id))
        if isinstance(request, Hold):
            return Holding(scoped_id(request.caller, request.schedule_id), request.caller,
                           request.paused)  # fmt: skip
        received = received_ms(message, now) if proof is None else proof.countdown_from(now)
        judged = self.judged_by_policy(message)
        if isinstance(request, Reschedule):
            due_ms = request.due_ms(received)
            if judged:
                self.config.policy.check_horizon(request.caller, due_ms, received)
            return Move(scoped_id(request.caller, request.schedule_id), request.caller, due_ms)
        wanted = request
        if request.retry is not None:  # a consumer's retry: its topic and delay by its policy
            rule = self.config.policy.rule_for(request.caller)
            wanted = retrying.resolved(request, rule, received, self.config.limits)
        schedule = Schedule.from_envelope(wanted, origin, received, sent_ms=received)
        if judged:
            self.config.policy.check(wanted, schedule.due_ms, received, schedule.series)
        return schedule

    def rewritten(self, write: Write) -> Write | None:
        """What to apply of a valid request: all of it (a replay passes over some, see
        rebuild.py)."""
        return write

    def refuse(  # noqa: PLR0913 - the record, what could be read of it, and why
        self, batch: Batch, message: Message, where: Where, *,
        headers: list[Header] | None, request: Request | None, error: InvalidEnvelope,
    ) -> None:  # fmt: skip
        """Dead-letter and answer a record (once: not again after a gap)."""
        if self.gaps.handled_before(*where):  # refused, dead-lettered and answered before
            log.info("refusal_not_repeated", reason=error.reason.value, topic=where[0],
                     partition=where[1], offset=where[2])  # fmt: skip
            return
        batch.refuse(
            deadletter.from_intake(message, headers, error.reason, error.detail),
            answering.refusal_of(Coordinates(*where), headers or [], request, error, message.key()),
        )
        log.warning("dead_lettered", reason=error.reason.value, detail=error.detail,
                    topic=where[0], partition=where[1], offset=where[2])  # fmt: skip
        traces.refused(self.config.dlq_topic, error.reason.value, headers)

    def _sort_read(  # noqa: PLR0913 - one record and what was read of it
        self, message: Message, where: Where, headers: list[Header] | None, *,
        context: Carried, now: int, batch: Batch,
    ) -> None:  # fmt: skip
        request: Request | None = None
        try:
            if headers is None:
                raise InvalidEnvelope(DeadLetterReason.INVALID_HEADER, UNREADABLE_HEADERS)
            checked, proof = self.identified(message, headers, now)
            request = envelope.parse(message.value(), checked, self.config.limits, message.key())
            origin = intake_id(*where, batch.tags[where[0]])
            write = traces.traced(self.write(request, message, now, origin, proof), context,
                                  where)  # fmt: skip
            if proof is not None:
                batch.signed.append(Signed(proof, origin, message, where, headers))
        except InvalidEnvelope as e:
            self.refuse(batch, message, where, headers=headers, request=request, error=e)
            return
        except Exception as e:
            log.exception("intake_record_failed", topic=where[0], partition=where[1],
                          offset=where[2])  # fmt: skip
            error = _unreadable(repr(e))
            self.refuse(batch, message, where, headers=headers, request=request, error=error)
            return
        kept = self.rewritten(write)
        if kept is not None:
            batch.unsent[where[:2]].append((where[2], kept))
        if isinstance(kept, Schedule) and self._counted(message, where, kept.id, batch):
            batch.counted.append(Counted(kept, message, where, headers))

    def _counted(self, message: Message, where: Where, schedule_id: str, batch: Batch) -> bool:
        """Whether a record's new schedule is checked against its caller's quota: where a
        policy sets quotas, unless its shard's watermark is at or past it (handled before:
        applied, or refused for the quota, and read again after a crash or a rebalance;
        intake.lua answers it as it stands), it was handled before a gap, or it is replayed
        as accepted before (rebuild.py). The decision is made once per record."""
        if not self.quotas.counting or not self.judged_by_policy(message):
            return False
        topic, partition, offset = where
        field = watermark_field(topic, partition, batch.tags[topic])
        mark = self.known.mark(field, self.store.layout.shard_of(schedule_id))
        return not (mark is not None and offset <= mark) and not self.gaps.handled_before(*where)


def _unreadable(detail: str) -> InvalidEnvelope:
    return InvalidEnvelope(DeadLetterReason.UNREADABLE, detail)
