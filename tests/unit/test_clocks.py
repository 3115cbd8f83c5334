"""What the shards' clocks say of a Redis (storage/clocks.py), and how a gap check turns it
into every partition's verdict (intake/gaps.py): pure logic, no process. beat.lua and the
claims it guards run on a real Redis in tests/integration/test_clocks.py."""

from __future__ import annotations

from typing import Any

from blackbox.intake.gaps import Kind, Verdict, clock_loss, redis_wide, unread_deleted
from blackbox.storage.clocks import Clocks, Reading, State, reading
from blackbox.storage.keys import Layout

MAX_LAG_MS = 60_000


def test_a_shard_without_the_clock_it_had_was_flushed() -> None:
    """Issue 50: a flush (or a restart without data) is told from a failover's lag by the
    clock it took with it, however few records lie behind."""
    assert Reading(State.MISSING).lost == "flushed"
    assert clock_loss([Reading(State.OK, 5), Reading(State.MISSING)]) is Kind.FLUSHED


def test_a_clock_gone_back_beyond_the_lag_was_restored() -> None:
    assert Reading(State.STALE, 5).lost == "restored"
    assert clock_loss([Reading(State.STALE, 5)]) is Kind.RESTORED


def test_a_mark_left_in_redis_holds_with_its_own_kind() -> None:
    """A restart finds what an earlier process found: the mark's first word is its kind."""
    found = reading([b"lost", b"17", b"flushed 1700000000000 see the log", b"r1"])
    assert found == Reading(State.LOST, 17, "flushed 1700000000000 see the log", "r1")
    assert clock_loss([found]) is Kind.FLUSHED
    assert clock_loss([Reading(State.LOST, None, "from a later release")]) is Kind.RESTORED


def test_clocks_whole_or_new_say_nothing_was_lost() -> None:
    assert clock_loss([Reading(State.OK, 5), Reading(State.NONE)]) is None
    assert reading([b"none", None, None, None]) == Reading(State.NONE)


def test_a_partition_found_fine_on_a_lost_redis_is_lost_with_nothing_to_read() -> None:
    """Every partition holds on a Redis that lost data; a gap keeps its records (what a
    re-read by the operator's choice reads), a fine one has none."""
    assert redis_wide(Verdict(Kind.FINE), Kind.FLUSHED, 40) == Verdict(Kind.FLUSHED, 40, 40)
    assert redis_wide(Verdict(Kind.LAG, 0, 40), Kind.FLUSHED, 40) == Verdict(Kind.FLUSHED, 0, 40)
    assert Verdict(Kind.FLUSHED, 40, 40).lost
    assert not Verdict(Kind.LAG, 0, 40).lost


def test_committed_offsets_below_what_kafka_holds_were_deleted_unread() -> None:
    """Issue 50: records Kafka deleted before intake read them are lost data, counted from
    the commit to the log start, not a silent reset to the oldest record left."""
    found = unread_deleted(10, 15)
    assert found == Verdict(Kind.DELETED_UNREAD, 10, 15, 15)
    assert found.lost
    assert found.aged_out == 5
    assert unread_deleted(15, 15).kind is Kind.FINE
    assert unread_deleted(None, 15).kind is Kind.FINE  # never committed: read from the start


class _Beats:
    """beat.lua's answers, as a Redis holding `at` per shard would give them."""

    def __init__(self, at: list[int | None]) -> None:
        self.at = at
        self.floors: list[list[int]] = []

    def __call__(
        self, floors: list[int], now_ms: int, *, write: bool, servers: list[str] | None = None
    ) -> list[Any]:
        self.floors.append(list(floors))
        answers: list[Any] = []
        for at, floor in zip(self.at, floors, strict=True):
            if at is None:
                answers.append([b"missing" if floor >= 0 else b"none", None, None, None])
            elif at < floor:
                answers.append([b"stale", str(at).encode(), None, b"r1"])
            else:
                answers.append([b"ok", str(at).encode(), None, b"r1"])
        return answers


def test_floors_follow_the_newest_clock_seen_less_the_lag() -> None:
    """A process that saw no clock yet judges nothing (-1); once it saw one, a clock more
    than the lag older is stale, one within it is a failover's lag."""
    beats = _Beats([100_000, None])
    clocks = Clocks(None, Layout("ns", 2), MAX_LAG_MS, beats)  # type: ignore[arg-type]
    assert clocks.floors() == {0: -1, 1: -1}
    assert [c.state for c in clocks.look(0)] == [State.OK, State.NONE]
    assert clocks.floors() == {0: 100_000 - MAX_LAG_MS, 1: -1}
    assert clocks.oldest_ms() == 100_000

    beats.at = [100_000 - MAX_LAG_MS - 1, None]  # a snapshot older than the lag
    assert clocks.look(0)[0].lost == "restored"
    beats.at = [100_000 - MAX_LAG_MS, None]  # a replica the lag behind
    assert clocks.look(0)[0].lost is None
    assert beats.floors[-1] == [100_000 - MAX_LAG_MS, -1]
