"""The judgement of an intake partition's gap (gaps.verdict) and the marks intake keeps of
what Redis confirmed (watermarks.Watermarks): pure logic, no process."""

from __future__ import annotations

from blackbox.intake.gaps import Kind, Verdict, held_by_kafka, verdict
from blackbox.storage.watermarks import REFRESH_OFFSETS, Watermarks

LIMIT = 1000


def test_marks_at_the_commit_are_fine() -> None:
    """Guarantee 1: every shard's mark at the last committed record: nothing to read again."""
    assert verdict([9, 9, 9], [None] * 3, 10, LIMIT) == Verdict(Kind.FINE)


def test_a_new_partition_is_fine() -> None:
    """No commit and no mark: a partition never read, not a loss."""
    assert verdict([None, None], [None, None], None, LIMIT).kind is Kind.FINE


def test_a_lagging_shard_is_read_again_from_its_mark() -> None:
    """Guarantee 1: a failover lost the newest writes of one shard: the partition is read
    again from just after the lowest mark up to the commit."""
    found = verdict([40, 25, 40], [None] * 3, 41, LIMIT)
    assert found == Verdict(Kind.LAG, 26, 41)
    assert found.records == 15


def test_shards_without_a_mark_that_never_had_one_are_left_out() -> None:
    """A shard that never received a record of the partition has no mark: not a gap."""
    assert verdict([None, 40], [None, None], 41, LIMIT, refreshed=False).kind is Kind.FINE


def test_a_shard_without_a_mark_in_a_field_this_release_marked_everywhere_lost_it() -> None:
    """Guarantee 1 (a Redis Cluster master restarted empty): where every shard of a field
    was marked (recorded refreshed), a shard without a mark lost it, even one this process
    never saw: the partition is read again from its start."""
    assert verdict([None, 40], [None, None], 41, LIMIT) == Verdict(Kind.LAG, 0, 41)


def test_a_mark_lost_below_what_this_process_saw_confirmed_is_a_gap() -> None:
    """Guarantee 1: Redis went back below a mark it confirmed to this process (found
    without asking the group): read again from the mark Redis still holds."""
    assert verdict([50, 30], [50, 45], None, LIMIT) == Verdict(Kind.LAG, 31, 51)


def test_a_mark_this_process_saw_that_redis_no_longer_has_counts_as_minus_one() -> None:
    """A shard's whole mark lost: everything of the partition is read again."""
    assert verdict([50, None], [50, 20], None, LIMIT) == Verdict(Kind.LAG, 0, 51)


def test_committed_offsets_without_any_mark_are_lost_data() -> None:
    """Guarantee 1 (a flushed Redis): the group committed, Redis holds no trace: lost data,
    never run on silently."""
    found = verdict([None, None], [None, None], 500, LIMIT, refreshed=False)
    assert found == Verdict(Kind.NO_WATERMARK, 0, 500)
    assert found.lost


def test_a_gap_over_the_limit_is_lost_data_not_lag() -> None:
    """A Redis restored from an old snapshot: more records than the limit behind is lost
    data (read again, they would deliver again what fired since)."""
    found = verdict([10, 10], [None, None], 10 + LIMIT + 2, LIMIT)
    assert found.kind is Kind.FAR_BEHIND
    assert found.start == 11
    assert found.lost
    assert verdict([10, 10], [None, None], 11 + LIMIT, LIMIT).kind is Kind.LAG


def test_marks_ahead_of_the_commit_are_fine() -> None:
    """Redis applied records whose offsets were not committed yet (a crash before the
    commit): they are read again anyway, and skipped as replays."""
    assert verdict([80, 90], [None, None], 50, LIMIT).kind is Kind.FINE


def test_unknown_shards_lag_until_confirmed() -> None:
    """Guarantee 1: a partition this process has not marked yet has every shard moved
    along with its first slice, so the lowest mark soon follows the newest."""
    marks = Watermarks()
    assert marks.lagging("t:0", 5, 4) == [0, 1, 2, 3]
    marks.confirm({("t:0", 0): 5, ("t:0", 1): 5, ("t:0", 2): 5, ("t:0", 3): 5})
    assert marks.lagging("t:0", 5, 4) == []
    assert marks.lagging("t:0", 5 + REFRESH_OFFSETS, 4) == []
    marks.confirm({("t:0", 2): 5 + REFRESH_OFFSETS + 1})
    assert marks.lagging("t:0", 6 + REFRESH_OFFSETS, 4) == [0, 1, 3]


def test_confirmed_marks_never_go_back() -> None:
    """A late confirmation of a lower mark keeps the higher one."""
    marks = Watermarks()
    marks.confirm({("t:0", 1): 70})
    marks.confirm({("t:0", 1): 60})
    assert marks.known("t:0", 2) == [None, 70]


def test_forgetting_a_partition_forgets_every_incarnation_of_it() -> None:
    """After a rebalance another process may have moved the marks: every field of the
    partition ("topic:partition[:tag]") is forgotten, others kept."""
    marks = Watermarks()
    marks.confirm({("t:0", 0): 1, ("t:0:abc", 0): 2, ("t:1", 0): 3, ("t:10", 0): 4})
    marks.forget([("t", 0)])
    assert marks.known("t:0", 1) == [None]
    assert marks.known("t:0:abc", 1) == [None]
    assert marks.known("t:1", 1) == [3]
    assert marks.known("t:10", 1) == [4]


def test_marks_an_older_release_wrote_are_judged_by_the_newest() -> None:
    """Guarantee 11 (releases upgrade in place): the previous release moved a shard's mark
    only with a request for that shard, so one id updated 100,000 times leaves the other
    shards' marks far behind with nothing lost; until this release has marked every shard,
    the newest mark is judged against the commit, not the lowest."""
    marks: list[int | None] = [99, 100_400, 99]
    assert verdict(marks, [None] * 3, 100_401, LIMIT, refreshed=False).kind is Kind.FINE
    assert verdict(marks, [None] * 3, 100_401, LIMIT).kind is Kind.FAR_BEHIND
    behind = verdict([99, 500, 99], [None] * 3, 700, LIMIT, refreshed=False)
    assert behind == Verdict(Kind.LAG, 501, 700)


def test_a_field_is_recorded_refreshed_once_every_shard_is_confirmed() -> None:
    """The record that a field's marks are kept refreshed is written once every shard's
    mark was confirmed, once per process, and again after a gap or a rebalance."""
    marks = Watermarks()
    marks.confirm({("t:0", 0): 5})
    assert marks.unrecorded(2) == []
    marks.confirm({("t:0", 1): 5})
    assert marks.unrecorded(2) == ["t:0"]
    marks.recorded(["t:0"])
    assert marks.unrecorded(2) == []
    marks.reset("t:0", [5, 5])
    assert marks.unrecorded(2) == ["t:0"]


def test_a_lag_whose_first_records_kafka_deleted_is_lost_data() -> None:
    """Guarantee 1: a failover's gap that begins below the partition's log start offset
    (retention deleted its first records) cannot be read again in full: lost data, never a
    re-read that the consumer would silently begin at the oldest record left."""
    found = held_by_kafka(Verdict(Kind.LAG, 10, 30), 20)
    assert found == Verdict(Kind.AGED_OUT, 10, 30, kept_from=20)
    assert found.lost and found.aged_out == 10 and found.records == 20


def test_a_lag_kafka_still_holds_is_read_again() -> None:
    """A gap at or above the log start offset is a failover's lag, read again as before."""
    assert held_by_kafka(Verdict(Kind.LAG, 20, 30), 20).kind is Kind.LAG
    assert held_by_kafka(Verdict(Kind.FINE), 99) == Verdict(Kind.FINE)


def test_lost_data_keeps_its_kind_and_notes_what_kafka_deleted() -> None:
    """A wiped Redis over a topic whose oldest records aged out stays no_watermark, and the
    records gone from Kafka are counted up to the gap's end only."""
    found = held_by_kafka(Verdict(Kind.NO_WATERMARK, 0, 30), 50)
    assert (found.kind, found.aged_out) == (Kind.NO_WATERMARK, 30)
