"""Batch: what one claim took, judged id by id (deliver, dead-letter, pass over, give
back), as it goes from the claim through the producer to settling.

`Preparing.prepare` makes one from a claim, before anything is produced: each id's payload
decoded, a series' occurrence picked by its missed policy and its next version made, the
deliveries put in due order, and those Kafka shows made already (rechecks.py) marked.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import structlog

from blackbox import recurrence
from blackbox.clock import now_ms
from blackbox.errors import CorruptSchedule, DeadLetterReason
from blackbox.firing.rechecks import Rechecks
from blackbox.kafka import deadletter
from blackbox.kafka.deadletter import DeadLetter
from blackbox.kafka.outbox import Reports
from blackbox.kafka.storetopic import StoreUnavailable
from blackbox.metrics import Metrics
from blackbox.reference import Reference, is_reference
from blackbox.schedule import Schedule, Series
from blackbox.storage.store import Advance, Claim, Loaded, StoreReader

log = structlog.get_logger("blackbox.firing.batch")
# References met with no store topic set (index mode turned off by unsetting it) wait
# this long before they are claimed again: only that topic holds their messages.
UNSET_RETRY_MS = 30_000
UNSET_ACTION = "set BLACKBOX_STORE_TOPIC back to the store topic index mode wrote"

# How far ahead a caller's next occurrence may be stored, ms (its policy's horizon).
Horizon = Callable[[bytes | None], int]
# Index mode: the encodings read back for references, by id.
Found = Mapping[str, bytes]


class Unread(enum.Enum):
    """`prepare`'s default: the claim's references are read back there."""

    READ_IT = "read it"


@dataclass(slots=True)
class Batch:
    """A claimed batch: held until due, handed to the producer, awaiting its reports."""

    claim: Claim
    payload_bytes: int = 0
    schedules: list[tuple[Schedule, int]] = field(default_factory=list)  # (schedule, attempt)
    dead: list[DeadLetter] = field(default_factory=list)
    reports: Reports | None = None
    produced: int = 0  # deliveries handed to the producer so far (the first ones, in due order)
    deadline: float = 0.0  # time.monotonic() past which missing reports count as failures
    sent_at: float = 0.0  # time.monotonic() when it was handed to the producer
    # Claimed, not to be delivered: cancelled while in flight, or not due after all.
    cancelled: list[str] = field(default_factory=list)
    later: list[tuple[str, int]] = field(default_factory=list)
    # Series claimed: what settling each stores next (by id); those passed over (missed
    # or paused) are settled without a delivery.
    advances: dict[str, Advance] = field(default_factory=dict)
    passed: list[str] = field(default_factory=list)
    beyond: set[str] = field(default_factory=set)  # series ended at the horizon
    # Deliveries (indexes) Kafka shows made before Redis changed: settled unproduced.
    shown: set[int] = field(default_factory=set)

    @property
    def reported(self) -> bool:
        return self.reports is None or self.reports.pending == 0

    def withhold(self) -> None:
        """Keep the deliveries produced so far; the rest (not due when firing stopped) go
        back to due at their due time, unproduced."""
        produced = self.produced
        if produced == len(self.schedules):
            return
        withheld, self.schedules = self.schedules[produced:], self.schedules[:produced]
        self.later += [(schedule.id, schedule.due_ms) for schedule, _ in withheld]
        for schedule, _ in withheld:
            self.advances.pop(schedule.id, None)
        if self.reports is not None:
            self.reports.withdraw_after(produced)
            if produced == 0:
                self.reports = None


class Preparing:
    """Makes a Batch of a claim."""

    def __init__(
        self, metrics: Metrics, horizon_of: Horizon | None, rechecks: Rechecks | None,
        reader: StoreReader | None = None,
    ) -> None:  # fmt: skip
        """`horizon_of` None: a series' next occurrence is never refused. `rechecks`: what
        Kafka shows delivered in a shard whose Redis changed lately is not produced.
        `reader` (index mode) reads back the store records references name."""
        self.metrics = metrics
        self.horizon_of = horizon_of
        self.rechecks = rechecks
        self.reader = reader

    def prepare(self, claim: Claim, found: Found | Unread | None = Unread.READ_IT) -> Batch:
        """Judge each id a claim took (deliver, dead-letter, skip), the deliveries in due
        order; nothing is produced yet. `found` (index mode): what `read_back` read for
        this claim and others at once (None: the store could not be read); by default the
        claim's own references are read back here."""
        batch = Batch(claim=claim)
        if found is Unread.READ_IT:
            found = self.read_back([claim])
        missing = self._resolve(claim, batch, found)
        batch.payload_bytes = sum(len(i.payload or b"") for i in claim.loaded)
        for item in claim.loaded:
            if item.id in missing:
                self._missing(item, batch)
            else:
                self._classify(item, batch)
        claim.loaded.clear()  # the raw payloads are not kept till settled
        batch.schedules.sort(key=lambda pair: pair[0].due_ms)
        if self.rechecks is not None and self.rechecks.windows:
            schedules = [schedule for schedule, _ in batch.schedules]
            batch.shown = self.rechecks.delivered(claim.shard, schedules, now_ms())
            self.metrics.redeliveries_passed_over.inc(len(batch.shown))
        return batch

    def read_back(self, claims: Sequence[Claim]) -> Found | None:
        """Index mode: the encodings the references of `claims` name, by id, read in one
        pass over the store (the shards of a burst ask for records lying among each
        other's); the missing left out. None where the store could not be read."""
        wanted = [w for claim in claims for w in _referenced(claim)]
        if not wanted or self.reader is None:
            return {}
        try:
            return self.reader.values(wanted)
        except StoreUnavailable as e:
            log.warning("store_read_failed", error=str(e), ids=len(wanted))
            return None

    def _resolve(self, claim: Claim, batch: Batch, found: Found | None) -> set[str]:
        """Each reference the claim took replaced by the encoding `found` holds for it
        (claim.loaded rewritten); the ids whose record is missing. Where the store could
        not be read (`found` None), the referenced ids go back to due, unproduced; with no
        store topic set, a while later."""
        wanted = _referenced(claim)
        if not wanted:
            return set()
        if self.reader is None:  # references kept by index mode, and no store topic now
            log.error("store_topic_unset", ids=len(wanted), action=UNSET_ACTION)
            self._hold(claim, batch, wanted, now_ms() + UNSET_RETRY_MS)
            return set()
        if found is None:
            self._hold(claim, batch, wanted)
            return set()
        claim.loaded[:] = [
            replace(i, payload=found[i.id]) if i.id in found else i for i in claim.loaded
        ]
        return {schedule_id for schedule_id, _ in wanted if schedule_id not in found}

    @staticmethod
    def _hold(
        claim: Claim, batch: Batch, wanted: list[tuple[str, Reference]], due_ms: int | None = None
    ) -> None:
        """The referenced ids back to due, unproduced (at `due_ms`, else as they were)."""
        batch.later += [(i, ref.due_ms if due_ms is None else due_ms) for i, ref in wanted]
        referenced = {schedule_id for schedule_id, _ in wanted}
        claim.loaded[:] = [i for i in claim.loaded if i.id not in referenced]

    def _missing(self, item: Loaded, batch: Batch) -> None:
        """A reference whose store record is not there: dead-lettered, counted, logged."""
        self.metrics.store_missing.inc()
        log.error("store_record_missing", blackbox_id=item.id)
        detail = "its record was not in the store topic where Redis's reference said"
        reason = DeadLetterReason.STORE_RECORD_MISSING
        batch.dead.append(deadletter.from_schedule(item.id, None, None, reason, detail))

    def _classify(self, item: Loaded, batch: Batch) -> None:
        """Deliver, dead-letter, or skip a claimed id (cancelled while a failed attempt held
        it, or not due after all)."""
        if item.ended == b"c":  # cancelled while a failed attempt held it
            batch.cancelled.append(item.id)
            return
        if item.payload is None:
            detail = "the payload expired before it could be delivered"
            reason = DeadLetterReason.EXPIRED
            batch.dead.append(deadletter.from_schedule(item.id, None, None, reason, detail))
            return
        try:
            schedule = Schedule.decode(item.id, item.payload)
        except CorruptSchedule as e:
            reason = DeadLetterReason.DELIVERY_FAILED
            batch.dead.append(deadletter.from_schedule(item.id, item.payload, None, reason, str(e)))
            return
        if schedule.due_ms > batch.claim.at_ms:
            # Not due after all. A guard: every script keeps a payload's due time at or
            # before its due score, and the claim took only scores up to at_ms.
            batch.later.append((item.id, schedule.due_ms))
            return
        if schedule.series is not None:
            self._occurrence(schedule, schedule.series, item.attempts, batch)
            return
        batch.schedules.append((schedule, item.attempts + 1))

    def _occurrence(self, schedule: Schedule, series: Series, attempts: int, batch: Batch) -> None:
        """Deliver a series' occurrence (the one its missed policy picks), or pass over it,
        and prepare its next version, stored when the batch is settled."""
        now = batch.claim.at_ms
        horizon = None if self.horizon_of is None else self.horizon_of(schedule.caller)
        firing = recurrence.fire(series.rule, schedule.id, series.occurrence_ms, series.fired,
                                 now, paused=series.paused, retried=attempts > 0,
                                 horizon_ms=horizon)  # fmt: skip
        if firing.beyond_horizon:
            batch.beyond.add(schedule.id)
        following = None
        if firing.next is not None:
            following = _version(schedule, Series(series.rule, firing.next, firing.fired,
                                                  series.paused))  # fmt: skip
        batch.advances[schedule.id] = Advance(schedule.id, following)
        if firing.skipped:
            self.metrics.series_passed.inc()
        if firing.deliver is None:
            batch.passed.append(schedule.id)
            return
        occurrence = Series(series.rule, firing.deliver, firing.fired, series.paused)
        batch.schedules.append((_version(schedule, occurrence), attempts + 1))


def _referenced(claim: Claim) -> list[tuple[str, Reference]]:
    """The (id, reference) of each id a claim took that Redis keeps as a reference (index
    mode), but those cancelled meanwhile."""
    return [
        (i.id, Reference.decode(i.payload))
        for i in claim.loaded
        if i.ended != b"c" and i.payload is not None and is_reference(i.payload)
    ]


def _version(schedule: Schedule, series: Series) -> Schedule:
    """The schedule of one occurrence of its series: due at that occurrence, jitter added."""
    due_ms = series.rule.due_of(schedule.id, series.occurrence_ms)
    return replace(schedule, due_ms=due_ms, series=series)
