"""Quotas: how many schedules one caller may have pending at once, so that no caller can
fill Redis for everyone.

A policy rule's `max_pending` (policy.py) caps the caller's pending schedules: a caller
the policy lists has a count of its own, and every other caller (records without
CALLER_SERVICE too) shares the default's, since anyone may write a new name. A new
schedule beyond it is refused as `over_quota` (dead-lettered and answered like any
refusal), while updates of its pending ids, moves, cancels, pauses and resumes still go
through. While any rule sets a quota, intake keeps each caller's ids in an owned set per
shard (`{shard}:own:<caller>`, id -> due time, see intake.lua); an id that ended (fired,
cancelled, dead-lettered) leaves it once its due time has passed, when the set is pruned
(owned.lua): before each count, and for every caller every SWEEP_SECONDS.

The count is read once per poll and caller (and again where the poll's tally reaches the
quota), so replicas that handle the same caller's partitions at the same moment may
together pass the quota by what one poll holds: a quota bounds memory, it is not an exact
contract. Ids scheduled while no rule set a quota are not counted; nor are an id's
occurrences (a series is one id).

A record read again past the committed offset (a crash, a rebalance) is not judged again
when its shard's watermark is at or past it: applied, intake.lua answers it as it stands;
refused, its shard's mark was moved past it then (IntakeSlice.passed), so it stays
refused. Records a rebuild replays that the service had accepted are written whatever the
quota says now (rebuild.py): they were accepted under the policy of then.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TypeVar
from urllib.parse import unquote

from blackbox.errors import DeadLetterReason, InvalidEnvelope
from blackbox.intake.policy import CallerPolicy
from blackbox.schedule import SCOPED_PREFIX, Schedule, owner_of, split_scoped
from blackbox.storage.keys import SHARED_OWNER
from blackbox.storage.store import RedisStore

SWEEP_SECONDS = 60.0  # how often every caller's owned sets are pruned of ended ids

T = TypeVar("T")


class Quotas:
    """The quota check of one intake, and the pruning of the owned sets it counts."""

    def __init__(
        self, store: RedisStore, policy: CallerPolicy,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:  # fmt: skip
        self.store = store
        self.policy = policy
        self.counting = policy.counts_pending
        if self.counting:  # intake.lua keeps the owned sets from now on
            store.intake.counting = True
            store.intake.bucket_of = self.bucket
        self.clock = clock
        self._swept = clock()

    def refusals(
        self, writes: Sequence[tuple[T, Schedule]], now_ms: int, tally: dict[str, int]
    ) -> list[tuple[T, InvalidEnvelope]]:
        """The new schedules among `writes` (in the order they were read) that would take a
        caller past its quota, each with its refusal.

        `tally` (one per poll) holds each count read in this poll plus what was admitted
        since: Redis is read once per caller and poll, and again only for a caller whose
        tally reaches its quota (then precisely: an update of a pending id adds nothing)."""
        by_bucket: dict[str, list[tuple[T, Schedule]]] = {}
        for tag, write in writes:
            if self.policy.rule_for(write.caller).max_pending:
                bucket = self.bucket(owner_of(write.id, write.caller))
                by_bucket.setdefault(bucket, []).append((tag, write))
        unread = [bucket for bucket in by_bucket if bucket not in tally]
        if unread:
            tally.update(self.store.count_owned(unread, now_ms))
        refused: list[tuple[T, InvalidEnvelope]] = []
        for bucket, items in by_bucket.items():
            limit = self.policy.rule_for(items[0][1].caller).max_pending
            if len(items) <= limit - tally[bucket]:
                tally[bucket] += len(items)
                continue
            (pending,) = self.store.count_owned([bucket], now_ms).values()
            beyond, added = self._beyond(items, limit, pending)
            tally[bucket] = pending + added
            refused += beyond
        return refused

    def bucket(self, owner: str) -> str:
        """Whose count a caller's schedules go to: its own where the policy lists it; else
        the one all the others share (SHARED_OWNER), so that naming a new caller on every
        record gains no quota."""
        return owner if owner and unquote(owner) in self.policy.callers else SHARED_OWNER

    def _beyond(
        self, items: list[tuple[T, Schedule]], limit: int, pending: int
    ) -> tuple[list[tuple[T, InvalidEnvelope]], int]:
        """The items past the room one caller has left, and how many new ones fit: a
        caller's id pending already (an update) adds nothing, nor does an id seen earlier
        in the same part."""
        scoped = [w.id for _, w in items if w.id.startswith(SCOPED_PREFIX)]
        present = dict(zip(scoped, self.store.pending_of(scoped), strict=True)) if scoped else {}
        room, added, refused = limit - pending, set[str](), []
        for tag, write in items:
            if present.get(write.id) or write.id in added:
                continue
            if room > 0:
                room -= 1
                added.add(write.id)
                continue
            refused.append((tag, _refusal(write, limit, self.policy)))
        return refused, len(added)

    def sweep(self, now_ms: int) -> None:
        """Every SWEEP_SECONDS, prune every caller's owned sets of the ids that ended, so a
        caller who stopped sending does not keep them."""
        if self.clock() - self._swept < SWEEP_SECONDS:
            return
        self._swept = self.clock()
        owners = self.store.owners()
        if owners:
            self.store.count_owned(sorted(owners), now_ms)


def _refusal(write: Schedule, limit: int, policy: CallerPolicy) -> InvalidEnvelope:
    """The refusal of a schedule past its caller's quota, naming what it asked for."""
    name = None if write.caller is None else write.caller.decode("utf-8", "replace")
    if name is not None and name in policy.callers:
        detail = f"{name!r} has its quota of {limit} schedules pending"
    else:
        detail = (f"the callers without a rule of their own have their shared quota of {limit} "
                  "schedules pending")  # fmt: skip
    error = InvalidEnvelope(DeadLetterReason.OVER_QUOTA, detail)
    scoped = split_scoped(write.id)
    error.schedule_id = None if scoped is None else scoped[1]
    error.topic = write.topic
    return error
