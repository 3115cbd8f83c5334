"""The store topic (kafka/storetopic.py) on the real stack: after schedules, updates,
cancels, moves, pauses, series and deliveries, the store's latest record of each id is
exactly what Redis holds pending, byte for byte, and a tombstone for each id that ended."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import redis
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from blackbox.envelope import CALLER_HEADER
from blackbox.intake import rebuild
from blackbox.kafka.storetopic import ENDED_HEADER, FILLED_KEY, FIRED
from blackbox.reference import Reference, is_reference, resolved
from blackbox.service import Service
from blackbox.settings import Settings
from tests.integration.conftest import (
    ReaderFactory,
    ServiceFactory,
    wipe_namespace,
    with_store_topic,
)
from tests.kafkatools import TopicReader, end_offset, produce, unique, wait_until
from tests.process import BlackboxProcess

CALLER = "shop"
TOKEN = "test-token-0123456789abcdef"  # noqa: S105 - a test token
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def _send(env: dict[str, str], *documents: dict[str, Any]) -> None:
    produce(
        env["KAFKA_BOOTSTRAP_SERVERS"], env["BLACKBOX_INTAKE_TOPIC"],
        [orjson.dumps(d) for d in documents], [(CALLER_HEADER, CALLER.encode())],
    )  # fmt: skip


def store_latest(bootstrap: str, topic: str) -> dict[str, bytes | None]:
    """The store topic read to its end: each id's latest value (None: a tombstone)."""
    return store_read(bootstrap, topic)[0]


def store_read(
    bootstrap: str, topic: str
) -> tuple[dict[str, bytes | None], dict[str, tuple[int, int]]]:
    """The store topic read to its end: each id's latest value (None: a tombstone), and
    where that latest record lies (partition, offset)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("read"),
                         "enable.auto.commit": False, "enable.partition.eof": True})  # fmt: skip
    try:
        metadata = consumer.list_topics(topic, timeout=10).topics[topic]
        partitions = [TopicPartition(topic, p, 0) for p in metadata.partitions]
        ends = {p.partition: consumer.get_watermark_offsets(p, timeout=10)[1] for p in partitions}
        consumer.assign(partitions)
        latest: dict[str, bytes | None] = {}
        places: dict[str, tuple[int, int]] = {}
        left = {p for p, end in ends.items() if end > 0}
        while left:
            message = consumer.poll(5)
            assert message is not None, f"the store topic ended early: {left} left"
            if message.error() is not None:
                left.discard(message.partition() or 0)
                continue
            if message.key() != FILLED_KEY:  # the mark that it holds every schedule
                key = (message.key() or b"").decode()
                latest[key] = message.value()
                places[key] = (message.partition() or 0, message.offset() or 0)
            if (message.offset() or 0) + 1 >= ends[message.partition() or 0]:
                left.discard(message.partition() or 0)
        return latest, places
    finally:
        consumer.close()


def redis_pending(service: Service) -> dict[str, bytes]:
    """Every pending id (due or in flight) of the service's namespace, with its payload."""
    client, layout = service.store.client, service.store.layout
    ids: list[str] = []
    for shard in layout.shards:
        for key in (shard.due, shard.in_flight):
            members: list[bytes] = client.zrange(key, 0, -1)  # type: ignore[assignment]
            ids += [member.decode() for member in members]
    payloads = service.store.payloads(ids)
    return {i: p for i, p in zip(ids, payloads, strict=True) if p is not None}


def assert_store_matches(service: Service, env: dict[str, str]) -> dict[str, bytes | None]:
    """The store's live records are exactly Redis's pending payloads; what it returns. In
    index mode, where Redis keeps a reference, it names the id's latest record (its place
    and size) and the due time that record holds."""
    latest, places = store_read(env["KAFKA_BOOTSTRAP_SERVERS"], env["BLACKBOX_STORE_TOPIC"])
    live = {k: v for k, v in latest.items() if v is not None}
    pending = redis_pending(service)
    for schedule_id, raw in pending.items():
        if is_reference(raw) and schedule_id in live:
            ref = Reference.decode(raw)
            assert places[schedule_id] == (ref.partition, ref.offset), schedule_id
            assert ref.size == len(live[schedule_id] or b""), schedule_id
            pending[schedule_id] = resolved(ref, live[schedule_id] or b"")
    assert live == pending
    return latest


@pytest.fixture(params=["inline", "index"])
def store_env(env: dict[str, str], request: pytest.FixtureRequest) -> dict[str, str]:
    """A store topic, with Redis keeping schedules whole (inline) or references (index)."""
    return {**with_store_topic(env), "BLACKBOX_STORAGE_MODE": request.param}


def store_overrides(env: dict[str, str]) -> dict[str, str]:
    """What `start_service` needs of `store_env` to run with its store and mode."""
    return {k: v for k, v in env.items() if k in ("BLACKBOX_STORE_TOPIC", "BLACKBOX_STORAGE_MODE")}


def test_the_store_holds_what_redis_holds_pending_and_a_tombstone_for_what_ended(
    start_service: ServiceFactory, reader: ReaderFactory, store_env: dict[str, str]
) -> None:
    """Fired one-offs, cancels, updates, moves, a pause and a completed series: each id's
    latest store record is its Redis payload byte for byte, or a tombstone once it ended."""
    env = store_env
    service = start_service(**store_overrides(env))
    target, events = reader(unique("target")), reader(env["BLACKBOX_EVENTS_TOPIC"])
    t = target.topic
    _send(env, *[{"topic": t, "message": f"now-{n}", "countdown": 0} for n in range(20)])
    _send(env, *[{"id": f"later-{n}", "topic": t, "message": "x", "countdown": 3600}
                 for n in range(10)])  # fmt: skip
    _send(env, {"id": "tick", "topic": t, "message": "t", "every": 1, "limit": 2},
          {"id": "daily", "topic": t, "message": "d", "every": 86400})  # fmt: skip
    _send(env, *[{"id": f"later-{n}", "cancel": True} for n in range(3)])
    _send(env, {"id": "later-3", "topic": t, "message": "updated", "countdown": 7200},
          {"id": "later-4", "reschedule": True, "countdown": 9000},
          {"id": "later-5", "reschedule": True, "countdown": 1},
          {"id": "daily", "pause": True}, {"id": "missing", "cancel": True})  # fmt: skip
    target.wait_count(23, timeout=30)  # 20 now, 2 ticks, later-5 moved to 1 s
    _wait_answers(events, 20 + 10 + 2 + 3 + 5 + 3)

    latest = _when_settled(service, env)
    assert sum(1 for k, v in latest.items() if v is None and not k.startswith("@")) == 20
    # A cancel of an id never pending leaves a tombstone too (compaction drops it a day on).
    ended = {f"@{CALLER}/{name}" for name in ("later-0", "later-1", "later-2", "later-5",
                                              "tick", "missing")}  # fmt: skip
    assert {k for k, v in latest.items() if v is None and k.startswith("@")} == ended
    pending = {k: v for k, v in latest.items() if v is not None}  # as Redis holds them
    assert b"updated" in pending[f"@{CALLER}/later-3"]
    assert len(pending) == 7  # later-3, later-4, later-6 to later-9, daily
    daily = pending[f"@{CALLER}/daily"]
    assert daily[9] & 64, "the paused flag is in the store's version too"
    held = redis_pending(service)
    indexed = env["BLACKBOX_STORAGE_MODE"] == "index"
    # Index mode: Redis keeps each one-off as a reference (a moved and an updated one
    # included), a series whole; inline mode: each whole.
    assert {i for i, raw in held.items() if is_reference(raw)} == (
        {i for i in held if i != f"@{CALLER}/daily"} if indexed else set()
    )


def _wait_answers(events: TopicReader, count: int) -> None:
    events.wait_for(lambda _: len(events.records) >= count, timeout=30)


def _when_settled(
    service: Service, env: dict[str, str], timeout: float = 20.0
) -> dict[str, bytes | None]:
    """The store once it matches Redis (firing writes its tombstones behind its acks)."""
    found: dict[str, bytes | None] = {}

    def matches() -> bool:
        nonlocal found
        try:
            found = assert_store_matches(service, env)
        except AssertionError:
            return False
        return True

    wait_until(matches, timeout, "the store matches Redis")
    return found


def _forget_all(bootstrap: str, topic: str) -> None:
    """What a day's retention does to an intake topic: every record read is deleted."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    end = end_offset(bootstrap, topic)
    for future in admin.delete_records([TopicPartition(topic, 0, end)]).values():
        future.result(30)


def test_a_flush_is_rebuilt_from_the_store_alone_series_included(
    start_service: ServiceFactory, reader: ReaderFactory, store_env: dict[str, str],
    redis_client: redis.Redis,
) -> None:  # fmt: skip
    """With the intake topic emptied by retention, `blackbox rebuild` writes back every
    pending schedule from the store topic, byte for byte (a series where it stood), passes
    over what ended, and the service goes on: the series fires on, nothing fires twice."""
    env = store_env
    overrides = store_overrides(env)
    service = start_service(**overrides)
    target, events = reader(unique("target")), reader(env["BLACKBOX_EVENTS_TOPIC"])
    t = target.topic
    _send(env, *[{"topic": t, "message": f"now-{n}", "countdown": 0} for n in range(5)])
    _send(env, *[{"topic": t, "message": f"derived-{n}", "countdown": 3600} for n in range(5)])
    _send(env, *[{"id": f"later-{n}", "topic": t, "message": "x", "countdown": 3600}
                 for n in range(5)])  # fmt: skip
    _send(env, {"id": "tick", "topic": t, "message": "t", "every": 2, "limit": 4})
    _send(env, {"id": "later-0", "cancel": True}, {"id": "later-1", "reschedule": True,
                                                  "countdown": 5000})  # fmt: skip
    target.wait_count(6, timeout=30)  # the five now, the series' first
    _wait_answers(events, 5 + 5 + 5 + 1 + 2)
    _when_settled(service, env)
    service.stop()  # its offsets committed: the intake topic may now lose its records
    _forget_all(env["KAFKA_BOOTSTRAP_SERVERS"], env["BLACKBOX_INTAKE_TOPIC"])
    before = redis_pending(service)  # as it stopped (the series may have fired once more)
    wipe_namespace(redis_client, service.settings.namespace)

    counts = rebuild.rebuild(service.settings)

    assert counts.stored == len(before) == 5 + 4 + 1  # derived, later-1..4, the series
    assert redis_pending(service) == before
    again = start_service(**overrides)
    target.wait_count(4 + 5, timeout=30)  # the series' four occurrences in all
    settle_series(again, f"@{CALLER}/tick")
    records = target.read_to_end()
    assert len(records) == 4 + 5
    occurrences = [r.header("blackbox-occurrence-ms") for r in records if r.value == b"t"]
    assert len(occurrences) == len(set(occurrences)) == 4, "no occurrence twice"
    assert sorted(r.value or b"" for r in records if r.value != b"t") == [
        f"now-{n}".encode() for n in range(5)
    ]


def settle_series(service: Service, series_id: str) -> None:
    """Wait until the series is no longer pending."""
    wait_until(lambda: series_id not in redis_pending(service), 30, f"{series_id} completed")


def test_a_store_set_on_a_namespace_with_schedules_is_filled_once_before_the_service_starts(
    start_service: ServiceFactory, env: dict[str, str], tmp_path: Path
) -> None:
    """Turning the store on where schedules are pending: the service refuses to start (the
    store lacks them, a rebuild from it would lose them), a rebuild from it refuses too,
    deleting nothing; `blackbox fill-store --yes` writes each, and the service then starts
    with the store holding exactly what Redis does."""
    before = start_service()
    target = unique("target")
    _send(env, *[{"id": f"old-{n}", "topic": target, "message": f"old-{n}", "countdown": 3600}
                 for n in range(5)])  # fmt: skip
    wait_until(lambda: len(redis_pending(before)) == 5, what="stored")
    before.stop()
    stored = with_store_topic(env)
    overrides = {"BLACKBOX_STORE_TOPIC": stored["BLACKBOX_STORE_TOPIC"]}

    refused = BlackboxProcess(stored, tmp_path / "refused.log", "run")
    assert refused.wait(60) == 2
    assert "blackbox fill-store --yes" in refused.output()
    with pytest.raises(rebuild.StoreNeverFilled, match="BLACKBOX_STORE_TOPIC unset"):
        rebuild.rebuild(Settings.from_env(stored))
    assert len(redis_pending(before)) == 5  # nothing deleted
    unconfirmed = BlackboxProcess(stored, tmp_path / "unconfirmed.log", "fill-store")
    assert unconfirmed.wait(60) == 2
    assert "--yes" in unconfirmed.output()
    fill = BlackboxProcess(stored, tmp_path / "fill.log", "fill-store", "--yes")
    assert fill.wait(60) == 0, fill.output()

    after = start_service(**overrides)
    latest = assert_store_matches(after, stored)
    assert len(latest) == 5


def test_what_the_api_changes_in_redis_alone_reaches_the_store(
    start_service: ServiceFactory, reader: ReaderFactory, store_env: dict[str, str],
    redis_client: redis.Redis,
) -> None:  # fmt: skip
    """Schedules without an id of their own are cancelled and moved by the API in Redis
    alone (no request of theirs reaches the intake topic): the store follows, a tombstone
    for the cancelled and the moved version (in index mode Redis names it), so a flush and
    `blackbox rebuild` restore the move, and never the cancelled one."""
    env = store_env
    overrides = store_overrides(env)
    service = start_service(BLACKBOX_API_TOKEN=TOKEN, **overrides)
    target, events = reader(unique("target")), reader(env["BLACKBOX_EVENTS_TOPIC"])
    _send(env, *[{"topic": target.topic, "message": f"derived-{n}", "countdown": 3600}
                 for n in range(3)])  # fmt: skip
    _wait_answers(events, 3)
    _when_settled(service, env)
    cancelled, moved, kept = sorted(redis_pending(service))
    with httpx.Client(base_url=f"http://127.0.0.1:{_port(service)}", timeout=15) as client:
        gone = client.delete(f"/api/v1/schedules/{cancelled}", headers=AUTH)
        assert gone.json()["outcome"] == "cancelled", gone.text
        later = client.post(f"/api/v1/schedules/{moved}/reschedule", json={"countdown": 7200},
                            headers=AUTH)  # fmt: skip
        assert later.json()["outcome"] == "updated", later.text

    latest = _when_settled(service, env)  # the store matches Redis: the move's due too

    assert latest[cancelled] is None
    assert set(redis_pending(service)) == {moved, kept}
    service.stop()
    _forget_all(env["KAFKA_BOOTSTRAP_SERVERS"], env["BLACKBOX_INTAKE_TOPIC"])
    before = redis_pending(service)
    wipe_namespace(redis_client, service.settings.namespace)
    rebuild.rebuild(service.settings)
    assert redis_pending(service) == before
    layout = service.store.layout
    moved_ms, kept_ms = (float(redis_client.zscore(layout.keys_of(i).due, i) or 0)
                         for i in (moved, kept))  # fmt: skip
    assert moved_ms - kept_ms > 3_000_000  # an hour later, as moved


def _port(service: Service) -> int:
    assert service.endpoints is not None
    return service.endpoints.port


def test_an_id_sent_again_as_its_last_version_fires_is_written_again_after_the_tombstone(
    start_service: ServiceFactory, reader: ReaderFactory, store_env: dict[str, str],
    redis_client: redis.Redis,
) -> None:  # fmt: skip
    """A caller's id sent again in the moments its last version is being fired: firing's
    tombstone of that version, written behind Redis's ack, may land in the store after
    intake's new version (here it is written after it by hand, as it would land). Intake
    writes what Redis holds of the id again once that tombstone must have landed (the
    delivery timeout and 5 s after, checked every 5 s): the store ends with the new version,
    as Redis holds it, and a rebuild would restore it."""
    env = store_env
    service = start_service(**store_overrides(env))
    target, events = reader(unique("target")), reader(env["BLACKBOX_EVENTS_TOPIC"])
    again = {"id": "again", "topic": target.topic}
    _send(env, {**again, "message": "first", "countdown": 0})
    target.wait_count(1, timeout=30)
    _when_settled(service, env)  # the first version's tombstone landed
    _send(env, {**again, "message": "second", "countdown": 3600})
    _wait_answers(events, 2)
    stored_id = f"@{CALLER}/again"
    restate = service.store.layout.keys_of(stored_id).restate
    assert redis_client.zcard(restate) == 1  # noted as stored anew just after it ended
    produce(env["KAFKA_BOOTSTRAP_SERVERS"], env["BLACKBOX_STORE_TOPIC"], [None],
            [(ENDED_HEADER, FIRED)], key=stored_id.encode())  # the tombstone, late  # fmt: skip
    assert (
        store_latest(env["KAFKA_BOOTSTRAP_SERVERS"], env["BLACKBOX_STORE_TOPIC"])[stored_id] is None
    )  # the store says ended, Redis holds it pending

    latest = _when_settled(service, env, timeout=60)

    assert latest[stored_id] is not None
    assert redis_client.zcard(restate) == 0


def test_a_move_to_now_fired_while_the_api_writes_it_ends_as_a_tombstone(
    start_service: ServiceFactory, reader: ReaderFactory, store_env: dict[str, str]
) -> None:
    """The API moves a schedule without an id of its own to now; it fires while the API is
    between reading what Redis holds and writing it to the store, and firing's tombstone
    lands first. The API sees Redis changed under its write and writes again: the store
    ends with the tombstone, as Redis holds nothing."""
    env = store_env
    service = start_service(BLACKBOX_API_TOKEN=TOKEN, **store_overrides(env))
    target, events = reader(unique("target")), reader(env["BLACKBOX_EVENTS_TOPIC"])
    _send(env, {"topic": target.topic, "message": "derived", "countdown": 3600})
    _wait_answers(events, 1)
    _when_settled(service, env)
    (moved,) = redis_pending(service)
    bootstrap, store = env["KAFKA_BOOTSTRAP_SERVERS"], env["BLACKBOX_STORE_TOPIC"]
    assert service.backend is not None and service.backend.admin.keeping is not None
    keeping = service.backend.admin.keeping
    read = keeping._resolved
    held = threading.Event()

    def held_up(ids: Sequence[str], payloads: Sequence[bytes | None]) -> list[bytes | None]:
        found = read(ids, payloads)
        if moved in ids and not held.is_set():  # the API's first read of what Redis holds
            held.set()
            wait_until(lambda: moved not in redis_pending(service), 30, "fired meanwhile")
            wait_until(lambda: store_latest(bootstrap, store)[moved] is None, 30,
                       "firing's tombstone landed")  # fmt: skip
        return found

    keeping._resolved = held_up  # type: ignore[method-assign,assignment]
    with httpx.Client(base_url=f"http://127.0.0.1:{_port(service)}", timeout=60) as client:
        now = client.post(f"/api/v1/schedules/{moved}/reschedule", json={"countdown": 0},
                          headers=AUTH)  # fmt: skip
        assert now.json()["outcome"] == "updated", now.text
    target.wait_count(1, timeout=30)

    latest = _when_settled(service, env)

    assert latest[moved] is None
