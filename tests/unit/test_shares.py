"""A replica's share of the shards: who fires what, and when each shard is next due."""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs

from blackbox.firing.shares import EMPTY, Share, owned_by, sweep_after_ms, ttl_ms
from blackbox.storage.keys import Layout


@pytest.mark.parametrize(("members", "shards"), [(1, 4), (3, 12), (3, 16), (5, 3)])
def test_every_shard_has_one_owner_and_shares_differ_by_one_at_most(
    members: int, shards: int
) -> None:
    """Scale: replicas share the firing fairly; no shard is left without an owner."""
    shares = [owned_by(rank, members, shards) for rank in range(members)]
    flat = sorted(s for share in shares for s in share)
    assert flat == list(range(shards))
    assert max(map(len, shares)) - min(map(len, shares)) <= 1


def test_a_new_share_fires_every_shard_at_once() -> None:
    """Scale: before its first heartbeat a replica fires everything (alone, it must)."""
    share = Share(Layout("bb", 3))
    assert share.due_by(0) == [0, 1, 2] and share.others() == []


def test_a_shard_is_claimed_only_once_it_is_due_or_nudged() -> None:
    """Scale, no herd: a waker claims the shards whose next due time has come, learned from
    the last claim or lowered by a nudge, not every shard at every wake-up."""
    share = Share(Layout("bb", 3))
    share.learned(0, None)
    share.learned(1, 5_000)
    share.learned(2, 9_000)

    assert share.due_by(4_999) == [] and share.next_due_ms() == 5_000
    assert share.nudged(0, 3_000) is True
    assert share.due_by(4_000) == [0] and share.next_due_ms() == 3_000
    share.learned(0, None)
    share.learned(1, None)
    share.learned(2, None)
    assert share.next_due_ms() is None and share._due[0] == EMPTY


def test_a_shard_taken_over_is_looked_at_at_once_and_one_given_away_ignored() -> None:
    """Scale: when shares move, a newly owned shard is claimed at once (its due time is
    unknown here), and nudges for shards now fired by another replica are left to it."""
    share = Share(Layout("bb", 4))
    for shard in range(4):
        share.learned(shard, None)

    share._take(owned_by(1, 2, 4), members=2)

    assert share.owned == [1, 3] and share.others() == [0, 2]
    assert share.nudged(0, 1) is False and share.due_by(10) == []
    share._take(owned_by(0, 1, 4), members=1)
    assert share.due_by(10) == [0, 2]  # taken back: unknown, so looked at now


def test_heartbeats_and_sweeps_scale_with_the_poll_interval() -> None:
    """Scale: a heartbeat outlives a few ticks; a sweep waits past two poll intervals."""
    assert ttl_ms(1.0) == 5_000 and ttl_ms(10.0) == 30_000
    assert sweep_after_ms(0.1) == 2_000 and sweep_after_ms(5.0) == 10_000


def test_a_nudge_during_a_claim_is_not_overwritten_by_what_the_claim_saw() -> None:
    """Scale, on time: a message stored while a claim of its shard runs may be unseen by
    that claim's answer; its nudge still counts, so the waker claims the shard at its due
    time rather than a tick later."""
    share = Share(Layout("bb", 2))
    share.learned(1, None)
    share.claiming(0)
    assert share.nudged(0, 7_000) is True  # intake, between the claim's Lua call and learned
    share.learned(0, None)  # the claim saw nothing left

    assert share.due_by(7_000) == [0] and share.next_due_ms() == 7_000


def test_a_firer_without_a_shard_says_so() -> None:
    """Scale, fair by default: a firing process that gets no shard (more firers than
    shards) logs share_empty once its share is taken, naming the count to raise."""
    share = Share(Layout("bb", 2), "c")
    with capture_logs() as logs:
        share._take([], 3)
    assert share.owned == []
    assert [e["event"] for e in logs] == ["share_changed", "share_empty"]
    assert logs[1]["shards"] == 2 and logs[1]["log_level"] == "warning"


def test_a_shard_is_reclaimed_only_once_a_lease_there_can_have_run_out() -> None:
    """Guarantee 3 at idle cost (issue 40): every owned shard is reclaimed at start (its
    leases unknown), then only once the earliest lease its last claim, reclaim or probe saw
    can have run out, or what was seen is older than `refresh_ms`; a share change or a
    Redis error makes every shard unknown again."""
    share = Share(Layout("bb", 3), refresh_ms=15_000)
    assert share.expired_by(1_000) == [0, 1, 2]
    share.reclaiming([0, 1, 2])
    for shard in (0, 1, 2):
        share.reclaimed(shard, None, 1_000)
    share.leased(1, 31_000, 2_000)  # a claim at 2 s, leased for 29 s
    assert share.expired_by(15_999) == []
    assert share.expired_by(16_000) == [0, 2]  # seen 15 s ago: looked at again
    share.leased(0, None, 16_500)  # a probe found shards 0 and 2 empty
    share.leased(2, None, 16_500)
    assert share.expired_by(17_000) == [1]  # its learning is 15 s old too
    share.reclaiming([1])
    share.reclaimed(1, 31_000, 17_000)
    assert share.expired_by(30_999) == [] and share.expired_by(31_000) == [1]

    share.forget_leases()
    assert share.expired_by(17_001) == [0, 1, 2]
    for shard in (0, 1, 2):
        share.leased(shard, None, 18_000)
    share._take(owned_by(0, 2, 3), members=2)
    assert share.expired_by(18_001) == [0, 2]


def test_a_claim_during_a_reclaim_is_not_overwritten_by_what_the_reclaim_saw() -> None:
    """Guarantee 3: a lease taken while a reclaim of its shard runs may be unseen by the
    reclaim's answer; the claim's answer still counts, so the shard is reclaimed once that
    lease can have run out."""
    share = Share(Layout("bb", 1), refresh_ms=60_000)
    share.reclaiming([0])
    share.leased(0, 31_000, 1_000)  # the claim's answer, read first
    share.reclaimed(0, None, 1_000)  # the reclaim ran before the claim in Redis

    assert share.expired_by(30_999) == [] and share.expired_by(31_000) == [0]


def test_a_claim_looks_at_its_shards_leases_only_now_and_then() -> None:
    """Guarantee 3 at steady cost: a claim reads its shard's earliest lease (one read more)
    only where the leases are unknown or were looked at half a refresh ago; otherwise its
    own lease only lowers the known expiry."""
    share = Share(Layout("bb", 2), refresh_ms=10_000)
    assert share.unseen([0, 1], 1_000) == {0, 1}  # unknown at start
    share.leased(0, None, 1_000)
    share.leased(1, 40_000, 1_000)
    assert share.unseen([0, 1], 5_999) == set() and share.unseen([0, 1], 6_000) == {0, 1}
    share.leasing(0, 31_000)  # a claim at 1 s that did not look
    share.leasing(1, 35_000)
    assert share._expiry == {0: 31_000, 1: 35_000} and share.expired_by(10_000) == []
    share.forget_leases()
    share.leasing(0, 31_000)  # unknown stays unknown
    assert share.unseen([0], 1_000) == {0} and share.expired_by(1_000) == [0, 1]
