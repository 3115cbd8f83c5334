"""Shards on a real Redis: requests land in the shard of their id, each shard keeps its own
intake watermark, every shard is claimed, and a shard count changed under pending messages
is refused."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from structlog.testing import capture_logs

from blackbox.clock import now_ms
from blackbox.dev.servers import RedisServer, free_port
from blackbox.errors import ShardsChanged
from blackbox.exits import EXIT_SETTINGS
from blackbox.firing.shares import Share
from blackbox.metrics import Metrics
from blackbox.role import Role
from blackbox.schedule import Schedule, scoped_id
from blackbox.service import Service
from blackbox.settings import Settings
from blackbox.storage import shardcount
from blackbox.storage.applying import Applied, Cancellation, IntakeSlice, Write
from blackbox.storage.keys import Layout
from blackbox.storage.memory import Room
from blackbox.storage.shardcount import Committed
from blackbox.storage.store import Acks, RedisStore
from tests.kafkatools import unique, wait_until

SHARDS = 4


@pytest.fixture
def client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_server.url)
    yield client
    client.close()


@pytest.fixture
def store(client: redis.Redis) -> RedisStore:
    return RedisStore(client, Layout(unique("ns"), SHARDS), grace_seconds=60)


def _plain(offsets: range, due_ms: int) -> list[tuple[int, Write]]:
    return [(o, Schedule(f"in:0:{o}", "orders", b"v", due_ms)) for o in offsets]


def _per_shard(store: RedisStore) -> list[int]:
    return [int(store.client.zcard(keys.due)) for keys in store.layout.shards]


def test_each_request_lands_in_the_shard_its_id_names(store: RedisStore) -> None:
    """Scale: a message's shard is a pure function of its id, so the ids of one partition
    spread over every shard and each is found where `shard_of` says."""
    due = now_ms() + 60_000
    codes = store.apply([IntakeSlice("in", 0, 199, _plain(range(200), due))], now_ms())

    assert codes == [Applied.SCHEDULED] * 200
    assert sum(_per_shard(store)) == 200 and min(_per_shard(store)) > 20
    for offset in (0, 57, 199):
        schedule_id = f"in:0:{offset}"
        keys = store.layout.keys_of(schedule_id)
        assert store.client.zscore(keys.due, schedule_id) == due
        assert store.load(schedule_id) is not None


def test_a_re_read_is_replayed_in_every_shard(store: RedisStore) -> None:
    """Guarantee 2 with shards: each shard moves its own watermark of the partition, so
    re-reading a range after a crash schedules nothing twice, and what is new is applied,
    answered in the order the records came."""
    due = now_ms() + 60_000
    store.apply([IntakeSlice("in", 0, 99, _plain(range(100), due))], now_ms())

    codes = store.apply([IntakeSlice("in", 0, 149, _plain(range(50, 150), due))], now_ms())

    assert codes == [Applied.REREAD_PENDING] * 50 + [Applied.SCHEDULED] * 50
    assert sum(_per_shard(store)) == 150
    marks = [store.client.hget(keys.intake_marks, "in:0") for keys in store.layout.shards]
    assert marks == [b"149"] * SHARDS


@pytest.mark.parametrize("grouping", [False, True], ids=["a-call-per-shard", "grouped"])
def test_a_shard_whose_call_failed_is_applied_on_the_retry_and_the_others_replayed(
    store: RedisStore, grouping: bool
) -> None:
    """Guarantee 1 with shards: one shard's script call failing leaves that shard's
    watermark where it was; the retry of the whole range applies the failed shard's
    requests and replays what ran: nothing lost, nothing twice. With a call per shard (a
    cluster) the other shards' calls ran; grouped in one call (one Redis), the call fails
    at its watermark checks, which all run before any write, and the retry applies it all.
    (An error met later, while a grouped call writes, leaves the chunks before it applied
    and their marks moved, as separate calls would: the retry replays them.)"""
    store.intake.grouping = grouping
    due = now_ms() + 60_000
    items = _plain(range(40), due)
    broken = store.layout.shards[store.layout.shard_of("in:0:0")]
    # That shard's script fails on its first call, before it changes anything.
    store.client.set(broken.intake_marks, "not a hash")

    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        store.apply([IntakeSlice("in", 0, 39, items)], now_ms())
    ran = sum(_per_shard(store))
    assert store.client.zcard(broken.due) == 0 and (ran == 0 if grouping else ran > 0)
    store.client.delete(broken.intake_marks)

    codes = store.apply([IntakeSlice("in", 0, 39, items)], now_ms())
    in_broken = [store.layout.keys_of(w.id) == broken for _, w in items]
    expected = [Applied.SCHEDULED if b or grouping else Applied.REREAD_PENDING for b in in_broken]
    assert codes == expected
    assert sum(_per_shard(store)) == 40


def _intake_calls(client: redis.Redis) -> int:
    """EVALSHA calls Redis has run so far (its command statistics)."""
    stats = client.info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


def test_a_poll_over_every_shard_is_one_call_on_one_redis(
    store: RedisStore, client: redis.Redis
) -> None:
    """Scale: on one Redis, the requests of two partitions spread over every shard are
    written in one script call, not a call per shard and partition; each shard still moves
    its own watermark of each partition, and a re-read is replayed in each."""
    due = now_ms() + 60_000
    parts = [IntakeSlice("in", p, 39, [(o, Schedule(f"in:{p}:{o}", "orders", b"v", due))
                                       for o in range(40)]) for p in (0, 1)]  # fmt: skip
    before = _intake_calls(client)

    codes = store.apply(parts, now_ms())

    assert _intake_calls(client) - before == 1
    assert codes == [Applied.SCHEDULED] * 80 and min(_per_shard(store)) > 0
    for keys in store.layout.shards:
        assert store.client.hmget(keys.intake_marks, ["in:0", "in:1"]) == [b"39", b"39"]
    assert store.apply(parts, now_ms()) == [Applied.REREAD_PENDING] * 80


def test_a_grouped_call_with_one_gap_changes_nothing(store: RedisStore) -> None:
    """Guarantee 1, grouped: a call carrying several shards' chunks checks every chunk's
    watermark before it applies any. One shard below the mark its chunk expects (Redis lost
    writes) refuses the whole call: no shard's requests or marks move, so a re-read from
    the lowest mark applies each exactly once."""
    due = now_ms() + 60_000
    first = IntakeSlice("in", 0, 39, _plain(range(40), due))
    store.apply([first], now_ms())
    lost = store.layout.shards[store.layout.shard_of("in:0:40")]
    store.client.hset(lost.intake_marks, "in:0", 20)  # as a failover that lost writes leaves it
    following = IntakeSlice("in", 0, 79, _plain(range(40, 80), due))
    session = store.intake
    chunks = [
        session.chunk_call(following, shard, items, (39, 79), now_ms())
        for shard, items in _by_shard(store, following)
    ]
    call = session.grouped(chunks)

    with pytest.raises(redis.ResponseError, match="BLACKBOX_GAP"):
        store.client.execute_command("EVALSHA", *call)  # type: ignore[no-untyped-call]
    assert sum(_per_shard(store)) == 40
    marks = [store.client.hget(keys.intake_marks, "in:0") for keys in store.layout.shards]
    assert marks.count(b"39") == SHARDS - 1 and marks.count(b"20") == 1


@pytest.mark.parametrize("grouping", [False, True], ids=["a-call-per-shard", "grouped"])
def test_a_due_set_overwritten_from_outside_refuses_intake_and_strands_nothing(
    store: RedisStore, grouping: bool
) -> None:
    """Guarantee 1: a shard's due key overwritten with another type (a careless script, a
    wrong namespace) refuses that shard's intake call before it writes anything, with an
    error that names the key. Once the key is repaired, the retry schedules every request:
    no payload was stored without its id in the due set (which the retry would have taken
    for a request applied before, its id never due)."""
    store.intake.grouping = grouping
    items = _plain(range(40), now_ms() + 60_000)
    broken = store.layout.shards[store.layout.shard_of("in:0:0")]
    key = broken.due
    store.client.set(key, "not a sorted set")

    with pytest.raises(redis.ResponseError, match=f"BLACKBOX_CORRUPT {key} holds a string"):
        store.apply([IntakeSlice("in", 0, 39, items)], now_ms())
    in_broken = [store.layout.keys_of(w.id) == broken for _, w in items]
    stored = [store.client.exists(broken.payload(w.id)) for _, w in items]
    assert not any(s for s, b in zip(stored, in_broken, strict=True) if b)
    store.client.delete(key)

    codes = store.apply([IntakeSlice("in", 0, 39, items)], now_ms())
    expected = [Applied.SCHEDULED if b or grouping else Applied.REREAD_PENDING for b in in_broken]
    assert codes == expected
    assert sum(_per_shard(store)) == 40


def test_a_redis_keeping_slots_behind_a_plain_url_is_written_a_call_per_shard(
    tmp_path: Path,
) -> None:
    """Scale: one node in cluster mode reached by `redis://` (a managed Redis with cluster
    mode on, a proxy) refuses a call whose keys span slots. The first grouped call is
    refused before it runs; intake turns grouping off, logs it, and the poll read again
    is written a call per shard, each shard once. Redis's readiness probe counts what is
    pending there shard by shard (its one EXISTS over every shard is refused too)."""
    config = {"cluster-enabled": "yes", "cluster-port": str(free_port())}  # not port + 10000
    server = RedisServer(free_port(), tmp_path, config=config)
    server.start()
    client = redis.Redis.from_url(server.url)
    try:
        client.cluster("ADDSLOTSRANGE", 0, 16383)
        wait_until(lambda: client.cluster("INFO")["cluster_state"] == "ok",
                   timeout=10, what="the one-node cluster to take its slots")  # fmt: skip
        store = RedisStore(client, Layout(unique("ns"), SHARDS), grace_seconds=60)
        part = IntakeSlice("in", 0, 39, _plain(range(40), now_ms() + 60_000))

        with capture_logs() as logs, pytest.raises(redis.exceptions.ClusterCrossSlotError):
            store.apply([part], now_ms())
        assert sum(_per_shard(store)) == 0 and not store.intake.grouping
        assert [e["event"] for e in logs] == ["intake_calls_per_shard"]

        assert store.apply([part], now_ms()) == [Applied.SCHEDULED] * 40
        assert sum(_per_shard(store)) == 40 and min(_per_shard(store)) > 0
        room = Room(client, store.layout, Metrics())
        room.probe()  # Redis's readiness probe: it counts what is pending, per shard there
        pending = room.metrics.registry.get_sample_value
        assert pending("blackbox_pending_messages", {"state": "due"}) == 40
    finally:
        client.close()
        server.stop()


def _by_shard(
    store: RedisStore, part: IntakeSlice
) -> list[tuple[int, list[tuple[int, tuple[int, Write]]]]]:
    groups: dict[int, list[tuple[int, tuple[int, Write]]]] = {s: [] for s in range(SHARDS)}
    for n, item in enumerate(part.items):
        groups[store.layout.shard_of(item[1].id)].append((n, item))
    return list(groups.items())


def test_updates_and_cancels_find_ids_in_every_shard(store: RedisStore) -> None:
    """Scale: a caller's id is updated and cancelled in its own shard, by intake and by
    the API's cancel and reschedule."""
    now = now_ms()
    ids = [scoped_id(b"svc", f"order-{n}") for n in range(12)]
    assert len({store.layout.shard_of(i) for i in ids}) == SHARDS
    first = [(n, Schedule(i, "orders", b"v1", now + 60_000, b"svc")) for n, i in enumerate(ids)]
    store.apply([IntakeSlice("in", 0, 11, first)], now)

    updates: list[tuple[int, Write]] = [
        (12 + n, Schedule(i, "orders", b"v2", now + 90_000, b"svc")) for n, i in enumerate(ids[:6])
    ]
    cancels: list[tuple[int, Write]] = [(18 + n, Cancellation(i)) for n, i in enumerate(ids[6:9])]
    codes = store.apply([IntakeSlice("in", 0, 20, updates + cancels)], now)

    assert codes == [Applied.UPDATED] * 6 + [Applied.CANCELLED] * 3
    assert store.cancel(ids[9]) == Applied.CANCELLED
    assert store.cancel(ids[6]) == Applied.CANCELLED  # as cancelled before
    code, moved = store.reschedule(ids[10], now + 120_000, now)
    assert code == Applied.UPDATED and moved is not None
    assert store.counts() == (8, 0)
    assert [store.load(i).value for i in ids[:6]] == [b"v2"] * 6  # type: ignore[union-attr]


def test_claims_take_from_the_shard_they_name_and_ack_there(store: RedisStore) -> None:
    """Scale: a claim moves due ids of its shard only, and its ack forgets them there."""
    due = now_ms() - 1
    store.apply([IntakeSlice("in", 0, 99, _plain(range(100), due))], due)

    taken = []
    for shard in range(SHARDS):
        claim = store.claim_due(now_ms(), 1000, 30_000, shard)
        assert claim.shard == shard
        assert {store.layout.shard_of(i) for i in claim.ids} <= {shard}
        assert store.ack(claim.ids, claim.token, shard) == len(claim.ids)
        taken += claim.ids

    assert sorted(taken) == sorted(f"in:0:{o}" for o in range(100))
    assert store.counts() == (0, 0)


def _settle(
    client: redis.Redis, shards: Layout, name: str = "p", committed: Committed | None = None
) -> None:
    """A process starts with `shards` and stops cleanly (its heartbeat dropped)."""
    guard = shardcount.Guard(client, shards, name)
    guard.settle(now_ms(), committed)
    guard.leave()


def test_a_changed_shard_count_is_refused_while_messages_are_pending(
    client: redis.Redis,
) -> None:
    """Scale: changing BLACKBOX_SHARDS under pending messages would look for them in the
    wrong shards; it is refused at start, naming the count they were written with."""
    namespace = unique("ns")
    old = RedisStore(client, Layout(namespace, 2), grace_seconds=60)
    _settle(client, old.layout)
    old.apply([IntakeSlice("in", 0, 9, _plain(range(10), now_ms() + 60_000))], now_ms())

    with pytest.raises(ShardsChanged, match="BLACKBOX_SHARDS=2"):
        _settle(client, Layout(namespace, 3))
    with pytest.raises(ShardsChanged, match="10 messages are pending"):
        _settle(client, Layout(namespace, 1))
    _settle(client, Layout(namespace, 2))  # the same count starts


def test_an_empty_namespace_changes_count_and_keeps_its_watermarks(client: redis.Redis) -> None:
    """Scale: once nothing is pending the count may change; the intake watermarks carry
    over (the lowest of the old shards'), so re-read records are not scheduled again."""
    namespace, due = unique("ns"), now_ms() - 1
    old = RedisStore(client, Layout(namespace), grace_seconds=60)
    _settle(client, old.layout)
    old.apply([IntakeSlice("in", 0, 9, _plain(range(10), due))], due)
    claim = old.claim_due(now_ms(), 100, 30_000)
    old.ack(claim.ids, claim.token)

    new = RedisStore(client, Layout(namespace, SHARDS), grace_seconds=60)
    with capture_logs() as logs:
        _settle(client, new.layout)
    codes = new.apply([IntakeSlice("in", 0, 14, _plain(range(5, 15), due))], due)

    assert codes == [Applied.REPLAYED] * 5 + [Applied.SCHEDULED] * 5
    assert client.get(new.layout.shard_count) == str(SHARDS).encode()
    assert [e for e in logs if e["event"] == "shards_changed"] == [
        {"event": "shards_changed", "before": 1, "after": SHARDS, "marks": 1, "log_level": "info"}
    ]


def test_replicas_split_the_shards_by_heartbeat_and_take_over_a_leaver(
    client: redis.Redis,
) -> None:
    """Scale: replicas beating in one Redis split the shards between them; when one leaves
    (or its heartbeat runs out) the others take its shards at their next beat."""
    shards = Layout(unique("ns"), 6)
    first, second, third = (Share(shards, name) for name in ("a", "b", "c"))
    now = now_ms()
    for share in (first, second, third, first, second):
        share.beat(client, now, ttl_ms=5_000)

    assert sorted(first.owned + second.owned + third.owned) == list(range(6))
    assert [len(s.owned) for s in (first, second, third)] == [2, 2, 2]

    third.leave(client)
    second.beat(client, now + 6_000, ttl_ms=5_000)  # the first's heartbeat ran out too
    assert second.owned == list(range(6)) and second.members == 1


def test_a_replica_dropped_from_the_heartbeats_keeps_its_share(client: redis.Redis) -> None:
    """Scale: a replica whose heartbeat another one dropped (clocks apart by more than its
    lifetime) keeps the shards it had instead of crashing, and takes its share again at
    its next beat."""
    shards = Layout(unique("ns"), 4)
    Share(shards, "other").beat(client, now_ms(), ttl_ms=60_000)
    share = Share(shards, "late")

    share.beat(client, now_ms(), ttl_ms=-1)  # its own entry is gone by the time it reads

    assert share.owned == [0, 1, 2, 3] and share.members == 1
    share.beat(client, now_ms(), ttl_ms=5_000)
    assert len(share.owned) == 2 and share.members == 2


def test_a_partition_one_old_shard_never_marked_keeps_its_watermark(
    client: redis.Redis,
) -> None:
    """Guarantee 2 (re-reads applied once) across a shard-count change: a partition of
    which one old shard holds no mark (it got none of its records, as most shards of a
    quiet partition) keeps the lowest mark the others hold, capped at the last offset the
    intake group committed (a shard whose calls were refused while another's ran has them
    above the commit): its records are not stored again on a re-read."""
    namespace = unique("ns")
    old = Layout(namespace, 2)
    _settle(client, old)
    client.hset(old.shards[0].intake_marks, mapping={"in:0": 39, "in:1": 7, "in:2:tag": 12})
    client.hset(old.shards[1].intake_marks, "in:1", 5)
    commits = {("in", 0): 40, ("in", 2): 10}  # in:2's records 10..12 were never committed

    _settle(
        client, Layout(namespace, 3), committed=lambda asked: {p: commits.get(p) for p in asked}
    )

    for keys in Layout(namespace, 3).shards:
        assert client.hgetall(keys.intake_marks) == {b"in:0": b"39", b"in:1": b"5",
                                                     b"in:2:tag": b"9"}  # fmt: skip


def test_a_count_change_is_refused_while_other_processes_fire(client: redis.Redis) -> None:
    """Scale: a process started with a new shard count while others still fire with the
    old one (a rolling update) would let them go on writing where no one looks: refused
    even with nothing pending, until their heartbeats are gone."""
    namespace = unique("ns")
    old = Layout(namespace, 2)
    _settle(client, old)
    Share(old, "running").beat(client, now_ms(), ttl_ms=60_000)

    with pytest.raises(ShardsChanged, match="1 process"):
        _settle(client, Layout(namespace, 4))
    client.zadd(old.members, {"running": now_ms() - 1})  # its heartbeat ran out
    _settle(client, Layout(namespace, 4))


def test_an_intake_process_on_the_old_count_blocks_a_change(env: dict[str, str]) -> None:
    """Guarantee 1 across a shard-count change: a `--role intake` process still running
    with the old count (it would go on writing into shards no dispatcher reads, and commit
    the offsets) keeps a heartbeat too, so a process with another count is refused; once
    it stopped cleanly, the change goes through."""
    intake = Service(Settings.from_env({**env, "BLACKBOX_SHARDS": "2"}), role=Role.INTAKE)
    other = Service(Settings.from_env({**env, "BLACKBOX_SHARDS": "4"}), role=Role.DISPATCH)
    intake.start()
    try:
        wait_until(intake._redis_checked.is_set, what="Redis checked")
        with pytest.raises(ShardsChanged, match="1 process"):
            other._read_policy()
    finally:
        intake.stop()
    other.start()
    try:
        assert shardcount.recorded_count(other.redis, other.store.layout) == 4
    finally:
        other.stop()


def test_an_unset_count_adopts_the_namespaces(client: redis.Redis) -> None:
    """Scale, upgrading: with BLACKBOX_SHARDS unset a process takes the count recorded for
    the namespace, or one shard where data was written before counts were recorded (a
    release whose default was one shard), logged as shards_adopted; a new namespace gets
    the default of 16."""
    recorded, written, new = unique("ns"), unique("ns"), unique("ns")
    _settle(client, Layout(recorded, 4))
    before = RedisStore(client, Layout(written), grace_seconds=60)
    before.apply([IntakeSlice("in", 0, 0, _plain(range(1), now_ms() + 60_000))], now_ms())

    with capture_logs() as logs:
        counts = [shardcount.adopt(client, ns) for ns in (recorded, written, new)]

    assert counts == [4, 1, shardcount.DEFAULT_SHARDS] == [4, 1, 16]
    assert [(e["event"], e["shards"]) for e in logs] == [
        ("shards_adopted", 4),
        ("shards_adopted", 1),
    ]


def test_a_running_service_stops_when_another_changes_the_shard_count(
    env: dict[str, str],
) -> None:
    """Scale: a process whose namespace another process moved to another shard count
    stops with the settings exit code instead of writing where no one looks."""
    service = Service(Settings.from_env({**env, "BLACKBOX_SHARDS": "2"}))
    service.start()
    try:
        wait_until(service._redis_checked.is_set, what="Redis checked")
        service.redis.set(service.store.layout.shard_count, 3)

        wait_until(service.stopping.is_set, timeout=10, what="the service stopping")
        assert service.exit_code == EXIT_SETTINGS
    finally:
        service.stop()


def test_shards_are_claimed_and_acked_together_though_redis_lost_its_scripts(
    store: RedisStore, client: redis.Redis
) -> None:
    """Many shards cost what one does: every shard is claimed, and every batch acked, in
    one pipeline; a node that lost the scripts (a restart, a failover) answers the pipeline
    with NOSCRIPT, and each call is run again on its own, nothing lost or left in flight."""
    store.apply([IntakeSlice("in", 0, 39, _plain(range(40), now_ms() - 1))], now_ms())
    client.script_flush()

    claims = store.claim_all(now_ms(), 100, 30_000, range(SHARDS))

    assert [claim.shard for claim in claims] == list(range(SHARDS))
    assert sorted(i for claim in claims for i in claim.ids) == sorted(
        f"in:0:{o}" for o in range(40)
    )
    client.script_flush()
    acked = store.ack_all([Acks(claim.ids, claim.token, claim.shard) for claim in claims])
    assert acked == [len(claim.ids) for claim in claims]
    assert store.counts() == (0, 0)


def test_acks_of_many_shards_leave_a_batch_whose_lease_another_claim_took(
    store: RedisStore,
) -> None:
    """Guarantee 3 with shards: each batch acked together is judged by its own lease token,
    so a batch whose lease ran out and was claimed again is left to that claimer, while the
    other shards' batches are forgotten."""
    store.apply([IntakeSlice("in", 0, 39, _plain(range(40), now_ms() - 1))], now_ms())
    claims = store.claim_all(now_ms() - 60_000, 100, 1, range(SHARDS), due_by_ms=now_ms())
    lost = claims[0]
    assert lost.ids
    (again,) = store.reclaim_each(now_ms(), 100, [lost.shard])
    assert again.returned == len(lost.ids)
    retaken = store.claim_due(now_ms(), 100, 30_000, lost.shard)

    acked = store.ack_all([Acks(c.ids, c.token, c.shard) for c in claims])

    assert acked == [0] + [len(c.ids) for c in claims[1:]]
    assert store.counts() == (0, len(retaken.ids))
    assert store.ack(retaken.ids, retaken.token, retaken.shard) == len(lost.ids)


def test_a_shard_whose_ack_fails_leaves_the_other_shards_acked(
    store: RedisStore, client: redis.Redis
) -> None:
    """Guarantee 3 with shards: a key of one shard that breaks its ack (a wrong type, here)
    fails the acks with Redis's error, but the other shards' batches acked with it are
    acknowledged all the same: a corrupt shard does not make the others deliver again."""
    store.apply([IntakeSlice("in", 0, 39, _plain(range(40), now_ms() - 1))], now_ms())
    claims = store.claim_all(now_ms(), 100, 30_000, range(SHARDS))
    broken = store.layout.shards[1]
    client.set(broken.attempts, "not a hash")

    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        store.ack_all([Acks(claim.ids, claim.token, claim.shard) for claim in claims])

    flying = [int(client.zcard(keys.in_flight)) for keys in store.layout.shards]
    assert flying == [0, len(claims[1].ids), 0, 0] and claims[1].ids


def test_batches_with_nothing_to_ack_are_answered_in_place(store: RedisStore) -> None:
    """A settle groups batches whose ids are all series occurrences (settled by `advance`,
    nothing to ack) with ordinary ones: each batch gets its own count, in order, whether
    the ids to ack make one call or none."""
    store.apply([IntakeSlice("in", 0, 0, _plain(range(1), now_ms() - 1))], now_ms())
    (claim,) = [c for c in store.claim_all(now_ms(), 100, 30_000, range(SHARDS)) if c.ids]

    nothing = Acks([], claim.token, (claim.shard + 1) % SHARDS)
    assert store.ack_all([nothing, Acks(claim.ids, claim.token, claim.shard), nothing]) == [0, 1, 0]
    assert store.ack_all([nothing, nothing]) == [0, 0]
    assert store.counts() == (0, 0)


def test_a_process_whose_firing_beat_before_it_settled_starts(client: redis.Redis) -> None:
    """Scale: a process's firing may beat before its start settled the shard count (the
    store's check took its time at start): on a fresh namespace, its own heartbeat is not
    another process running another count. Another's is."""
    layout = Layout(unique("ns"), 16)
    Share(layout, "self").beat(client, now_ms(), ttl_ms=60_000)

    _settle(client, layout, name="self")

    other = Layout(unique("ns"), 16)
    Share(other, "other").beat(client, now_ms(), ttl_ms=60_000)
    with pytest.raises(ShardsChanged, match="1 process"):
        _settle(client, other, name="self")


def test_processes_started_together_on_a_fresh_namespace_all_start(
    client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scale: processes of one count started at once on a new namespace all start. One
    looked, found no count recorded, and meanwhile another recorded the same count and beat:
    the first took that one for a process running another count and refused to start."""
    layout = Layout(unique("ns"), 6)
    first, second = (shardcount.Guard(client, layout, n) for n in ("first", "second"))
    looked = first._call  # the moment between its first look and the rest
    calls: list[str] = []

    def look_then_race(
        now: int, mode: str, before: int | None = None
    ) -> tuple[str, int | None, int]:
        calls.append(mode)
        answer = looked(now, mode, before)
        if len(calls) == 1:
            second.settle(now_ms())  # the other process starts right then
        return answer

    monkeypatch.setattr(first, "_call", look_then_race)
    first.settle(now_ms())

    assert shardcount.recorded_count(client, layout) == 6
    first.leave()
    second.leave()
