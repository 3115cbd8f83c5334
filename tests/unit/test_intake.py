"""Intake's pure parts, without processes: how a poll is read, and how its requests are cut
into parts and script chunks that each move a watermark."""

from __future__ import annotations

from typing import Any, cast

from confluent_kafka import Consumer

from blackbox.envelope import Limits
from blackbox.intake.batch import Batch
from blackbox.intake.config import IntakeConfig
from blackbox.intake.incarnations import Incarnations
from blackbox.intake.loop import PAUSE_SECONDS, POLL_SECONDS, Intake
from blackbox.intake.policy import open_policy
from blackbox.metrics import Metrics
from blackbox.schedule import Schedule
from blackbox.storage.applying import SCRIPT_CHUNK, IntakeSlice


class _Consumer:
    """Stands in for confluent-kafka's Consumer: hands out queued records as poll() and
    consume() do, and notes how it was asked."""

    def __init__(self, queued: list[str]) -> None:
        self.queued = queued
        self.calls: list[tuple[object, ...]] = []

    def poll(self, timeout: float) -> str | None:
        self.calls.append(("poll", timeout))
        return self.queued.pop(0) if self.queued else None

    def consume(self, num_messages: int, timeout: float) -> list[str]:
        self.calls.append(("consume", num_messages, timeout))
        taken, self.queued = self.queued[:num_messages], self.queued[num_messages:]
        return taken


class _Arrivals(_Consumer):
    """A stream: each consume() after the first hands out the next arrival (a list of
    records; an empty one is a pause)."""

    def __init__(self, first: list[str], arrivals: list[list[str]]) -> None:
        super().__init__(first)
        self.arrivals = arrivals

    def consume(self, num_messages: int, timeout: float) -> list[str]:
        if self.queued or timeout == 0:
            return super().consume(num_messages, timeout)
        self.calls.append(("consume", num_messages, timeout))
        return self.arrivals.pop(0)[:num_messages] if self.arrivals else []


def _intake(consumer: _Consumer, batch: int, window_s: float = 0.0) -> Intake:
    limits = Limits(max_value_bytes=1024, forbidden_topics=frozenset())
    config = IntakeConfig(("in",), batch, "dlq", "events", limits, open_policy(3600, 1024),
                          window_s=window_s)  # fmt: skip
    unused: Any = None  # neither the store nor the outbox is reached
    incarnations = Incarnations(lambda names: {})
    return Intake(
        cast(Consumer, consumer), unused, unused, config, Metrics(),
        incarnations=incarnations, guard=unused, nonces=unused,
    )  # fmt: skip


def test_a_poll_waits_for_the_first_record_only_and_drains_what_was_fetched() -> None:
    """Guarantee 6: a record is handled as it arrives (consume(n, t) would hold it until n
    arrived or t passed), and a backlog still comes in full batches."""
    consumer = _Consumer(["r0", "r1", "r2", "r3", "r4"])

    taken: list[object] = list(_intake(consumer, batch=3)._consume())

    assert taken == ["r0", "r1", "r2"]
    assert consumer.calls == [("poll", POLL_SECONDS), ("consume", 2, 0)]


def test_an_empty_poll_takes_nothing_and_drains_nothing() -> None:
    """An idle intake waits in poll() only, so it sees a stop within POLL_SECONDS."""
    consumer = _Consumer([])

    assert list[object](_intake(consumer, batch=500)._consume()) == []
    assert consumer.calls == [("poll", POLL_SECONDS)]


def test_a_batch_of_one_never_asks_consume_for_nothing() -> None:
    """BLACKBOX_INTAKE_BATCH=1 is valid: consume(0) would be refused by the client."""
    consumer = _Consumer(["r0", "r1"])

    assert list[object](_intake(consumer, batch=1)._consume()) == ["r0"]
    assert consumer.calls == [("poll", POLL_SECONDS)]


def test_a_window_gathers_while_records_keep_coming_and_ends_at_the_first_pause() -> None:
    """A steady stream is handled a window at a time (one Redis write, crash note and
    answers request for many records); the window ends at a pause, whatever is left of it."""
    consumer = _Arrivals(["r0"], [["r1", "r2"], ["r3"], [], ["r4"]])

    taken: list[object] = list(_intake(consumer, batch=500, window_s=60.0)._consume())

    assert taken == ["r0", "r1", "r2", "r3"]
    waits = [c[2] for c in consumer.calls if c[0] == "consume" and c[2] != 0]
    assert waits == [PAUSE_SECONDS] * 3  # each wait a pause's length, the third came empty
    assert consumer.arrivals == [["r4"]]  # left for the next poll


def test_a_lone_record_waits_a_pause_not_the_window() -> None:
    """A quiet topic's record (a countdown of 0, say) is late by the pause at most."""
    consumer = _Arrivals(["r0"], [])

    assert list[object](_intake(consumer, batch=500, window_s=60.0)._consume()) == ["r0"]
    assert consumer.calls == [("poll", POLL_SECONDS), ("consume", 499, 0),
                              ("consume", 499, PAUSE_SECONDS)]  # fmt: skip


def test_a_full_batch_ends_the_window_and_no_window_waits_for_nothing() -> None:
    """The window never takes more than a batch; BLACKBOX_INTAKE_WINDOW_MS=0 waits for no
    more than the first poll brought."""
    stream = _Arrivals(["r0"], [["r1", "r2", "r3"], ["r4"]])
    assert list[object](_intake(stream, batch=3, window_s=60.0)._consume()) == ["r0", "r1", "r2"]
    quiet = _Arrivals(["r0"], [["r1"]])
    assert list[object](_intake(quiet, batch=500, window_s=0.0)._consume()) == ["r0"]
    assert quiet.calls == [("poll", POLL_SECONDS), ("consume", 499, 0)]


def _schedule(offset: int) -> Schedule:
    return Schedule(f"in:0:{offset}", "orders", b"v", 1)


def test_each_part_moves_the_watermark_past_every_record_parsed_refused_ones_too() -> None:
    """Guarantee 1: a part's slice carries the last offset parsed, even a refused record's,
    so a re-read skips it; the requests sent keep their order across parts."""
    batch = Batch({"in": "EhQ/z1Nx"})
    for offset in range(5):
        batch.saw("in", 0, offset)
        if offset not in (2, 4):  # 2 and 4 were refused (dead-lettered)
            batch.unsent[("in", 0)].append((offset, _schedule(offset)))
    (first,) = batch.take_slices()
    for offset in (5, 6):
        batch.saw("in", 0, offset)
        batch.unsent[("in", 0)].append((offset, _schedule(offset)))
    (second,) = batch.take_slices()

    assert (first.last_offset, [o for o, _ in first.items]) == (4, [0, 1, 3])
    assert first.field == second.field == "in:0:EhQ/z1Nx"
    assert (second.last_offset, [o for o, _ in second.items]) == (6, [5, 6])
    assert [c.offset for c, _ in batch.sent] == [0, 1, 3, 5, 6]
    assert batch.take_slices() == []


def test_a_later_parts_first_chunk_waits_for_the_earlier_parts_watermark() -> None:
    """Guarantee 1: chunks chain their watermarks, the first one to the part before it, so
    a call never moves a watermark past one that failed."""
    items = [(o, _schedule(o)) for o in range(10, 10 + SCRIPT_CHUNK + 5)]
    part = IntakeSlice("in", 0, 10 + SCRIPT_CHUNK + 5, items)

    positioned = list(enumerate(part.items))
    (_, first_after, first_mark), (_, second_after, second_mark) = list(part.chunks(positioned, 9))

    assert first_after == 9 and first_mark == 10 + SCRIPT_CHUNK - 1
    assert second_after == first_mark and second_mark == part.last_offset
    assert [after for _, after, _ in IntakeSlice("in", 0, 3, []).chunks([])] == [-1]
