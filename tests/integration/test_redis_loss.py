"""Redis losing what intake applied: a gap within the re-read limit is read again from Kafka
by itself; a Redis wiped under committed offsets stops intake, says so, and is never run on
silently (gaps.py). The failover itself, on real processes, is test_failover.py."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from blackbox.client import Client
from blackbox.clock import now_ms
from blackbox.dev.servers import RedisServer, free_port
from blackbox.intake import rebuild
from blackbox.service import Service
from blackbox.signing import Signer, public_text
from tests.integration.conftest import ReaderFactory, ServiceFactory, wipe_namespace
from tests.kafkatools import envelope, produce, unique, wait_until

pytestmark = pytest.mark.both_store_modes  # the storage-touching tests: both modes


def _schedule(service: Service, target: str, count: int, countdown: float, bad: int = 0) -> None:
    bootstrap = service.settings.kafka["bootstrap.servers"]
    values = [envelope(target, {"n": n}, countdown) for n in range(count)]
    values += [b"not json %d" % n for n in range(bad)]
    produce(bootstrap, service.settings.intake_topic, values)


def _stored(service: Service, count: int) -> None:
    wait_until(lambda: sum(service.store.counts()) == count, what=f"{count} stored")


def test_redis_emptied_under_a_running_intake_is_read_again_from_kafka(
    start_service: ServiceFactory, reader: ReaderFactory, redis_client: redis.Redis
) -> None:
    """Guarantee 1: Redis went back below what it confirmed to intake (its data lost while
    the service runs, as a failover to a lagging replica does): the records are read again
    from Kafka and every schedule is delivered once; refused records are not dead-lettered
    a second time, and no record is answered again (issue 50: a re-read answered each one
    `scheduled` twice, some `updated`)."""
    service = start_service()
    target = unique("regained")
    _schedule(service, target, 30, countdown=4, bad=5)
    _stored(service, 30)
    dlq = reader(service.settings.dlq_topic)
    dlq.wait_count(5)
    events = reader(service.settings.events_topic)
    events.wait_count(35)
    assert wipe_namespace(redis_client, service.settings.namespace, schedules_only=True) > 0

    delivered = reader(target).wait_count(30, timeout=40)
    bodies = Counter(orjson.loads(r.value or b"")["n"] for r in delivered)
    assert sorted(bodies) == list(range(30))
    assert service.metrics.value("blackbox_intake_reread_records_total") >= 30
    assert service.metrics.value("blackbox_redis_gaps_total", {"kind": "lag"}) >= 1
    assert len(dlq.read_to_end()) == 5  # the refusals were dead-lettered once only
    answers = Counter(
        (orjson.loads(r.value or b"")["intake"]["offset"], orjson.loads(r.value or b"")["outcome"])
        for r in events.read_to_end()
    )
    assert sorted(answers.values()) == [1] * 35  # each record answered once, as it was
    assert Counter(outcome for _, outcome in answers) == {"scheduled": 30, "dead_lettered": 5}
    assert service.health.ready or not service.health.holds


def test_a_wiped_redis_under_committed_offsets_stops_intake_and_says_so(
    start_service: ServiceFactory, reader: ReaderFactory, redis_client: redis.Redis
) -> None:
    """Guarantee 1 (issue: a wiped Redis is never run on silently): a service started on a
    Redis that lost everything while the group has committed offsets does not read on: the
    partition is stopped, /ready holds it, the metrics count it. Started again with
    BLACKBOX_REDIS_LOSS=reread, it reads the requests again and delivers every one."""
    first = start_service()
    target = unique("wiped")
    _schedule(first, target, 20, countdown=3)
    _stored(first, 20)
    first.stop()
    wipe_namespace(redis_client, first.settings.namespace)

    stopped = start_service()
    wait_until(lambda: stopped.metrics.value("blackbox_intake_stopped_partitions") == 1,
               what="the intake partition stopped")  # fmt: skip
    assert stopped.metrics.value("blackbox_redis_gaps_total", {"kind": "no_watermark"}) >= 1
    assert not stopped.health.ready
    assert "intake" in stopped.health.report()["held"]  # type: ignore[operator]
    assert stopped.store.counts() == (0, 0)  # nothing read on as if nothing happened
    stopped.stop()

    again = start_service(BLACKBOX_REDIS_LOSS="reread")
    delivered = reader(target).wait_count(20, timeout=40)
    assert sorted(orjson.loads(r.value or b"")["n"] for r in delivered) == list(range(20))
    assert again.metrics.value("blackbox_intake_stopped_partitions") == 0


def test_a_gap_whose_records_aged_out_of_kafka_stops_intake_and_says_so(
    start_service: ServiceFactory, reader: ReaderFactory, redis_client: redis.Redis
) -> None:
    """Guarantee 1: a failover's gap is read again from Kafka, but records Kafka no longer
    holds (deleted by retention, or by an operator) cannot be: intake stops the partition
    and says so (kind aged_out, /ready holds it) instead of the consumer going on from the
    oldest record left. Started again with BLACKBOX_REDIS_LOSS=reread, it reads what Kafka
    still holds and counts what it no longer does as given up."""
    first = start_service()
    before, target = unique("before-gap"), unique("aged-out")
    _schedule(first, before, 10, countdown=0)  # offsets 0-9
    reader(before).wait_count(10)
    marks_before_gap = _marks(redis_client, first)
    _schedule(first, target, 20, countdown=15)  # offsets 10-29: the gap
    _stored(first, 20)
    first.stop()
    wipe_namespace(redis_client, first.settings.namespace, schedules_only=True)
    _restore_marks(redis_client, marks_before_gap)  # the promoted replica's marks
    _delete_before(first, 20)  # retention took offsets 0-19: the gap's first ten

    stopped = start_service()
    wait_until(lambda: stopped.metrics.value("blackbox_intake_stopped_partitions") == 1,
               what="the intake partition stopped")  # fmt: skip
    assert stopped.metrics.value("blackbox_redis_gaps_total", {"kind": "aged_out"}) == 1
    assert not stopped.health.ready
    assert "intake" in stopped.health.report()["held"]  # type: ignore[operator]
    assert stopped.store.counts() == (0, 0)  # nothing read on as if nothing happened
    stopped.stop()

    again = start_service(BLACKBOX_REDIS_LOSS="reread")
    delivered = reader(target).wait_count(10, timeout=60)
    assert sorted(orjson.loads(r.value or b"")["n"] for r in delivered) == list(range(10, 20))
    assert again.metrics.value("blackbox_intake_given_up_records_total") == 10
    assert again.metrics.value("blackbox_intake_stopped_partitions") == 0


def test_skip_gives_the_lost_schedules_up_and_counts_them(
    start_service: ServiceFactory, reader: ReaderFactory, redis_client: redis.Redis
) -> None:
    """Going on after lost data is the operator's explicit choice: with
    BLACKBOX_REDIS_LOSS=skip intake goes on from the committed offsets, counts what it gave
    up, and a later start does not stop again on the same gap."""
    first = start_service()
    target = unique("skipped")
    _schedule(first, target, 10, countdown=600)
    _stored(first, 10)
    first.stop()
    wipe_namespace(redis_client, first.settings.namespace)

    skipping = start_service(BLACKBOX_REDIS_LOSS="skip")
    wait_until(lambda: skipping.metrics.value("blackbox_intake_given_up_records_total") == 10,
               what="10 records given up")  # fmt: skip
    _schedule(skipping, target, 1, countdown=0)
    assert len(reader(target).wait_count(1)) == 1  # intake goes on
    skipping.stop()

    after = start_service()
    _schedule(after, target, 1, countdown=0)
    wait_until(lambda: after.metrics.value("blackbox_delivered_total") == 1, what="delivered")
    assert after.metrics.value("blackbox_intake_stopped_partitions") == 0


def test_signed_requests_read_again_after_their_max_age_are_applied_not_dropped(
    start_service: ServiceFactory,
    reader: ReaderFactory,
    redis_client: redis.Redis,
    env: dict[str, str],
    tmp_path: Path,
) -> None:
    """Guarantee 1: signed requests applied and committed, then lost by Redis (a failover's
    lag), are read again later than their signature's max age: the age was judged when they
    were first read, so they are applied again, not refused (and not dropped silently)."""
    key = Ed25519PrivateKey.generate()
    policy = tmp_path / "policy.yaml"
    policy.write_text("callers:\n  billing:\n    require_signature: true\n"
                      "    signature_max_age_seconds: 4\n"
                      f'    keys: {{billing-1: "{public_text(key.public_key())}"}}\n')  # fmt: skip
    first = start_service(BLACKBOX_POLICY_FILE=str(policy))
    target, bootstrap = unique("signed-lost"), {"bootstrap.servers": env["KAFKA_BOOTSTRAP_SERVERS"]}
    delivered = reader(target)
    with Client(bootstrap, caller="other", intake_topic=first.settings.intake_topic) as plain:
        plain.send_later(target, "first", delay=0)
    delivered.wait_count(1)
    marks_after_first = _marks(redis_client, first)
    with Client(bootstrap, caller="billing", intake_topic=first.settings.intake_topic,
                signer=Signer(key, "billing-1")) as signed:  # fmt: skip
        for n in range(5):
            signed.send_later(target, f"signed-{n}", delay=20)
    sent = time.monotonic()
    _stored(first, 5)
    first.stop()
    wipe_namespace(redis_client, first.settings.namespace, schedules_only=True)
    _restore_marks(redis_client, marks_after_first)  # the promoted replica's marks
    wait_until(lambda: time.monotonic() - sent > 5, what="the signatures' max age passed")
    dead = reader(first.settings.dlq_topic)
    start_service(BLACKBOX_POLICY_FILE=str(policy))
    got = delivered.wait_for(lambda records: len(records) >= 6, timeout=60)
    assert sorted((r.value or b"").decode() for r in got) == [
        "first",
        *(f"signed-{n}" for n in range(5)),
    ]
    assert dead.read_to_end() == []


def _marks(client: redis.Redis, service: Service) -> dict[str, Any]:
    return {k.intake_marks: client.hgetall(k.intake_marks) for k in service.store.layout.shards}


def _restore_marks(client: redis.Redis, marks: dict[str, Any]) -> None:
    for key, fields in marks.items():
        if fields:
            client.hset(key, mapping=fields)


def _delete_before(service: Service, offset: int) -> None:
    """Delete the intake partition's records below `offset`, as retention would: Kafka's log
    start offset moves to it."""
    admin = AdminClient(dict(service.settings.kafka))
    asked = [TopicPartition(service.settings.intake_topic, 0, offset)]
    for future in admin.delete_records(asked).values():
        assert future.result(15).low_watermark == offset


def _pace_until(instant: float) -> None:
    """Until the monotonic `instant`: a steady stream's next send."""
    wait_until(lambda: time.monotonic() >= instant, what="the stream's next send")


def _clock_at(client: redis.Redis, service: Service) -> int | None:
    """The oldest of the namespace's shard clocks, None while one has none."""
    found = [client.hget(keys.clock, "at") for keys in service.store.layout.shards]
    return None if None in found else min(int(at) for at in found)  # type: ignore[arg-type]


def _held_for(service: Service, kind: str) -> bool:
    """Whether `service` holds intake and firing for Redis lost data of `kind`, and says so."""
    return (
        service.metrics.value("blackbox_intake_stopped_partitions") == 1
        and service.metrics.value("blackbox_redis_gaps_total", {"kind": kind}) >= 1
        and service.firing is not None
        and service.firing.lost == kind
        and not service.health.ready
    )


def _bodies(target: list[Any]) -> Counter[int]:
    return Counter(orjson.loads(r.value or b"")["n"] for r in target)


@pytest.mark.parametrize("action", ["rebuild", "reread"])
def test_a_flush_under_load_holds_everything_and_the_operator_delivers_each_once(
    start_service: ServiceFactory, reader: ReaderFactory, redis_client: redis.Redis, action: str
) -> None:
    """Issue 50: FLUSHALL under a steady stream was taken for a failover's lag (few records
    behind): each partition was read again from 0, firing again what had been delivered,
    with /ready 200 and no alert. Now the flush is lost data from the first look at the
    clocks: intake stops, firing holds, /ready says so, the mark stays in Redis; nothing is
    delivered twice. Then the operator's rebuild, or restart with BLACKBOX_REDIS_LOSS=reread
    (whose re-read firing rechecks against the target topic), delivers each exactly once."""
    service = start_service()
    wait_until(lambda: _clock_at(redis_client, service) is not None, what="the clocks set")
    target = unique("flushed")
    bootstrap = service.settings.kafka["bootstrap.servers"]
    sent, started = 0, time.monotonic()
    for second in range(6):  # 40/s: ten every quarter second, some firing, some pending
        for quarter in range(4):
            values = [envelope(target, {"n": sent + n}, 0.5 if n % 2 else 30) for n in range(10)]
            produce(bootstrap, service.settings.intake_topic, values)
            sent += 10
            _pace_until(started + second + (quarter + 1) / 4)  # the stream's own pace
        if second == 2:
            wipe_namespace(redis_client, service.settings.namespace)  # FLUSHALL, this namespace
    wait_until(lambda: _held_for(service, "flushed"), what="intake and firing held: flushed")
    assert "intake" in service.health.report()["held"]  # type: ignore[operator]
    mark: Any = redis_client.hget(service.store.layout.shards[0].clock, "lost")
    assert mark is not None and mark.startswith(b"flushed ")
    twice = {n: c for n, c in _bodies(reader(target).read_to_end()).items() if c > 1}
    assert twice == {}
    service.stop()

    if action == "rebuild":
        rebuild.rebuild(service.settings)
        again = start_service()
    else:
        again = start_service(BLACKBOX_REDIS_LOSS="reread")
    delivered = reader(target).wait_count(sent, timeout=90)
    assert sorted(_bodies(delivered).items()) == [(n, 1) for n in range(sent)]
    assert again.firing is not None and again.firing.lost is None
    assert again.metrics.value("blackbox_intake_stopped_partitions") == 0


class OwnRedis:
    """A Redis of the test's own, to snapshot and restore as an operator would: `SAVE`, then
    the server stopped, an older `dump.rdb` put back, and the server started on it."""

    def __init__(self, folder: Path) -> None:
        folder.mkdir()
        self.server = RedisServer(free_port(), folder)
        self.dump = folder / "dump.rdb"
        self.client = redis.Redis.from_url(self.server.url)

    def snapshot(self) -> bytes:
        self.client.save()
        return self.dump.read_bytes()

    def restore(self, snapshot: bytes) -> None:
        self.server.stop()
        self.dump.write_bytes(snapshot)
        self.server.start()


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[OwnRedis]:
    own = OwnRedis(tmp_path / "redis")
    own.server.start()
    yield own
    own.client.close()
    own.server.stop()


def _on_own_redis(start_service: ServiceFactory, own: OwnRedis) -> Service:
    """A service on `own` that takes a clock two seconds back for a restored snapshot,
    once its clocks are set."""
    service = start_service(REDIS_URL=own.server.url, BLACKBOX_REDIS_MAX_LAG="2")
    wait_until(lambda: _clock_at(own.client, service) is not None, what="the clocks set")
    return service


def test_a_snapshot_restored_under_a_running_service_fires_nothing_again(
    start_service: ServiceFactory, reader: ReaderFactory, own_redis: OwnRedis
) -> None:
    """Issue 50: a dump.rdb restored with the service running looked exactly like a
    failover: everything fired since the snapshot fired again (2,000 copies of 2,000). Its
    clock is older than BLACKBOX_REDIS_MAX_LAG: the claims refuse it from the first one,
    intake stops, /ready says so; none of what fired since the snapshot fires again."""
    service = _on_own_redis(start_service, own_redis)
    target = unique("restored")
    _schedule(service, target, 20, countdown=3)
    _stored(service, 20)
    snapshot = own_redis.snapshot()
    taken_at = _clock_at(own_redis.client, service) or 0
    assert len(reader(target).wait_count(20)) == 20  # fired since the snapshot
    firing = service.firing
    assert firing is not None
    wait_until(lambda: min(firing.clocks.floors().values()) > taken_at, 30,
               "the clocks moved on past the snapshot's by more than the lag")  # fmt: skip
    own_redis.restore(snapshot)

    wait_until(lambda: _held_for(service, "restored"), what="intake and firing held")
    assert sorted(_bodies(reader(target).read_to_end()).items()) == [(n, 1) for n in range(20)]
    assert sum(service.store.counts()) == 20  # the snapshot's schedules, held unfired


def test_committed_offsets_kafka_deleted_unread_stop_intake_and_say_so(
    start_service: ServiceFactory, reader: ReaderFactory
) -> None:
    """Issue 50: records Kafka deleted (retention) before intake read them were passed over
    silently: the consumer went on from the oldest record left. Now that is lost data,
    held and said; the operator's BLACKBOX_REDIS_LOSS=skip goes on and counts them."""
    first = start_service()
    target = unique("unread")
    _schedule(first, target, 10, countdown=0)  # offsets 0-9, read and committed
    reader(target).wait_count(10)
    first.stop()
    values = [envelope(target, {"n": n}, 0) for n in range(10, 20)]
    produce(first.settings.kafka["bootstrap.servers"], first.settings.intake_topic, values)
    # offsets 10-19, written while no intake runs
    _delete_before(first, 15)  # retention took 10-14 before they were read

    stopped = start_service()
    wait_until(lambda: stopped.metrics.value("blackbox_intake_stopped_partitions") == 1,
               what="the intake partition stopped")  # fmt: skip
    assert stopped.metrics.value("blackbox_redis_gaps_total", {"kind": "deleted_unread"}) >= 1
    assert not stopped.health.ready
    assert len(reader(target).read_to_end()) == 10  # nothing read on as if nothing happened
    stopped.stop()

    start_service(BLACKBOX_REDIS_LOSS="skip")
    delivered = reader(target).wait_count(15, timeout=40)
    assert sorted(_bodies(delivered)) == [*range(10), *range(15, 20)]


def test_a_snapshot_restored_while_the_service_was_stopped_holds_at_start(
    start_service: ServiceFactory, own_redis: OwnRedis
) -> None:
    """Issue 50: restored while no process watched, an old snapshot is told from a
    failover's lag by Kafka's own times: the records of its gap were written more than
    BLACKBOX_REDIS_MAX_LAG after the shards' clocks. Intake stops and firing holds from the
    start, on the mark the check leaves."""
    first = _on_own_redis(start_service, own_redis)
    target = unique("restored-stopped")
    _schedule(first, target, 10, countdown=600)
    _stored(first, 10)
    snapshot = own_redis.snapshot()
    taken_at = max(int(own_redis.client.hget(k.clock, "at") or 0)
                   for k in first.store.layout.shards)  # fmt: skip
    wait_until(lambda: now_ms() > taken_at + 2_500, what="more than the lag after")
    _schedule(first, target, 10, countdown=600)  # the snapshot's gap
    _stored(first, 20)
    first.stop()
    own_redis.restore(snapshot)

    again = start_service(REDIS_URL=own_redis.server.url, BLACKBOX_REDIS_MAX_LAG="2")
    wait_until(lambda: _held_for(again, "restored"), what="intake and firing held")
    assert sum(again.store.counts()) == 10  # nothing read on as if nothing happened


def test_a_snapshot_restored_while_the_service_was_stopped_fires_nothing_again(
    start_service: ServiceFactory, reader: ReaderFactory, own_redis: OwnRedis
) -> None:
    """Issue 50: restored while no process watched, and with no request since the snapshot
    for Kafka's times to tell it by, an old snapshot holds due again what fired after it.
    The shards' clocks name the server they were last moved on: the restarted one is
    another, so the first claims recheck what the target topic shows delivered since the
    clocks, and nothing fires again."""
    first = _on_own_redis(start_service, own_redis)
    target = unique("restored-idle")
    _schedule(first, target, 20, countdown=3)
    _stored(first, 20)
    snapshot = own_redis.snapshot()
    delivered = reader(target)
    delivered.wait_count(20)  # fired after the snapshot
    first.stop()
    own_redis.restore(snapshot)

    again = start_service(REDIS_URL=own_redis.server.url, BLACKBOX_REDIS_MAX_LAG="2")
    wait_until(lambda: again.store.counts() == (0, 0), what="the restored schedules settled")
    assert again.metrics.value("blackbox_redeliveries_passed_over_total") == 20
    assert sorted(_bodies(delivered.read_to_end()).items()) == [(n, 1) for n in range(20)]
