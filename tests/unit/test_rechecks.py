"""What firing looks up after Redis changed under it (firing/rechecks.py): pure logic, no
process. The failover itself, on real processes, is tests/integration/test_failover.py."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from blackbox.firing.rechecks import Rechecks
from blackbox.kafka.deliveries import Delivered, Deliveries
from blackbox.schedule import Schedule

LAG_MS = 60_000


class _Topics:
    """What the target topics show delivered, and every read asked of them."""

    def __init__(self, shown: dict[tuple[str, str, str], set[int | None]]) -> None:
        self.shown = shown
        self.reads: list[tuple[set[str], int]] = []

    def __call__(self, _kafka: Mapping[str, Any], topics: Iterable[str], since: int) -> Deliveries:
        asked = set(topics)
        self.reads.append((asked, since))
        found = Deliveries()
        for key, occurrences in self.shown.items():
            if key[0] in asked:
                found.versions[key] = Delivered(set(occurrences))
        return found


def _one_off(schedule_id: str, due_ms: int, origin: str | None = None) -> Schedule:
    return Schedule(schedule_id, "orders", b"v", due_ms, origin=origin)


def test_nothing_is_looked_up_before_redis_changed() -> None:
    topics = _Topics({("orders", "a", "a"): {None}})
    rechecks = Rechecks({}, LAG_MS, topics)
    assert rechecks.delivered(0, [_one_off("a", 1_000)], 2_000) == set()
    assert topics.reads == []


def test_a_version_shown_delivered_before_the_change_is_not_delivered_again() -> None:
    """Issue 50: the acks a failover lost: what the topic shows is passed over, what it
    does not (and what falls due after the change) is delivered; each topic is read once
    per window, from the longest lag before the change."""
    topics = _Topics({("orders", "a", "a"): {None}, ("orders", "c", "in:0:7"): {None}})
    rechecks = Rechecks({}, LAG_MS, topics)
    rechecks.open([0], 100_000)
    claimed = [_one_off("a", 90_000), _one_off("b", 95_000), _one_off("c", 99_000, "in:0:7"),
               _one_off("a", 100_001)]  # fmt: skip
    assert rechecks.delivered(0, claimed, 100_010) == {0, 2}
    assert rechecks.delivered(0, claimed, 100_020) == {0, 2}
    assert topics.reads == [({"orders"}, 100_000 - LAG_MS)]
    assert rechecks.delivered(1, claimed, 100_020) == set()  # another shard: no change there


def test_another_version_of_a_caller_id_is_delivered() -> None:
    """A caller's id updated since: its new version was never delivered."""
    topics = _Topics({("orders", "@c/x", "in:0:1"): {None}})
    rechecks = Rechecks({}, LAG_MS, topics)
    rechecks.open([0], 100_000)
    assert rechecks.delivered(0, [_one_off("@c/x", 90_000, "in:0:2")], 100_000) == set()


def test_a_window_closes_after_the_longest_lag() -> None:
    topics = _Topics({("orders", "a", "a"): {None}})
    rechecks = Rechecks({}, LAG_MS, topics)
    rechecks.open([0], 100_000)
    assert rechecks.delivered(0, [_one_off("a", 90_000)], 100_000 + LAG_MS + 1) == set()
    assert rechecks.windows == {}


def test_one_mark_met_shard_by_shard_reads_each_topic_once() -> None:
    """An intake's recheck mark is met by each shard's first claim after it: the shards
    share one window, so a topic is read once, not once per shard."""
    topics = _Topics({("orders", "a", "a"): {None}})
    rechecks = Rechecks({}, LAG_MS, topics)
    for shard, at in enumerate((100_000, 100_050, 100_090)):
        rechecks.open([shard], at, 40_000, 700_000)
        assert rechecks.delivered(shard, [_one_off("a", 90_000)], at) == {0}
    assert topics.reads == [({"orders"}, 40_000)]
