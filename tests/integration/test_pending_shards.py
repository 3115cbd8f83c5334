"""The pending views over a store of 4 shards, on one Redis and on a 3-master Redis Cluster:
listings merge the shards in due order (ties included) page after page, filters, stats
and gauges count every shard, detail and cancel find each id in its own shard."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis

from blackbox.api.cursors import Position
from blackbox.api.pending import SCAN_BUDGET, TOPIC_SAMPLE, Filter, Pending
from blackbox.api.views import Item, State
from blackbox.clock import now_ms
from blackbox.dev.cluster import RedisCluster
from blackbox.dev.servers import RedisServer
from blackbox.schedule import Schedule, intake_id
from blackbox.storage import connections
from blackbox.storage.applying import IntakeSlice
from blackbox.storage.keys import Layout
from blackbox.storage.store import RedisStore
from tests.integration.conftest import ServiceFactory
from tests.kafkatools import unique

SHARDS = 4
# More ids than any test stores: a walk listing more repeats some.
MOST_LISTED = 5_000
TOKEN = "test-token-0123456789abcdef"  # noqa: S105 - a test token
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(params=["redis_server", "redis_cluster"])
def redis_url(request: pytest.FixtureRequest) -> str:
    """One Redis, or the three-master Redis Cluster."""
    server: RedisServer | RedisCluster = request.getfixturevalue(request.param)
    return server.url


@pytest.fixture
def store(redis_url: str) -> Iterator[RedisStore]:
    """A store of SHARDS shards in a namespace of its own, on one Redis or on the cluster."""
    client = connections.redis_client(redis_url)
    yield RedisStore(client, Layout(unique("ns"), SHARDS), 60)
    client.close()


def fill(store: RedisStore, schedules: list[Schedule]) -> None:
    """Store schedules with the store's own intake code (offsets 0..n-1 of a watermark of
    their own)."""
    part = IntakeSlice(unique("fill"), 0, len(schedules) - 1, list(enumerate(schedules)))
    store.apply([part], now_ms())


def walk(pending: Pending, kept: Filter, limit: int, cursor: str | None = None) -> list[Item]:
    """Every item from `cursor` on, following cursors page by page."""
    items: list[Item] = []
    for _ in range(MOST_LISTED):
        page = pending.page(kept, cursor, limit)
        assert page.scanned <= SCAN_BUDGET
        items += page.items
        assert len(items) <= MOST_LISTED, "ids listed again and again"
        cursor = page.cursor
        if cursor is None:
            return items
    raise AssertionError("the cursor never ended")


def burst(base: int, count: int, caller: str = "c") -> list[Schedule]:
    """`count` schedules: a third due at one ms, the rest at a few distinct ms around it."""
    return [
        Schedule(f"@{caller}/{'é' if i % 7 == 0 else 'e'}{i}", f"topic-{i % 3}", b"v%d" % i,
                 base if i % 3 == 0 else base + (i % 5) - 2, caller=caller.encode())
        for i in range(count)
    ]  # fmt: skip


def order(schedules: list[Schedule]) -> list[str]:
    return [s.id for s in sorted(schedules, key=lambda s: (s.due_ms, s.id))]


def ids(items: list[Item]) -> list[str]:
    return [i.blackbox_id for i in items]


def test_pages_walk_every_shard_once_in_due_order(store: RedisStore) -> None:
    """Pages followed by their cursors return every id of every shard exactly once, in due
    order then id order, even when many ids of several shards share one due ms; a cursor
    whose id is no longer pending goes on right after its place."""
    pending = Pending(store)
    schedules = burst(now_ms() + 3_600_000, 300)
    fill(store, schedules)
    assert len({store.layout.shard_of(s.id) for s in schedules}) == SHARDS
    if isinstance(store.client, redis.RedisCluster):  # the shards live on several masters
        assert len({id(store.pool_of(shard)) for shard in range(SHARDS)}) > 1
    expected = order(schedules)
    for limit in (1, 7, 100, 500):
        assert ids(walk(pending, Filter(), limit)) == expected
    due = {s.id: s.due_ms for s in schedules}
    gone = Position(due["@c/e3"], "@c/e3~")  # never stored: amid the ids due at that ms
    after = [i for i in expected if (due[i], i) > (gone.score, gone.id)]
    assert 0 < len(after) < len(expected)
    assert ids(walk(pending, Filter(), 9, pending.cursors.seal(gone))) == after


def test_a_burst_bigger_than_the_budget_at_one_ms_pages_through(store: RedisStore) -> None:
    """Thousands of ids due at the same ms over all shards: every page goes on past the
    last, none is skipped or repeated, and no call takes more than SCAN_BUDGET ids."""
    pending = Pending(store)
    due = now_ms() + 3_600_000
    schedules = [Schedule(f"@b/{i:05d}", "t", b"x", due, caller=b"b") for i in range(3_000)]
    fill(store, schedules)
    assert ids(walk(pending, Filter(), 250)) == order(schedules)
    assert ids(walk(pending, Filter(caller="b"), 1_000)) == order(schedules)


def test_filters_and_a_partial_page_over_shards(store: RedisStore) -> None:
    """Caller, topic and due-window filters keep what they name in every shard; a rare match
    further on than SCAN_BUDGET ids answers a partial page whose cursor reaches it."""
    pending = Pending(store)
    base = now_ms() + 3_600_000
    schedules = burst(base, 120) + burst(base, 60, caller="d")
    fill(store, schedules)
    assert ids(walk(pending, Filter(caller="d"), 7)) == order(schedules[120:])
    topic = [s for s in schedules if s.topic == "topic-1"]
    assert ids(walk(pending, Filter(topic="topic-1"), 4)) == order(topic)
    window = [s for s in schedules if base - 1 <= s.due_ms <= base]
    assert ids(walk(pending, Filter(due_from_ms=base - 1, due_to_ms=base), 6)) == order(window)
    common = [Schedule(f"@c/x{i}", "t", b"x", base + 10 + i, caller=b"c")
              for i in range(SCAN_BUDGET + 50)]  # fmt: skip
    fill(store, [*common, Schedule("@c/rare", "rare", b"x", base + 10**6, caller=b"c")])
    first = pending.page(Filter(topic="rare"), None, 10)
    assert (first.items, first.scanned) == ([], SCAN_BUDGET) and first.cursor is not None
    second = pending.page(Filter(topic="rare"), first.cursor, 10)
    assert ids(second.items) == ["@c/rare"]


def claim_all(store: RedisStore) -> list[tuple[float, str]]:
    """Claim every due id of every shard, one shard after another; (lease token, id) each."""
    claimed: list[tuple[float, str]] = []
    for shard in range(SHARDS):
        claim = store.claim_due(now_ms(), 1_000, 60_000 + shard, shard)
        claimed += [(claim.token, i) for i in claim.ids]
    return claimed


def test_in_flight_lists_by_lease_expiry_over_shards(store: RedisStore) -> None:
    """Ids being fired are listed from every shard by lease expiry, then id, each with the
    attempts its own shard counts."""
    pending = Pending(store)
    fill(store, burst(now_ms() - 5_000, 40, caller="f"))
    leases = {i: token for token, i in claim_all(store)}
    for schedule_id, token in leases.items():  # a failed attempt in shards 1 and 3
        shard = store.layout.shard_of(schedule_id)
        if shard % 2:
            store.retry([schedule_id], token, now_ms() - 1, shard)
    leases.update({i: token for token, i in claim_all(store)})
    claimed = [(token, i) for i, token in leases.items()]
    assert len(claimed) == 40
    listed = walk(pending, Filter(state=State.IN_FLIGHT), 3)
    assert ids(listed) == [i for _, i in sorted(claimed)]
    assert {i.state for i in listed} == {State.IN_FLIGHT}
    assert [i.attempt for i in listed] == [store.layout.shard_of(i) % 2 for _, i in sorted(claimed)]
    assert walk(pending, Filter(), 10) == []


def test_stats_and_gauges_count_every_shard(store: RedisStore) -> None:
    """Counts, due buckets, overdue and the earliest due time are over all shards; the
    topic sample is the earliest due over all shards."""
    pending = Pending(store)
    now = now_ms()
    fill(store, burst(now - 60_000, 30, caller="o"))
    claimed = claim_all(store)
    ahead = burst(now + 90_000, 50)
    overdue = burst(now - 1_000, 20, caller="late")
    # Each shard holds more than a sample: only a merge of the shards finds the earliest.
    later = [Schedule(f"@z/{i}", "later", b"x", now + 7_200_000 + i) for i in range(1_000)]
    fill(store, ahead + overdue + later)
    stats = pending.stats()
    assert (stats.pending, stats.in_flight, stats.overdue) == (1_070, len(claimed), 20)
    assert len(claimed) == 30
    assert stats.earliest_due_ms == min(s.due_ms for s in overdue)
    assert sum(b.count for b in stats.per_minute) == 50
    assert sum(b.count for b in stats.per_hour) == 1_050
    earliest = Counter(s.topic for s in ahead + overdue)
    assert stats.per_topic == {**earliest, "later": TOPIC_SAMPLE - 70}
    assert stats.topic_sample == TOPIC_SAMPLE
    assert pending.gauges() == (20, stats.earliest_due_ms)


def test_detail_and_cancel_in_each_shard(store: RedisStore) -> None:
    """Each id's detail is read from its own shard; a cancelled id, whatever its shard, is
    gone from detail and listing while the others stay."""
    pending = Pending(store)
    schedules = burst(now_ms() + 600_000, 16, caller="k")
    fill(store, schedules)
    assert len({store.layout.shard_of(s.id) for s in schedules}) == SHARDS
    for schedule in schedules:
        found = pending.get(schedule.id)
        assert found is not None and (found.item.blackbox_id, found.value) == (
            schedule.id, schedule.value.decode())  # fmt: skip
    cancelled = {s.id for s in schedules[::3]}
    assert len({store.layout.shard_of(i) for i in cancelled}) > 1
    for schedule_id in cancelled:
        store.cancel(schedule_id)
        assert pending.get(schedule_id) is None
    kept = [s for s in schedules if s.id not in cancelled]
    assert ids(walk(pending, Filter(), 5)) == order(kept)


def test_the_api_of_a_sharded_service(start_service: ServiceFactory, redis_url: str) -> None:
    """A service with BLACKBOX_SHARDS=4 lists, details, counts and cancels through its
    HTTP API ids that are spread over all its shards."""
    service = start_service(
        REDIS_URL=redis_url, BLACKBOX_API_TOKEN=TOKEN, BLACKBOX_SHARDS=str(SHARDS)
    )
    assert service.endpoints is not None
    schedules = burst(now_ms() + 3_600_000, 60, caller="api")
    fill(service.store, schedules)
    url = f"http://127.0.0.1:{service.endpoints.port}"
    with httpx.Client(base_url=url, timeout=15, headers=AUTH) as client:
        items: list[dict[str, Any]] = []
        cursor = None
        while True:
            query = {"limit": 8, **({"cursor": cursor} if cursor else {})}
            page = client.get("/api/v1/schedules", params=query).json()
            items, cursor = items + page["items"], page["cursor"]
            if cursor is None:
                break
        assert [i["blackbox_id"] for i in items] == order(schedules)
        assert client.get("/api/v1/stats").json()["pending"] == 60
        for schedule in schedules[:8]:
            assert client.get(f"/api/v1/schedules/{schedule.id}").status_code == 200
            assert client.delete(f"/api/v1/schedules/{schedule.id}").json()["outcome"] == (
                "cancelled")  # fmt: skip
            assert client.get(f"/api/v1/schedules/{schedule.id}").status_code == 404
        assert client.get("/api/v1/stats").json()["pending"] == 52


def test_whose_a_derived_id_is_never_reads_its_whole_payload(
    store: RedisStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Guarantee 7: whose an id derived from an intake record is comes from a bounded read
    of its payload's head even where its key and headers run past that head: loading the
    whole payload would make another caller's id take longer to answer than a free one."""
    schedule = Schedule(
        intake_id(unique("t"), 0, 7), "t", b"v" * 200_000, now_ms() + 3_600_000,
        caller=b"billing", key=b"k" * 3000, headers=(("h", b"x" * 3000),),
    )  # fmt: skip
    fill(store, [schedule])
    pending = Pending(store)

    def whole(schedule_id: str) -> Schedule | None:
        raise AssertionError(f"owner() loaded the whole payload of {schedule_id}")

    monkeypatch.setattr(store, "load", whole)
    assert pending.owner(schedule.id) == (True, b"billing")
    assert pending.owner(intake_id("t", 0, 8)) == (False, None)
