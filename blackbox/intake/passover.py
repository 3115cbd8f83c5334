"""Pass-over: what a rebuild writes back of one accepted request, and why it writes nothing.

A schedule is not written back when Kafka shows it ended (rebuild.py reads what shows it):

* delivered: its version sits on its own target topic (kafka/deliveries.py);
* dead-lettered: its id's delivery failed for good after the version was accepted
  (kafka/letters.py);
* aged out: a one-off due before the oldest record its target topic still keeps, so its
  delivery, if there was one, is gone with the rest (nothing can prove it undelivered);
* ended: an `if_absent` create of a caller's id passed over as ended before (the service
  answered it `already_fired`).

A series delivered goes on after its latest occurrence delivered, its count the occurrences
delivered. A caller's id passed over drops a version of it written back before (it was
replaced), and is remembered as ended.
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


@dataclass(slots=True)
class Known:
    """What Kafka showed ended so far, and the caller's ids passed over as ended."""

    deliveries: Deliveries = field(default_factory=Deliveries)
    letters: Letters = field(default_factory=Letters)
    ended: set[str] = field(default_factory=set)


def judged(write: Write, known: Known, accepted_ms: int) -> tuple[Write | None, Reason | None]:
    """What to write back of `write`, accepted from an intake record of `accepted_ms`
    (None: nothing), and why not all of it."""
    if not isinstance(write, Schedule):
        return write, None
    reason = _ended_by(write, known, accepted_ms)
    if reason is None and write.series is not None:
        found = known.deliveries.versions.get((write.topic, write.id, write.version))
        kept = write if found is None else _after_delivered(write, write.series, found)
        reason = None if kept is not None else Reason.SERIES_ENDED
    if reason is None:
        known.ended.discard(write.id)
        return write, None
    known.ended.add(write.id)
    return _instead(write), reason


def _ended_by(write: Schedule, known: Known, accepted_ms: int) -> Reason | None:
    if write.if_absent and write.id in known.ended:
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
