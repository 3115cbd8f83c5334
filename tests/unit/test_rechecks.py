"""What firing looks up after Redis changed under it (firing/rechecks.py), and when it finds
Redis changed (firing/servers.py): pure logic, no process. The failover itself, on real
processes, is tests/integration/test_failover.py."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from blackbox.firing.rechecks import Rechecks
from blackbox.firing.servers import Servers
from blackbox.kafka.deliveries import Delivered, Deliveries
from blackbox.schedule import Schedule
from blackbox.storage.keys import Layout
from blackbox.storage.store import Claim

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


class _Store:
    """What Servers asks of a store: its shards, and the run id of the Redis serving them."""

    def __init__(self, server: str) -> None:
        self.layout = Layout("bb", 4)
        self.server = server

    def run_id(self, _shard: int) -> str:
        return self.server


def _claims(shards: Iterable[int], connection: bytes) -> list[Claim]:
    return [Claim([], 0.0, None, shard=shard, connection=connection) for shard in shards]


def _servers(topics: _Topics) -> tuple[_Store, Servers, Rechecks]:
    store, rechecks = _Store("primary"), Rechecks({}, LAG_MS, topics)
    servers = Servers(store, rechecks)  # type: ignore[arg-type]  # a stand-in for RedisStore
    servers.note(_claims(range(4), b"id=1 addr=127.0.0.1:5000"), 10_000)
    return store, servers, rechecks


def test_a_failover_met_shard_by_shard_reads_each_topic_once() -> None:
    """Issue 50: the first claim on the promoted replica opens the recheck on every shard
    last seen on the primary; the first claims of the others there, later, are the same
    change, not another (each read the target topics again, about a second of firing)."""
    topics = _Topics({("orders", "a", "a"): {None}})
    store, servers, rechecks = _servers(topics)
    store.server = "promoted"
    servers.note(_claims([0], b"id=7 addr=127.0.0.1:6000"), 100_000)
    for shard, at in ((1, 100_500), (2, 101_000), (3, 130_000)):
        servers.note(_claims([shard], b"id=7 addr=127.0.0.1:6000"), at)
        assert rechecks.delivered(shard, [_one_off("a", 90_000)], at) == {0}
    assert topics.reads == [({"orders"}, 100_000 - LAG_MS)]


def test_a_second_failover_opens_the_recheck_again() -> None:
    """The shards taken as moved to the promoted replica are judged against it: a claim on
    yet another server, later, is a change and reads the topics again."""
    topics = _Topics({("orders", "a", "a"): {None}})
    store, servers, rechecks = _servers(topics)
    store.server = "promoted"
    servers.note(_claims([0], b"id=7 addr=127.0.0.1:6000"), 100_000)
    store.server = "promoted again"
    servers.note(_claims([2], b"id=3 addr=127.0.0.1:7000"), 200_000)
    assert rechecks.delivered(2, [_one_off("a", 190_000)], 200_000) == {0}
    assert topics.reads == [({"orders"}, 200_000 - LAG_MS)]
