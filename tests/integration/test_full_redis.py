"""The Lua scripts on a real Redis over `maxmemory` (noeviction): intake is refused whole,
while every script that moves or frees what is pending still runs, so firing drains it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from blackbox.clock import now_ms
from blackbox.dev.servers import RedisServer, free_port
from blackbox.errors import RedisFull
from blackbox.metrics import Metrics
from blackbox.schedule import Schedule, intake_id
from blackbox.storage.applying import Applied, IntakeSlice, Write
from blackbox.storage.keys import Layout
from blackbox.storage.memory import Room
from blackbox.storage.store import RedisStore
from tests.kafkatools import unique, wait_until

FULL_AT = {"maxmemory": "2mb", "maxmemory-policy": "noeviction"}
PART = 200
OVER_BYTES = 64 * 1024


@pytest.fixture(scope="module")
def small_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(free_port(), tmp_path_factory.mktemp("redis-small"), config=FULL_AT)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def store(small_redis: RedisServer) -> Iterator[RedisStore]:
    client = redis.Redis.from_url(small_redis.url)
    client.flushall()
    client.config_set("maxmemory", FULL_AT["maxmemory"])
    yield RedisStore(client, Layout(unique("ns")), grace_seconds=60)
    client.flushall()
    client.close()


class Filler:
    """Schedules due ones on one intake partition, part after part."""

    def __init__(self, store: RedisStore) -> None:
        self.store, self.offset = store, -1

    def part(self, count: int = PART) -> None:
        now = now_ms()
        items = []
        for _ in range(count):
            self.offset += 1
            schedule = Schedule(intake_id("in", 0, self.offset), "t", b"x" * 100, now - 1)
            items.append((self.offset, schedule))
        self.store.apply([IntakeSlice("in", 0, self.offset, items)], now)

    def until_full(self) -> int:
        """Fill until Redis refuses a part for memory, then set `maxmemory` below what is
        used (a part's own request counts while it runs: without this, a small call right
        after may pass); return how many are pending."""
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            for _ in range(1000):
                self.part()
        used = int(self.store.client.info("memory")["used_memory"])
        self.store.client.config_set("maxmemory", used - OVER_BYTES)
        return _pending(self.store)


def _pending(store: RedisStore) -> int:
    return sum(store.counts())


def _marks(store: RedisStore) -> dict[bytes | str, bytes | str]:
    return store.client.hgetall(store.layout.shards[0].intake_marks)


def test_intake_is_refused_whole_on_a_full_redis(store: RedisStore) -> None:
    """Guarantee 1 on a full Redis: the refused part changes nothing (no payload, no due
    entry, no watermark move), so intake re-reads it later and loses none."""
    filler = Filler(store)
    pending = filler.until_full()
    marks = _marks(store)

    with pytest.raises(redis.exceptions.OutOfMemoryError):
        filler.part()

    assert _pending(store) == pending
    assert _marks(store) == marks
    assert store.client.dbsize() == pending + 2  # the payloads, the due set, the watermarks


def test_claim_release_retry_reclaim_and_ack_run_on_a_full_redis(store: RedisStore) -> None:
    """The scripts that move what is pending or free it are not refused for memory: a full
    Redis can still fire, give back, retry and take back leases (issue: firing stalled)."""
    pending = Filler(store).until_full()
    lease_ms = 30_000

    claim = store.claim_due(now_ms(), 40, lease_ms)
    assert len(claim.ids) == 40
    assert store.release([(i, now_ms() - 1) for i in claim.ids[:10]], claim.token) == 10
    assert store.retry(claim.ids[10:20], claim.token, now_ms() - 1) == 10
    assert store.ack(claim.ids[20:], claim.token) == 20

    expired = store.claim_due(now_ms(), 10, lease_ms=-1)
    assert store.reclaim(now_ms(), 100) == len(expired.ids) == 10
    assert store.counts() == (pending - 20, 0)


def test_acks_free_a_full_redis_and_intake_resumes(store: RedisStore) -> None:
    """Firing drains a full Redis: as delivered payloads are acked, memory frees and the
    intake script is accepted again, with nothing lost in between."""
    filler = Filler(store)
    pending = filler.until_full()

    acked, resumed = 0, False
    while not resumed and acked < pending:
        claim = store.claim_due(now_ms(), 100, 30_000)
        acked += store.ack(claim.ids, claim.token)
        try:
            filler.part(count=1)
        except redis.exceptions.OutOfMemoryError:
            continue
        resumed = True

    assert resumed
    assert 0 < acked < pending
    assert _pending(store) == pending - acked + 1


def test_the_readiness_probe_says_full_exactly_while_intake_would_be_refused(
    store: RedisStore,
) -> None:
    """/ready's Redis probe: a script that writes nothing yet may write is refused, before it
    runs, exactly when the intake script is; the probe then raises RedisFull, and exports
    Redis's memory and what is pending either way."""
    metrics = Metrics()
    room = Room(store.client, store.layout, metrics)
    room.probe()
    pending = Filler(store).until_full()

    with pytest.raises(RedisFull):
        room.probe()

    assert metrics.value("blackbox_pending_messages", {"state": "due"}) == pending
    used = metrics.value("blackbox_redis_used_memory_bytes")
    assert used > metrics.value("blackbox_redis_maxmemory_bytes") > 0
    assert metrics.value("blackbox_redis_full") == 1
    store.client.config_set("maxmemory", "0")
    room.probe()
    assert metrics.value("blackbox_redis_full") == 0


def test_a_poll_refused_part_way_tells_which_requests_ran(store: RedisStore) -> None:
    """Guarantee 1 for answers: when Redis fills up between two parts of one poll, the
    requests of the part that ran keep their codes (intake answers them: a re-read skips
    them as applied) and those of the refused part are None."""
    now = now_ms()
    items: list[tuple[int, Write]] = [
        (n, Schedule(intake_id("other", 0, n), "t", b"x" * 100, now + 60_000))
        for n in range(2 * PART)
    ]

    with store.applying(now) as applying:
        applying.send([IntakeSlice("other", 0, PART - 1, items[:PART])])
        wait_until(lambda: store.client.zcard(store.layout.shards[0].due) == PART, timeout=10)
        used = int(store.client.info("memory")["used_memory"])
        store.client.config_set("maxmemory", used - OVER_BYTES)  # full before the next part
        applying.send([IntakeSlice("other", 0, 2 * PART - 1, items[PART:])])
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            applying.codes()
        partial = applying.partial

    assert partial == [Applied.SCHEDULED] * PART + [None] * PART
    assert (
        store.client.hget(store.layout.shards[0].intake_marks, "other:0") == str(PART - 1).encode()
    )
