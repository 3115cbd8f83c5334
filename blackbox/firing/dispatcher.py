"""fire_due(): claim due ids, produce them, wait for the broker's reports, then ack.

An id leaves Redis only after its target topic (or the dead-letter topic) acknowledged it.
A failed delivery goes back to due with a backoff; one failing for a lasting reason is
dead-lettered once its attempts are spent. A full claim is followed at once by the next,
so a backlog drains at full speed.

Sending does not wait for the broker: a batch is settled in Redis (acked, retried or
dead-lettered) once its reports are in, on a later run, so the next due messages are
claimed while the broker acknowledges earlier ones.

One verb per step: a batch is *prepared* and *held* (`_prepare`, `_hold`), each delivery
*released* at its due instant (`_release_due`), then *settled* (`_settle`: each batch
*concluded* by its reports and dead-lettered where it must be, then the acks of all in one
round trip, and the rest *recorded* in Redis by `_record`); `_settle_ready`,
`_settle_until_due` and `settle_all` choose which batches to settle when. Shards cost
round trips only per Redis node: the shards due at one instant are claimed together, and
the batches ready at once are acked together, whatever their shards. Before the
dispatcher idles it waits for the reports of what it sent, but only until shortly before
the next due time: what is unreported then is settled on a later run, well inside the
lease.
"""

from __future__ import annotations

import heapq
import itertools
import math
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial

import structlog
from confluent_kafka import KafkaError

from blackbox import recurrence, tracing
from blackbox.clock import now_ms
from blackbox.envelope import CALLER_HEADER
from blackbox.errors import CorruptSchedule, DeadLetterReason
from blackbox.firing.failures import NodeFailures
from blackbox.firing.rechecks import Rechecks
from blackbox.firing.shares import Share
from blackbox.kafka import deadletter
from blackbox.kafka.clients import lasting_reason
from blackbox.kafka.deadletter import DeadLetter
from blackbox.kafka.events import Event, Outcome
from blackbox.kafka.outbox import Outbox, Record, Reports
from blackbox.metrics import Metrics, observe_all
from blackbox.schedule import Schedule, Series, origin_topic, split_scoped
from blackbox.storage.store import (
    DEFAULT_CLAIM_BYTES,
    PROBED_DUE,
    PROBED_EMPTY,
    Acks,
    Advance,
    Claim,
    Loaded,
    RedisStore,
)

log = structlog.get_logger("blackbox.firing.dispatcher")
# Connections whose server is remembered at most (each new one costs an INFO at its first
# claim: see `_note_changes`).
MAX_CONNECTIONS_KNOWN = 1000
# Messages sent and not yet settled, at most, in full claims (by count and by payload
# bytes); past it the oldest batch is awaited. Counted in messages, not batches: steady
# firing sends batches of one, and a broker slow to acknowledge them must not hold back the
# next due message. It bounds what a crash can deliver twice (acknowledged, not yet
# settled) and the payloads the producer holds.
MAX_UNSETTLED_CLAIMS = 4
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
# The fewest ids a shard's claim takes when shards are claimed together.
MIN_SHARD_CLAIM = 64
# Due instants closer together than SETTLE_AHEAD_MS (steady firing at ~1,000/s) settle
# the reported batches at most this often, once the oldest was sent this long ago, all in
# one round trip: an ack round trip per this many ms, not one per batch (a kill may
# deliver again what was sent in this span).
SETTLE_EVERY_S = 0.01


# The earliest due time announced while a run fires (a nudge), or None.
Nudged = Callable[[], int | None]
# How far ahead a caller's next occurrence may be stored, ms (its policy's horizon).
Horizon = Callable[[bytes | None], int]


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How the dispatcher claims and retries."""

    batch_limit: int
    lease_ms: int
    max_attempts: int
    backoff_ms: int
    backoff_max_ms: int
    dlq_topic: str
    events_topic: str
    batch_bytes: int = DEFAULT_CLAIM_BYTES  # most payload bytes one claim takes

    def shared(self, shards: int) -> tuple[int, int]:
        """Each shard's limits (ids, payload bytes) when `shards` are claimed together: a
        share of one claim's, no less than MIN_SHARD_CLAIM ids (one shard: the whole)."""
        limit = min(self.batch_limit, max(MIN_SHARD_CLAIM, self.batch_limit // shards))
        return limit, max(1, self.batch_bytes // shards)

    def retry_delay_ms(self, attempt: int) -> int:
        """Exponential backoff: base * 2^(attempt-1), capped."""
        return int(min(self.backoff_max_ms, self.backoff_ms * 2 ** min(attempt - 1, 30)))


@dataclass(slots=True)
class Fired:
    """What one fire_due run did, and when the earliest schedule left is due."""

    delivered: int
    next_due_ms: int | None
    wake_ms: int | None = None  # when to run again: a held delivery's due time, or a claim's


@dataclass(slots=True)
class _Sent:
    """A claimed batch handed to the producer, awaiting its delivery reports."""

    claim: Claim
    payload_bytes: int = 0
    schedules: list[tuple[Schedule, int]] = field(default_factory=list)
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


@dataclass(slots=True)
class _Outcome:
    """What became of one claimed batch."""

    done: list[str]
    retry: dict[int, list[str]]
    delivered: int = 0
    fired: list[str] = field(default_factory=list)  # series' occurrences delivered
    # (error, kind) -> ids: logged once per batch, not once per message (an outage would
    # otherwise write a line per pending message per retry).
    failures: dict[tuple[str, str], list[str]] = field(default_factory=dict)


def delivery_record(schedule: Schedule, attempt: int) -> Record:
    """The record produced to the target topic: the value and key, the sender's headers,
    and headers to de-duplicate by (etf1's too, for a header-mode schedule)."""
    headers = tracing.delivered_headers(schedule, attempt)  # trace context too
    if schedule.caller is not None:
        headers.append((CALLER_HEADER, schedule.caller))
    if schedule.sent_ms is not None:
        headers += _etf1_headers(schedule)
    headers += [
        ("blackbox-id", schedule.id.encode()),
        ("blackbox-due-ms", str(schedule.due_ms).encode()),
        ("blackbox-attempt", str(attempt).encode()),
    ]
    if schedule.origin is not None:
        headers.append(("blackbox-version", schedule.origin.encode()))
    if schedule.series is not None:
        headers.append(("blackbox-occurrence-ms", str(schedule.series.occurrence_ms).encode()))
    return Record(schedule.topic, schedule.value, schedule.key, headers)


def _etf1_headers(schedule: Schedule) -> list[tuple[str, bytes | None]]:
    """What etf1's scheduler adds: the schedule's timestamp (s), its key and its topic."""
    scoped = split_scoped(schedule.id)
    key = scoped[1] if scoped is not None else schedule.id
    topic = origin_topic(schedule.origin or schedule.id)
    return [
        ("scheduler-timestamp", str((schedule.sent_ms or 0) // 1000).encode()),
        ("scheduler-key", key.encode()),
        ("scheduler-topic", topic.encode()),
    ]


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
    ) -> None:
        """`floors` tells each shard's clock floor: nothing is claimed from a Redis whose
        clock went below it (clocks.py); None: no floor. `rechecks` holds the shards whose
        Redis changed lately: what Kafka shows delivered there is not delivered again."""
        self.store = store
        self.floors = floors
        self.rechecks = rechecks
        self._servers: dict[int, str] = {}  # shard -> run id of the Redis its last claim met
        # The connections claims came over, and the run id of the server each leads to.
        self._connections: dict[bytes, str] = {}
        self._rechecks: dict[int, str] = {}  # shard -> the recheck mark its last claim met
        self.outbox = outbox
        self.policy = policy
        self.metrics = metrics
        self.horizon_of = horizon_of  # None: a series' next occurrence is never refused
        self._unsettled: deque[_Sent] = deque()
        self.claims = 0  # claims made so far: progress, even while one run drains a burst
        # The shards this replica fires: all of them until the share beats (shares.py).
        self.share = share or Share(store.layout)
        self._unsettled_messages = 0
        self._unsettled_bytes = 0
        self.ahead_ms = FIRE_AHEAD_MS
        self._window_end_ms = 0  # the claims of the current window take what is due by then
        self._settled_at = 0.0  # time.monotonic() of the last settling by _settle_ready
        # Deliveries claimed ahead, not due yet: (due ms, order, batch, index in the batch).
        self._held: list[tuple[int, int, _Sent, int]] = []
        self._order = itertools.count()

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
        self._release_due()  # before any round trip: what is held leaves on time
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
        self._release_due()
        unclaimed, held = self.share.next_due_ms(), self.held_due_ms()
        fired.next_due_ms = _soonest(unclaimed, held)
        # Woken at a held delivery's due time, and just before the next one not claimed
        # yet: that claim then takes the window from there.
        claim_at = None if unclaimed is None else unclaimed - CLAIM_LEAD_MS
        fired.wake_ms = _soonest(claim_at, held)
        fired.delivered += self._settle_until_due(fired.next_due_ms, stop, nudged)
        return fired

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
            identify=self.rechecks is not None,
        )  # fmt: skip
        self._note_changes(claims, at)
        for claim in claims:  # when a lease there can run out: reclaimed only then
            if claim.leases_seen:
                self.share.leased(claim.shard, claim.lease_expiry_ms, at)
            elif claim.ids:
                self.share.leasing(claim.shard, math.ceil(claim.token))
            if claim.ids:
                self._hold(self._prepare(claim))
        self._release_due()
        fired.delivered += self._settle_ready(stop)
        for claim in claims:  # more is due where a claim was full: look again
            self.share.learned(claim.shard, claim.at_ms if claim.more else claim.next_due_ms)
        return [claim.shard for claim in claims if claim.more]

    def _note_changes(self, claims: Sequence[Claim], at: int) -> None:
        """Claims another Redis server made than their shard's last (a failover, a restart:
        looked up where a claim came over a connection not seen before), or that meet a new
        recheck mark (an intake reads a gap again): what Kafka shows delivered there lately
        is looked up before anything is produced (rechecks.py), so that deliveries whose
        acks Redis lost are not made again."""
        if self.rechecks is None:
            return
        changed, left = [], set()  # shards that met another server; the servers left
        for claim in claims:
            if claim.recheck is not None and self._rechecks.get(claim.shard) != claim.recheck:
                self._rechecks[claim.shard] = claim.recheck
                self._open_marked(claim.shard, claim.recheck, at)
            if claim.connection is None:
                continue
            run_id = self._connections.get(claim.connection)
            if run_id is None:  # a new connection: to which server?
                run_id = self.store.run_id(claim.shard)
                if len(self._connections) >= MAX_CONNECTIONS_KNOWN:  # connections come and go
                    self._connections.clear()
                self._connections[claim.connection] = run_id
            self._against_clock(claim, run_id, at)
            before = self._servers.get(claim.shard)
            if before is not None and before != run_id:
                changed.append(claim.shard)
                left.add(before)
            self._servers[claim.shard] = run_id
        if changed:  # and the shards not claimed since, last seen on a server left
            changed += [s for s in range(self.store.layout.count) if s not in changed
                        and self._servers.get(s, next(iter(left))) in left]  # fmt: skip
            self.rechecks.open(changed, at)
            log.warning("redis_server_changed", shards=changed,
                        recheck="what the target topics show delivered within "
                        "BLACKBOX_REDIS_MAX_LAG is not delivered again")  # fmt: skip

    def _against_clock(self, claim: Claim, run_id: str, at: int) -> None:
        """A claim made on another server than the one its shard's clock was last moved on
        (Redis restarted, failed over or was restored since the last intake beat, maybe
        while this process was not running): what fired since the clock is looked up
        before anything is produced."""
        assert self.rechecks is not None
        if claim.clock_server is None or claim.clock_server == run_id or not claim.clock_at_ms:
            return
        since = claim.clock_at_ms - self.rechecks.max_lag_ms
        if (
            claim.shard in self.rechecks.windows
            and since >= self.rechecks.windows[claim.shard].since_ms
        ):
            return  # one open already reaches as far back
        self.rechecks.open([claim.shard], at, since)
        log.warning("redis_server_changed", shards=[claim.shard], clock_at_ms=claim.clock_at_ms,
                    recheck="what fired since its clock is not delivered again")  # fmt: skip

    def _open_marked(self, shard: int, mark: str, at: int) -> None:
        """Open the window a recheck mark ("<since ms> <until ms>") asks for, while it runs."""
        assert self.rechecks is not None
        since, _, until = mark.partition(" ")
        if since.isdigit() and until.isdigit() and at < int(until):
            self.rechecks.open([shard], at, int(since), int(until))
            log.info("recheck_opened", shard=shard, since_ms=int(since), until_ms=int(until))

    def settle_all(self, stop: threading.Event) -> int:
        """Wait for the reports of every batch sent and settle each, what is held and not
        due yet given back to due unproduced (stopping); how many were delivered."""
        self._give_back_held()
        return self._settle([self._oldest() for _ in range(len(self._unsettled))], stop)

    def _settle_until_due(
        self, next_due_ms: int | None, stop: threading.Event, nudged: Nudged
    ) -> int:
        """Settle the batches sent, waiting for their reports while nothing is due: never
        within SETTLE_AHEAD_MS of the next due time (a broker slow to acknowledge must not
        make the next message late). What is still unreported then is settled on a later
        run; with the next due time that close, only what `_settle_ready` settles now."""
        if next_due_ms is None:
            return self.settle_all(stop)
        delivered = self._settle_ready(stop)
        while self._unsettled and self._ahead_s(next_due_ms, nudged) > 0:
            if not self._await_reports(self._unsettled[0], next_due_ms, stop, nudged):
                break
            ready = [self._oldest()]  # and those reported with it, settled together
            while self._unsettled and self._unsettled[0].reported:
                ready.append(self._oldest())
            delivered += self._settle(ready, stop)
        return delivered

    def _oldest(self) -> _Sent:
        sent = self._unsettled.popleft()
        self._unsettled_messages -= len(sent.claim.ids)
        self._unsettled_bytes -= sent.payload_bytes
        return sent

    def _await_reports(
        self, sent: _Sent, next_due_ms: int, stop: threading.Event, nudged: Nudged
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
        now = time.monotonic()
        if not self._unsettled or (
            (now - self._unsettled[0].sent_at < SETTLE_EVERY_S
             or now - self._settled_at < SETTLE_EVERY_S)
            and not self._too_much_unsettled()
        ):  # fmt: skip
            return 0
        ready = []
        while self._unsettled and (self._unsettled[0].reported or self._too_much_unsettled()):
            ready.append(self._oldest())
        if ready:
            self._settled_at = now
        return self._settle(ready, stop)

    def _too_much_unsettled(self) -> bool:
        return (
            self._unsettled_messages > MAX_UNSETTLED_CLAIMS * self.policy.batch_limit
            or self._unsettled_bytes > MAX_UNSETTLED_CLAIMS * self.policy.batch_bytes
        )

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

    def _prepare(self, claim: Claim) -> _Sent:
        """Judge each id a claim took (deliver, dead-letter, skip), the deliveries in due
        order; nothing is produced yet."""
        sent = _Sent(claim=claim, payload_bytes=sum(len(i.payload or b"") for i in claim.loaded))
        for item in claim.loaded:
            self._classify(item, sent)
        claim.loaded.clear()  # the raw payloads are not kept till settled
        sent.schedules.sort(key=lambda pair: pair[0].due_ms)
        if self.rechecks is not None and self.rechecks.windows:
            schedules = [schedule for schedule, _ in sent.schedules]
            sent.shown = self.rechecks.delivered(claim.shard, schedules, now_ms())
            self.metrics.redeliveries_passed_over.inc(len(sent.shown))
        return sent

    def _hold(self, sent: _Sent) -> None:
        """Keep a prepared batch's deliveries until each falls due (`_release_due`); a batch
        with none to produce is sent off at once."""
        if not sent.schedules:
            self._sent_off(sent)
            return
        sent.reports = self.outbox.reports(len(sent.schedules))
        for index, (schedule, _) in enumerate(sent.schedules):
            heapq.heappush(self._held, (schedule.due_ms, next(self._order), sent, index))

    def _release_due(self) -> None:
        """Produce every held delivery that is due, soonest first, each at or after its
        due instant (a claim takes what falls due within `ahead_ms`: one claim and one ack
        serve all of them, and the waker wakes at each due time without a round trip)."""
        now, late = now_ms(), []
        while self._held and self._held[0][0] <= now:
            due_ms, _, sent, index = heapq.heappop(self._held)
            schedule, attempt = sent.schedules[index]
            assert sent.reports is not None  # it has schedules
            if index in sent.shown:  # delivered before Redis lost its ack: settled as such
                sent.reports.report(index, None, None)
            else:
                self.outbox.produce(delivery_record(schedule, attempt), sent.reports, index)
            late.append(max(0, now - due_ms) / 1000)
            sent.produced += 1
            if sent.produced == len(sent.schedules):
                self._sent_off(sent)
        if late:
            self.outbox.producer.poll(0)
            observe_all(self.metrics.send_lateness, late)

    def _sent_off(self, sent: _Sent) -> None:
        """Every delivery of a batch was handed over: it awaits its reports, to be settled."""
        sent.sent_at = time.monotonic()
        sent.deadline = sent.sent_at + self.outbox.wait_seconds
        self._unsettled.append(sent)
        self._unsettled_messages += len(sent.claim.ids)
        self._unsettled_bytes += sent.payload_bytes

    def _give_back_held(self) -> None:
        """Stopping: what is held and not due yet goes back to due at its own time,
        unproduced (settling releases it); what was produced of its batch is settled."""
        batches = {id(sent): sent for _, _, sent, _ in self._held}
        self._held.clear()
        for sent in batches.values():
            _withhold(sent, sent.produced)
            self._sent_off(sent)

    def held_due_ms(self) -> int | None:
        """When the soonest held delivery falls due, if any is held."""
        return self._held[0][0] if self._held else None

    def _settle(self, batches: Sequence[_Sent], stop: threading.Event) -> int:
        """Settle sent batches: the acks of all of them in one round trip (per Redis node),
        whatever their shards; how many were delivered."""
        if not batches:
            return 0
        outcomes = [self._conclude(sent, stop) for sent in batches]
        acks = [Acks([i for i in o.done if i not in s.advances], s.claim.token, s.claim.shard)
                for s, o in zip(batches, outcomes, strict=True)]  # fmt: skip
        acked = self.store.ack_all(acks)
        for sent, outcome, count in zip(batches, outcomes, acked, strict=True):
            self._record(sent.claim, outcome, sent.advances, count)
            if sent.advances:
                self._answer(_series_events(sent, outcome), stop)
            if sent.later:
                self.store.release(sent.later, sent.claim.token, sent.claim.shard)
                self.share.nudged(sent.claim.shard, min(due for _, due in sent.later))
        return sum(outcome.delivered for outcome in outcomes)

    def _conclude(self, sent: _Sent, stop: threading.Event) -> _Outcome:
        """Judge one sent batch by its reports (waiting for the missing ones until its
        deadline) and dead-letter what must be: what to ack and what to retry."""
        outcome = _Outcome(done=[], retry=defaultdict(list))
        if sent.reports is not None:
            left_s = max(0.0, sent.deadline - time.monotonic())
            errors = self.outbox.wait(sent.reports, stop, left_s)
            acked_ms = sent.reports.last_ms or now_ms()  # settling may come runs later
            self._judge(sent.schedules, errors, acked_ms, outcome, sent.dead)
        self._dead_letter(sent, outcome, stop)
        outcome.done += sent.cancelled + sent.passed
        return outcome

    def _classify(self, item: Loaded, sent: _Sent) -> None:
        """Deliver, dead-letter, or skip a claimed id (cancelled while a failed attempt held
        it, or not due after all)."""
        if item.ended == b"c":  # cancelled while a failed attempt held it
            sent.cancelled.append(item.id)
            return
        if item.payload is None:
            detail = "the payload expired before it could be delivered"
            reason = DeadLetterReason.EXPIRED
            sent.dead.append(deadletter.from_schedule(item.id, None, None, reason, detail))
            return
        try:
            schedule = Schedule.decode(item.id, item.payload)
        except CorruptSchedule as e:
            reason = DeadLetterReason.DELIVERY_FAILED
            sent.dead.append(deadletter.from_schedule(item.id, item.payload, None, reason, str(e)))
            return
        if schedule.due_ms > sent.claim.at_ms:
            # Not due after all. A guard: every script keeps a payload's due time at or
            # before its due score, and the claim took only scores up to at_ms.
            sent.later.append((item.id, schedule.due_ms))
            return
        if schedule.series is not None:
            self._occurrence(schedule, schedule.series, item.attempts, sent)
            return
        sent.schedules.append((schedule, item.attempts + 1))

    def _occurrence(self, schedule: Schedule, series: Series, attempts: int, sent: _Sent) -> None:
        """Deliver a series' occurrence (the one its missed policy picks), or pass over it,
        and prepare its next version, stored when the batch is settled."""
        now = sent.claim.at_ms
        horizon = None if self.horizon_of is None else self.horizon_of(schedule.caller)
        firing = recurrence.fire(series.rule, schedule.id, series.occurrence_ms, series.fired,
                                 now, paused=series.paused, retried=attempts > 0,
                                 horizon_ms=horizon)  # fmt: skip
        if firing.beyond_horizon:
            sent.beyond.add(schedule.id)
        following = None
        if firing.next is not None:
            following = _version(schedule, Series(series.rule, firing.next, firing.fired,
                                                  series.paused))  # fmt: skip
        sent.advances[schedule.id] = Advance(schedule.id, following)
        if firing.skipped:
            self.metrics.series_passed.inc()
        if firing.deliver is None:
            sent.passed.append(schedule.id)
            return
        occurrence = Series(series.rule, firing.deliver, firing.fired, series.paused)
        sent.schedules.append((_version(schedule, occurrence), attempts + 1))

    def _judge(
        self,
        schedules: Sequence[tuple[Schedule, int]],
        errors: Sequence[KafkaError | None],
        acked_ms: int,
        outcome: _Outcome,
        dead: list[DeadLetter],
    ) -> None:
        late = []
        for (schedule, attempt), error in zip(schedules, errors, strict=True):
            if error is None:
                outcome.done.append(schedule.id)
                late.append(max(0, acked_ms - schedule.due_ms) / 1000)
                if schedule.series is not None:
                    outcome.fired.append(schedule.id)
            else:
                self._failed(schedule, attempt, error, outcome, dead)
        outcome.delivered = len(late)
        observe_all(self.metrics.lateness, late)
        self.metrics.delivered.inc(outcome.delivered)
        for (error_text, kind), ids in outcome.failures.items():
            log.warning("delivery_failed", error=error_text, kind=kind, count=len(ids),
                        blackbox_ids=ids[:5])  # fmt: skip

    def _failed(
        self,
        schedule: Schedule,
        attempt: int,
        error: KafkaError,
        outcome: _Outcome,
        dead: list[DeadLetter],
    ) -> None:
        reason = lasting_reason(error)
        kind = "transient" if reason is None else "lasting"
        self.metrics.delivery_failures.labels(kind=kind).inc()
        outcome.failures.setdefault((error.str(), kind), []).append(schedule.id)
        if reason is not None and attempt >= self.policy.max_attempts:
            detail = f"{error.str()} (after {attempt} attempts)"
            dead.append(
                deadletter.from_schedule(
                    schedule.id, schedule.value, schedule.topic, reason, detail
                )
            )
        else:
            outcome.retry[attempt].append(schedule.id)

    def _dead_letter(self, sent: _Sent, outcome: _Outcome, stop: threading.Event) -> None:
        schedules = {s.id: s for s, _ in sent.schedules}
        events = []
        for letter, error in deadletter.send(self.outbox, self.policy.dlq_topic, sent.dead, stop):
            schedule_id = _id_of(letter)
            if error is None:
                outcome.done.append(schedule_id)
                self.metrics.dead_letters.labels(reason=letter.reason.value).inc()
                log.warning("dead_lettered", blackbox_id=schedule_id, reason=letter.reason.value)
                events.append(_dead_event(schedule_id, schedules.get(schedule_id), letter))
                _trace_dead_letter(self.policy.dlq_topic, schedules.get(schedule_id), letter)
            else:
                log.warning("dead_letter_failed", blackbox_id=schedule_id, error=error.str())
                outcome.retry[1].append(schedule_id)
        self._answer(events, stop)

    def _answer(self, events: list[Event], stop: threading.Event) -> None:
        """Tell callers their schedules were dead-lettered (best effort: logged if refused)."""
        if not events:
            return
        at = now_ms()
        records = [e.record(self.policy.events_topic, at) for e in events]
        errors = [e for e in self.outbox.send(records, stop) if e is not None]
        if errors:
            self.metrics.events_dropped.inc(len(errors))
            log.error("events_dropped", count=len(errors), error=errors[0].str())

    def _record(
        self, claim: Claim, outcome: _Outcome, advances: dict[str, Advance], acked: int
    ) -> None:
        """After the acks (`acked` of them still ours): store a series' next occurrence in
        the step that forgets this one, and give what failed back to due, under the
        claim's lease."""
        settled = [advances[i] for i in outcome.done if i in advances]
        if settled:
            acked += self.store.advance(settled, claim.token, now_ms(), claim.shard)
            dues = [a.next.due_ms for a in settled if a.next is not None]
            if dues:
                self.share.nudged(claim.shard, min(dues))
        if acked < len(outcome.done):
            log.warning("lease_lost", expected=len(outcome.done), acked=acked)
        for attempt, ids in outcome.retry.items():
            retry_at = now_ms() + self.policy.retry_delay_ms(attempt)
            self.store.retry(ids, claim.token, retry_at, claim.shard)
            self.share.nudged(claim.shard, retry_at)


def _soonest(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)


def _withhold(sent: _Sent, produced: int) -> None:
    """Keep the first `produced` deliveries of a batch; the rest (not due when firing
    stopped) go back to due at their due time, unproduced."""
    if produced == len(sent.schedules):
        return
    withheld, sent.schedules = sent.schedules[produced:], sent.schedules[:produced]
    sent.later += [(schedule.id, schedule.due_ms) for schedule, _ in withheld]
    for schedule, _ in withheld:
        sent.advances.pop(schedule.id, None)
    if sent.reports is not None:
        sent.reports.withdraw_after(produced)
        if produced == 0:
            sent.reports = None


def _version(schedule: Schedule, series: Series) -> Schedule:
    """The schedule of one occurrence of its series: due at that occurrence, jitter added."""
    due_ms = series.rule.due_of(schedule.id, series.occurrence_ms)
    return replace(schedule, due_ms=due_ms, series=series)


def _series_events(sent: _Sent, outcome: _Outcome) -> list[Event]:
    """`fired` for each occurrence delivered, `completed` for each series ended here."""
    delivered, settled = set(outcome.fired), set(outcome.done)
    events = [
        Event.of_stored(
            Outcome.FIRED,
            s.id,
            s.caller,
            due_ms=s.due_ms,
            topic=s.topic,
            occurrence_ms=s.series.occurrence_ms if s.series else None,
        )
        for s, _ in sent.schedules
        if s.series is not None and s.id in delivered
    ]
    for advance in sent.advances.values():
        if advance.next is None and advance.id in settled:
            events.append(_completed(advance.id, beyond=advance.id in sent.beyond))
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
