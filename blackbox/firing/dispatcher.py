"""fire_due(): claim due ids, produce them, wait for the broker's reports, then ack.

An id leaves Redis only after its target topic (or the dead-letter topic) acknowledged it.
A failed delivery goes back to due with a backoff; one failing for a lasting reason is
dead-lettered once its attempts are spent. A full claim is followed at once by the next,
so a backlog drains at full speed.

Sending does not wait for the broker: a batch is settled in Redis (acked, retried or
dead-lettered) once its reports are in, on a later run, so the next due messages are
claimed while the broker acknowledges earlier ones.

A batch's walk, one stage per module: claimed here (`_claim`; servers.py notes which Redis
answered), *prepared* (batch.py: each id judged, the deliveries in due order), *held* and
*released* at each due instant, then awaiting its reports (flight.py), and *settled*
(settling.py: concluded by its reports, dead-lettered where it must be, acked, retried,
recorded). This module decides when: `_settle_ready`, `_settle_until_due` and
`settle_all` choose which batches to settle. Shards cost round trips only per Redis node:
the shards due at one instant are claimed together, and the batches ready at once are
acked together, whatever their shards. Before the dispatcher idles it waits for the
reports of what it sent, but only until shortly before the next due time: what is
unreported then is settled on a later run, well inside the lease.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial

from blackbox.clock import now_ms
from blackbox.firing.batch import Batch, Horizon, Preparing
from blackbox.firing.failures import NodeFailures
from blackbox.firing.flight import Flight
from blackbox.firing.rechecks import Rechecks
from blackbox.firing.retry import RetryPolicy
from blackbox.firing.servers import Servers
from blackbox.firing.settling import Settler
from blackbox.firing.shares import Share
from blackbox.kafka.outbox import Outbox
from blackbox.kafka.storetopic import StoreTopic
from blackbox.metrics import Metrics
from blackbox.storage.store import PROBED_DUE, PROBED_EMPTY, RedisStore

# A run waits for delivery reports until this many ms before the next due time, no later,
# and acknowledges in Redis what is reported meanwhile: what a kill delivers again is
# what was sent and not yet acknowledged, so the wait is worth even a few ms between two
# due instants. (At 50 ms, a batch stayed unacknowledged until a later due instant
# whenever messages fell due less than 50 ms apart; `benchmarks.chaos crash` measures
# the copies per kill, see docs/profiles.md.)
SETTLE_AHEAD_MS = 3
# While it waits, it looks this often for a sooner due time (a nudge).
REPORT_POLL_S = 0.01
# A claim takes what falls due within this many ms; each delivery is held in this process
# and produced at its due instant (the waker wakes for it with no round trip). A steady
# stream then costs a claim and an ack per shard and window, not per message (at 1,000/s
# on 16 shards, about three messages a claim). A nudge for a sooner due time wakes the
# waker just before it, as for any other. The price: a process killed holds up to a
# window's deliveries in flight until their lease runs out. BLACKBOX_FIRE_AHEAD_MS sets it
# (at 50 ms, a steady 1,000/s cost about 9% more service CPU per message).
FIRE_AHEAD_MS = 100
# A claim is made this many ms before the window it takes begins, so that its round trip
# is over by the first due time.
CLAIM_LEAD_MS = 2
# Due instants closer together than SETTLE_AHEAD_MS (steady firing at ~1,000/s) settle
# the reported batches at most this often, once the oldest was sent this long ago, all in
# one round trip: an ack round trip per this many ms, not one per batch (a kill may
# deliver again what was sent in this span).
SETTLE_EVERY_S = 0.01


# The earliest due time announced while a run fires (a nudge), or None.
Nudged = Callable[[], int | None]


@dataclass(slots=True)
class Fired:
    """What one fire_due run did, and when the earliest schedule left is due."""

    delivered: int
    next_due_ms: int | None
    wake_ms: int | None = None  # when to run again: a held delivery's due time, or a claim's


class Dispatcher:
    """Moves due schedules from Redis to their target topics."""

    def __init__(  # noqa: PLR0913 - its collaborators, each injected
        self,
        store: RedisStore,
        outbox: Outbox,
        policy: RetryPolicy,
        metrics: Metrics,
        share: Share | None = None,
        *,
        horizon_of: Horizon | None = None,
        floors: Callable[[], Mapping[int, int]] | None = None,
        rechecks: Rechecks | None = None,
        keeper: StoreTopic | None = None,
    ) -> None:
        """`keeper` is told what ended and where series stand (the store topic, where one
        is set). `floors` tells each shard's clock floor: nothing is claimed from a Redis whose
        clock went below it (clocks.py); None: no floor. `rechecks` holds the shards whose
        Redis changed lately: what Kafka shows delivered there is not delivered again.
        `horizon_of` None: a series' next occurrence is never refused."""
        self.store = store
        self.floors = floors
        self.outbox = outbox
        self.policy = policy
        self.claims = 0  # claims made so far: progress, even while one run drains a burst
        # The shards this replica fires: all of them until the share beats (shares.py).
        self.share = share or Share(store.layout)
        self.ahead_ms = FIRE_AHEAD_MS
        self._window_end_ms = 0  # the claims of the current window take what is due by then
        self._settled_at = 0.0  # time.monotonic() of the last settling by _settle_ready
        self._servers = None if rechecks is None else Servers(store, rechecks)
        self._preparing = Preparing(metrics, horizon_of, rechecks, store.reader)
        self._flight = Flight(outbox, policy, metrics)
        self._settler = Settler(store, outbox, policy, metrics, self.share, keeper=keeper)

    def fire_due(
        self, stop: threading.Event, nudged: Nudged = lambda: None, *, sweep: bool = False
    ) -> Fired:
        """Send everything due now in this replica's shards that are due (`sweep`: in all
        of them where a probe finds something due, and what is long overdue in the others'
        shards), batch after batch, until each shard's claim comes back short; settle the
        batches the broker has reported on, waiting for the rest until shortly before the
        next due time, or the due time `nudged` tells of meanwhile.
        """
        fired = Fired(delivered=0, next_due_ms=None)
        self._flight.release_due()  # before any round trip: what is held leaves on time
        now = now_ms()
        failures = NodeFailures(self.store.pool_of)  # a dead node stalls its shards only
        mine, others = self._due_shards(now), list[int]()
        if sweep:
            mine, others = self._probe(mine, now)
        for shards in failures.by_node(mine):
            failures.attempt(shards[0], partial(self._drain, shards, stop, fired))
        if others:  # one claim per other shard: its owner drains it, a sweep only helps
            cutoff = now - self.share.sweep_after_ms
            for shards in failures.by_node(others):
                failures.attempt(
                    shards[0], partial(self._drain, shards, stop, fired, due_by_ms=cutoff)
                )
        failures.raise_first()
        self._flight.release_due()
        unclaimed, held = self.share.next_due_ms(), self.held_due_ms()
        fired.next_due_ms = _soonest(unclaimed, held)
        # Woken at a held delivery's due time, and just before the next one not claimed
        # yet: that claim then takes the window from there.
        claim_at = None if unclaimed is None else unclaimed - CLAIM_LEAD_MS
        fired.wake_ms = _soonest(claim_at, held)
        fired.delivered += self._settle_until_due(fired.next_due_ms, stop, nudged)
        return fired

    def held_due_ms(self) -> int | None:
        """When the soonest held delivery falls due, if any is held."""
        return self._flight.held_due_ms()

    def _due_shards(self, now: int) -> list[int]:
        """The shards to claim now. Once the last window is nearly over, a new one begins:
        every shard with something due in it is claimed together (one round trip per
        Redis node), up to its end. Within a window, only a shard with something due
        before its end that no claim took (a nudge: a short countdown), up to the same end.
        """
        if now + CLAIM_LEAD_MS >= self._window_end_ms:
            self._window_end_ms = now + CLAIM_LEAD_MS + self.ahead_ms
            return self.share.due_by(self._window_end_ms)
        return self.share.due_by(now + CLAIM_LEAD_MS)

    def _probe(self, due: Sequence[int], now: int) -> tuple[list[int], list[int]]:
        """The sweep's look at every shard (the safety net for a lost nudge): the owned
        shards to claim (those `due` as far as the share knows, and those where something
        is due by `now`) and the others' shards where something is overdue by the sweep
        delay. One read-only script per Redis node instead of a claim per shard; an owned
        shard found empty has no lease to reclaim either."""
        owned, others = self.share.owned, self.share.others()
        cutoff = now - self.share.sweep_after_ms
        probes = [(s, now) for s in owned] + [(s, cutoff) for s in others]
        found = self.store.probe_all(probes) if probes else {}
        known = set(due)
        mine = []
        for shard in owned:
            if found[shard] == PROBED_EMPTY:
                self.share.leased(shard, None, now)
            if shard in known or found[shard] == PROBED_DUE:
                mine.append(shard)
        return mine, [s for s in others if found[s] == PROBED_DUE]

    def _drain(
        self,
        shards: Sequence[int],
        stop: threading.Event,
        fired: Fired,
        *,
        due_by_ms: int | None = None,
    ) -> None:
        """Claim and send what is due now in `shards` (of one Redis node) until each one's
        claim comes back short; with `due_by_ms` (a sweep of others' shards), one claim each
        of what is due by then. The shards are claimed together, in one round trip: a due
        instant costs the same with many shards as with one. Together they take one claim's
        worth at most (a share each, at least MIN_SHARD_CLAIM ids); a shard whose claim
        came back full (a burst) is then drained on its own, a full claim per round trip,
        as one shard is. Each claim's lease runs from the claim itself. The share learns
        when each shard is next due."""
        if stop.is_set():
            return
        full = self._claim(shards, stop, fired, due_by_ms)
        if due_by_ms is not None:
            return
        for shard in full:
            while not stop.is_set() and self._claim([shard], stop, fired, None):
                pass

    def _claim(
        self, shards: Sequence[int], stop: threading.Event, fired: Fired, due_by_ms: int | None
    ) -> list[int]:
        """Claim `shards` together, send what they took and settle what is ready; the
        shards whose claim came back full (more is due there)."""
        for shard in shards:
            self.share.claiming(shard)
        self.claims += len(shards)
        limit, max_bytes = self.policy.shared(len(shards))
        at = now_ms()
        claims = self.store.claim_all(
            at, limit, self.policy.lease_ms, shards,
            due_by_ms=self._window_end_ms if due_by_ms is None else due_by_ms,
            max_bytes=max_bytes, see_leases=self.share.unseen(shards, at),
            floors=None if self.floors is None else self.floors(),
            identify=self._servers is not None,
        )  # fmt: skip
        if self._servers is not None:
            self._servers.note(claims, at)
        found = self._preparing.read_back(claims)  # index mode: one pass over the store
        for claim in claims:  # when a lease there can run out: reclaimed only then
            if claim.leases_seen:
                self.share.leased(claim.shard, claim.lease_expiry_ms, at)
            elif claim.ids:
                self.share.leasing(claim.shard, math.ceil(claim.token))
            if claim.ids:
                self._flight.hold(self._preparing.prepare(claim, found))
        self._flight.release_due()
        fired.delivered += self._settle_ready(stop)
        for claim in claims:  # more is due where a claim was full: look again
            self.share.learned(claim.shard, claim.at_ms if claim.more else claim.next_due_ms)
        return [claim.shard for claim in claims if claim.more]

    def settle_all(self, stop: threading.Event) -> int:
        """Wait for the reports of every batch sent and settle each, what is held and not
        due yet given back to due unproduced (stopping); how many were delivered."""
        flight = self._flight
        flight.give_back_held()
        return self._settler.settle([flight.oldest() for _ in range(len(flight.unsettled))], stop)

    def _settle_until_due(
        self, next_due_ms: int | None, stop: threading.Event, nudged: Nudged
    ) -> int:
        """Settle the batches sent, waiting for their reports while nothing is due: never
        within SETTLE_AHEAD_MS of the next due time (a broker slow to acknowledge must not
        make the next message late). What is still unreported then is settled on a later
        run; with the next due time that close, only what `_settle_ready` settles now."""
        if next_due_ms is None:
            return self.settle_all(stop)
        delivered, flight = self._settle_ready(stop), self._flight
        while flight.unsettled and self._ahead_s(next_due_ms, nudged) > 0:
            if not self._await_reports(flight.unsettled[0], next_due_ms, stop, nudged):
                break
            ready = [flight.oldest()]  # and those reported with it, settled together
            while flight.unsettled and flight.unsettled[0].reported:
                ready.append(flight.oldest())
            delivered += self._settler.settle(ready, stop)
        return delivered

    def _await_reports(
        self, sent: Batch, next_due_ms: int, stop: threading.Event, nudged: Nudged
    ) -> bool:
        """Serve delivery reports until `sent` can be settled (all in, or past its deadline:
        True) or it is time to fire again (False)."""
        while not sent.reported and not stop.is_set():
            overdue_in_s = sent.deadline - time.monotonic()
            if overdue_in_s <= 0:
                return True
            left_s = self._ahead_s(next_due_ms, nudged)
            if left_s <= 0:
                return False
            self.outbox.producer.poll(min(left_s, overdue_in_s, REPORT_POLL_S))
        return sent.reported

    @staticmethod
    def _ahead_s(next_due_ms: int, nudged: Nudged) -> float:
        """Seconds left to wait for reports before firing again (none within
        SETTLE_AHEAD_MS of the next due time, or of a sooner one nudged meanwhile)."""
        nudge = nudged()
        soonest_ms = next_due_ms if nudge is None else min(next_due_ms, nudge)
        return (soonest_ms - SETTLE_AHEAD_MS - now_ms()) / 1000

    def _settle_ready(self, stop: threading.Event) -> int:
        """Settle the oldest batches whose reports are all in (or that must be awaited), once
        the oldest was sent SETTLE_EVERY_S ago and the last settling was as long ago: the
        batches of a window's shards, sent off one by one, share an ack round trip."""
        self.outbox.producer.poll(0)
        now, flight = time.monotonic(), self._flight
        if not flight.unsettled or (
            (now - flight.unsettled[0].sent_at < SETTLE_EVERY_S
             or now - self._settled_at < SETTLE_EVERY_S)
            and not flight.too_much_unsettled()
        ):  # fmt: skip
            return 0
        ready = []
        while flight.unsettled and (flight.unsettled[0].reported or flight.too_much_unsettled()):
            ready.append(flight.oldest())
        if ready:
            self._settled_at = now
        return self._settler.settle(ready, stop)

    def reclaim_expired(self) -> int:
        """Return ids whose replica's lease ran out to due, in this replica's shards where
        a lease can have run out (share.expired_by: as the last claim, reclaim or probe
        there told, or unknown); how many. (A dead replica's leases come back through
        whoever owns their shards.) One round trip per Redis node, none while no lease
        can have run out."""
        now = now_ms()
        shards = self.share.expired_by(now)
        if not shards:
            return 0
        self.share.reclaiming(shards)
        reclaimed = self.store.reclaim_each(now, self.policy.batch_limit, shards)
        for shard, each in zip(shards, reclaimed, strict=True):
            self.share.reclaimed(shard, each.lease_expiry_ms, now)
            if each.returned:  # due at once: the waker claims the shard
                self.share.nudged(shard, now)
        return sum(each.returned for each in reclaimed)


def _soonest(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)
