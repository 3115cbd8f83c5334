"""Flight: the batches between their claim and their settling.

A prepared batch's deliveries are *held* until each falls due (a claim takes what falls due
within a window), *released* to the producer at their due instant, soonest first, and the
batch, once all of it was handed over, is *sent off*: it awaits its delivery reports in the
unsettled queue, oldest first, to be settled (settling.py). What was sent and not settled
is bounded (MAX_UNSETTLED_CLAIMS): it bounds what a crash can deliver twice and the
payloads the producer holds.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections import deque

from blackbox.clock import now_ms
from blackbox.firing.batch import Batch
from blackbox.firing.delivery import delivery_record
from blackbox.firing.retry import RetryPolicy
from blackbox.kafka.outbox import Outbox
from blackbox.metrics import Metrics, observe_all

# Messages sent and not yet settled, at most, in full claims (by count and by payload
# bytes); past it the oldest batch is awaited. Counted in messages, not batches: steady
# firing sends batches of one, and a broker slow to acknowledge them must not hold back the
# next due message.
MAX_UNSETTLED_CLAIMS = 4


class Flight:
    """The deliveries held until due, and the batches sent and not settled yet."""

    def __init__(self, outbox: Outbox, policy: RetryPolicy, metrics: Metrics) -> None:
        self.outbox = outbox
        self.policy = policy
        self.metrics = metrics
        # Deliveries claimed ahead, not due yet: (due ms, order, batch, index in the batch).
        self._held: list[tuple[int, int, Batch, int]] = []
        self._order = itertools.count()
        self.unsettled: deque[Batch] = deque()
        self._unsettled_messages = 0
        self._unsettled_bytes = 0

    def hold(self, batch: Batch) -> None:
        """Keep a prepared batch's deliveries until each falls due (`release_due`); a batch
        with none to produce is sent off at once."""
        if not batch.schedules:
            self._sent_off(batch)
            return
        batch.reports = self.outbox.reports(len(batch.schedules))
        for index, (schedule, _) in enumerate(batch.schedules):
            heapq.heappush(self._held, (schedule.due_ms, next(self._order), batch, index))

    def release_due(self) -> None:
        """Produce every held delivery that is due, soonest first, each at or after its
        due instant (one claim and one ack serve all of a window's deliveries, and the
        waker wakes at each due time without a round trip)."""
        late: list[float] = []
        while self._held:
            # The clock read for each record: producing a long window's records takes tens
            # of milliseconds, and each record's timestamp (and its lateness) is its own.
            now = now_ms()
            if self._held[0][0] > now:
                break
            due_ms, _, batch, index = heapq.heappop(self._held)
            schedule, attempt = batch.schedules[index]
            assert batch.reports is not None  # it has schedules
            if index in batch.shown:  # delivered before Redis lost its ack: settled as such
                batch.reports.report(index, None, None)
            else:
                self.outbox.produce(delivery_record(schedule, attempt), batch.reports, index)
            late.append(max(0, now - due_ms) / 1000)
            batch.produced += 1
            if batch.produced == len(batch.schedules):
                self._sent_off(batch)
        if late:
            self.outbox.producer.poll(0)
            observe_all(self.metrics.send_lateness, late)

    def give_back_held(self) -> None:
        """Stopping: what is held and not due yet goes back to due at its own time,
        unproduced (settling releases it); what was produced of its batch is settled."""
        batches = {id(batch): batch for _, _, batch, _ in self._held}
        self._held.clear()
        for batch in batches.values():
            batch.withhold()
            self._sent_off(batch)

    def held_due_ms(self) -> int | None:
        """When the soonest held delivery falls due, if any is held."""
        return self._held[0][0] if self._held else None

    def oldest(self) -> Batch:
        """The batch sent off first and not settled, taken off the queue to be settled."""
        batch = self.unsettled.popleft()
        self._unsettled_messages -= len(batch.claim.ids)
        self._unsettled_bytes -= batch.payload_bytes
        return batch

    def too_much_unsettled(self) -> bool:
        return (
            self._unsettled_messages > MAX_UNSETTLED_CLAIMS * self.policy.batch_limit
            or self._unsettled_bytes > MAX_UNSETTLED_CLAIMS * self.policy.batch_bytes
        )

    def _sent_off(self, batch: Batch) -> None:
        """Every delivery of a batch was handed over: it awaits its reports, to be settled."""
        batch.sent_at = time.monotonic()
        batch.deadline = batch.sent_at + self.outbox.wait_seconds
        self.unsettled.append(batch)
        self._unsettled_messages += len(batch.claim.ids)
        self._unsettled_bytes += batch.payload_bytes
