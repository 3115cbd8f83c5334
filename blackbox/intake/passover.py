"""Pass-over: what a rebuild writes back of one accepted request, and why it writes nothing.

A schedule is not written back when Kafka shows it ended (rebuild.py reads what shows it):

* delivered: its version sits on its own target topic (kafka/deliveries.py);
* dead-lettered: its id's delivery failed for good after the version was accepted
  (kafka/letters.py);
* aged out: a one-off due before the oldest record its target topic still keeps, so its
  delivery, if there was one, is gone with the rest (nothing can prove it undelivered). A
  caller's id may be moved or replaced later in the replay: it is written back and judged
  on its latest due time once the replay ends (`aged_out`, rebuild.py);
* ended: an `if_absent` create of a caller's id passed over as ended before (the service
  answered it `already_fired`), while the service still kept its ended marker
  (BLACKBOX_FIRED_RETENTION from the end's record time: the delivery, dead letter or
  cancel); after that the service took it as new, and so does the rebuild.

A series delivered goes on after its latest occurrence delivered, its count the occurrences
delivered. A series with a limit whose target topic no longer keeps its oldest records
counts every occurrence before the oldest kept record as delivered, so it never runs past
its limit; one with more such occurrences than can be counted is passed over (reported).
A caller's id passed over drops a version of it written back before (it was replaced), and
is remembered as ended.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import StrEnum

from blackbox.kafka.deliveries import Delivered, Deliveries
from blackbox.kafka.letters import Letters
from blackbox.schedule import SCOPED_PREFIX, Schedule, Series
from blackbox.storage.applying import Cancellation, Write


class Reason(StrEnum):
    """Why a schedule was not written back."""

    DELIVERED = "delivered"
    DEAD_LETTERED = "dead_lettered"
    AGED_OUT = "aged_out"
    ENDED = "ended"
    SERIES_ENDED = "series_ended"
    SERIES_UNCOUNTED = "series_uncounted"  # its occurrences delivered cannot be bounded
    TARGET_UNREADABLE = "target_unreadable"  # its topic may not be described: nothing told


MAX_COUNTED = 1_000_000  # occurrences of a series counted before it is passed over


@dataclass(slots=True)
class Known:
    """What Kafka showed ended so far, and the caller's ids passed over as ended."""

    deliveries: Deliveries = field(default_factory=Deliveries)
    letters: Letters = field(default_factory=Letters)
    ended: dict[str, int] = field(default_factory=dict)  # id -> when it ended (record ms)
    cancelled: set[str] = field(default_factory=set)  # of those, the ones a cancel ended
    pending: set[str] = field(default_factory=set)  # caller's ids written back, not ended
    aging: set[str] = field(default_factory=set)  # caller's ids to judge again at the end
    retention_ms: int = 0  # how long the service keeps an ended id's marker (0: forever)

    def still_ended(self, schedule_id: str, at_ms: int) -> bool:
        """Whether the service still kept `schedule_id`'s ended marker at `at_ms`."""
        ended = self.ended.get(schedule_id)
        if ended is None:
            return False
        return not self.retention_ms or at_ms < ended + self.retention_ms

    def end(self, schedule_id: str, at_ms: int, *, cancel: bool = False) -> None:
        self.ended[schedule_id] = at_ms
        self.pending.discard(schedule_id)
        if cancel:
            self.cancelled.add(schedule_id)
        else:
            self.cancelled.discard(schedule_id)


def judged(write: Write, known: Known, accepted_ms: int) -> tuple[Write | None, Reason | None]:
    """What to write back of `write`, accepted from an intake record of `accepted_ms`
    (None: nothing), and why not all of it."""
    if isinstance(write, Cancellation) and write.id in known.pending:
        known.end(write.id, accepted_ms, cancel=True)
    if not isinstance(write, Schedule):
        return write, None
    if write.if_absent and write.id in known.ended and not known.still_ended(write.id, accepted_ms):
        write.if_absent = False  # its marker had expired: the service took it as new
    reason = _ended_by(write, known, accepted_ms)
    if reason is Reason.AGED_OUT and write.id.startswith(SCOPED_PREFIX):
        known.aging.add(write.id)  # a later move may take it past the oldest kept record
        reason = None
    if reason is None and write.series is not None:
        found = _counted(write, write.series, known)
        if found is None:
            reason = Reason.SERIES_UNCOUNTED
        else:
            kept = _after_delivered(write, write.series, found)
            reason = None if kept is not None else Reason.SERIES_ENDED
    if reason is None:
        known.ended.pop(write.id, None)
        known.cancelled.discard(write.id)
        if write.id.startswith(SCOPED_PREFIX):
            known.pending.add(write.id)
        return write, None
    if reason is not Reason.ENDED:
        known.end(write.id, _ended_ms(write, reason, known))
    return _instead(write), reason


def _ended_ms(write: Schedule, reason: Reason, known: Known) -> int:
    """When a schedule passed over ended: its delivery's or dead letter's record time; its
    due time when its target topic no longer shows it."""
    found = known.deliveries.versions.get((write.topic, write.id, write.version))
    if reason is Reason.DEAD_LETTERED:
        return known.letters.failed.get(write.id, write.due_ms)
    if found is not None and found.delivered_ms:
        return found.delivered_ms
    return write.due_ms


def aged_out(stored: Schedule, known: Known) -> bool:
    """Whether a one-off, as the replay left it (moved, replaced), is due before the oldest
    record its target topic keeps."""
    return stored.series is None and stored.due_ms < known.deliveries.kept_from_ms.get(
        stored.topic, 0
    )


def _ended_by(write: Schedule, known: Known, accepted_ms: int) -> Reason | None:
    if write.if_absent and known.still_ended(write.id, accepted_ms):
        return Reason.ENDED
    if write.series is not None:
        return None
    if (write.topic, write.id, write.version) in known.deliveries.versions:
        return Reason.DELIVERED
    if known.letters.ended_after(write.id, accepted_ms):
        return Reason.DEAD_LETTERED
    if write.due_ms < known.deliveries.kept_from_ms.get(write.topic, 0):
        return Reason.AGED_OUT
    return None


def _counted(schedule: Schedule, series: Series, known: Known) -> Delivered | None:
    """The occurrences of a series that may have been delivered. Where its target topic no
    longer keeps its oldest records and the series has a limit, every occurrence before the
    oldest kept record counts as delivered (its record may be gone): never more than the
    limit, at the risk of fewer. None when those are too many to count."""
    found = known.deliveries.versions.get((schedule.topic, schedule.id, schedule.version))
    # Those before the occurrence stored are in its count already (a store topic's version
    # of a series that fired; a request's first occurrence has none before it).
    since = series.occurrence_ms
    found = (
        Delivered({o for o in found.occurrences if o is None or o >= since}, found.delivered_ms)
        if found
        else Delivered()
    )
    kept_from = known.deliveries.kept_from_ms.get(schedule.topic)
    limit = series.rule.limit
    if kept_from is None or limit is None:
        return found
    occurrence: int | None = series.occurrence_ms
    for _ in range(min(limit, MAX_COUNTED)):
        if occurrence is None or occurrence >= kept_from:
            return found
        found.occurrences.add(occurrence)
        occurrence = series.rule.after(occurrence)
    return found if limit <= MAX_COUNTED else None


def _instead(write: Schedule) -> Write | None:
    """A caller's id ended: any version of it written back before goes."""
    return Cancellation(write.id) if write.id.startswith(SCOPED_PREFIX) else None


def _after_delivered(schedule: Schedule, series: Series, found: Delivered) -> Schedule | None:
    """The series at its first occurrence after the latest delivered; None once ended."""
    latest = found.latest
    if latest is None:
        return schedule
    fired = series.fired + len([o for o in found.occurrences if o is not None])
    following = series.rule.after(latest)
    limit = series.rule.limit
    if following is None or (limit is not None and fired >= limit):
        return None
    moved = replace(series, occurrence_ms=following, fired=fired)
    schedule.series = moved
    schedule.due_ms = series.rule.due_of(schedule.id, following)
    return schedule
