"""A Redis failover with a lagging replica (issue 37): a primary and its replica behind a
moving endpoint or watched by Sentinels (tests/replication.py), the replication link
partitioned for real, the primary killed, the replica promoted, and the service following
it."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
import redis
from confluent_kafka import Consumer, TopicPartition

from blackbox.dev.servers import KafkaBroker, free_port
from blackbox.intake.gaps import Kind
from blackbox.kafka import clients
from blackbox.service import Service
from blackbox.settings import Settings
from blackbox.storage.keys import Layout
from tests.integration.conftest import ReaderFactory, ServiceFactory, service_env, settle
from tests.kafkatools import (
    Received,
    TopicReader,
    envelope,
    produce,
    produce_to,
    unique,
    wait_until,
)
from tests.process import BlackboxProcess
from tests.replication import ReplicatedRedis, WatchedRedis

PARTITIONS = 3  # of the intake topic: the lost records are spread over several
BEFORE = 200  # schedules replicated before the partition
DURING = 200  # schedules intake applies and commits while the replica lags
AFTER = 30  # schedules sent the instant the endpoint moved
LAGGED = 40  # schedules replicated, then fired on the primary while the link was held
COUNTDOWN = 15.0  # seconds: long enough that nothing fires before the failover
DELIVERY_DEADLINE = 60.0  # seconds after the last due time


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[ReplicatedRedis]:
    with ReplicatedRedis(tmp_path / "redis") as replicated:
        yield replicated


@pytest.fixture(params=["endpoint", "sentinel"])
def any_pair(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ReplicatedRedis]:
    """The pair behind a moving endpoint (a managed Redis), or watched by a Sentinel."""
    kind = ReplicatedRedis if request.param == "endpoint" else WatchedRedis
    with kind(tmp_path / "redis") as replicated:
        yield replicated


def test_a_held_replication_link_loses_what_the_primary_applied_meanwhile(
    pair: ReplicatedRedis,
) -> None:
    """The harness behind guarantee 1's failover test: writes the primary applied (and
    fsynced) while the link was held are missing from the promoted replica, those from
    before are all there, and the endpoint then serves the promoted replica."""
    with pair.client(pair.primary) as primary:
        primary.mset({f"before:{n}": n for n in range(1000)})
        pair.wait_in_sync()
        pair.partition()
        with primary.pipeline(transaction=False) as pipe:
            for n in range(1000):
                pipe.set(f"during:{n}", n)
            assert all(pipe.execute())
    pair.fail_over()

    with pair.client(pair.replica) as promoted:
        assert promoted.exists(*(f"before:{n}" for n in range(1000))) == 1000
        assert promoted.exists(*(f"during:{n}" for n in range(1000))) == 0
    with redis.Redis.from_url(pair.url) as through_endpoint:
        assert through_endpoint.set("after", 1)


def test_a_failover_to_a_lagging_replica_loses_no_schedule_intake_accepted(
    broker: KafkaBroker, reader: ReaderFactory, pair: ReplicatedRedis, tmp_path: Path
) -> None:
    """Guarantee 1, no silent loss whatever happens to Redis: schedules intake applied and
    committed while the replica lagged are delivered after the primary dies and the replica
    is promoted, like those replicated before; a copy delivered twice keeps its
    `blackbox-id`; the process follows the moved endpoint with no restart and /ready
    answers 200 again."""
    port = free_port()
    env = service_env(pair.url, broker.bootstrap, BLACKBOX_HTTP_PORT=str(port))
    settings = Settings.from_env(env)
    target = unique("failover")
    clients.ensure_topics(settings.kafka, [settings.intake_topic], PARTITIONS)
    clients.ensure_topics(settings.kafka, [*settings.own_topics, target])
    service = BlackboxProcess(env, tmp_path / "service.log")
    try:
        wait_until(lambda: ready(port), 60, "/ready answering 200")
        last_due = _lose_the_lag(pair, settings, target)
        wait_until(lambda: ready(port), 30, "/ready answering 200 after the switch")
        delivered = _read_until_all(reader(target), last_due + DELIVERY_DEADLINE)
        assert service.process.poll() is None, "the service exited"
    finally:
        service.terminate()

    before = len(delivered.keys() & set(_bodies("before", BEFORE)))
    during = len(delivered.keys() & set(_bodies("during", DURING)))
    after = len(delivered.keys() & set(_bodies("after", AFTER)))
    assert (before, during, after) == (BEFORE, DURING, AFTER), (
        f"delivered {before} of {BEFORE} schedules replicated before the partition, "
        f"{during} of {DURING} applied during it and {after} of {AFTER} sent after the switch"
    )
    under_two_ids = {body: sorted(ids) for body, ids in delivered.items() if len(ids) > 1}
    assert under_two_ids == {}


def _lose_the_lag(pair: ReplicatedRedis, settings: Settings, target: str) -> float:
    """Schedule BEFORE messages and let them replicate, partition the link, schedule DURING
    more and wait until intake committed them, then fail over; the monotonic time by which
    every message is due."""
    bootstrap = settings.kafka["bootstrap.servers"]
    with pair.client(pair.primary) as primary, pair.client(pair.replica) as replica:
        _schedule(bootstrap, settings.intake_topic, target, "before", BEFORE)
        wait_until(lambda: _pending(replica, settings.namespace) == BEFORE, 30,
                   "the first schedules on the replica")  # fmt: skip
        pair.partition()
        sent = time.monotonic()
        _schedule(bootstrap, settings.intake_topic, target, "during", DURING)
        wait_until(lambda: _pending(primary, settings.namespace) == BEFORE + DURING, 30,
                   "the later schedules on the primary")  # fmt: skip
        wait_until(lambda: _committed_to_end(settings), 30, "intake committing every record")
        assert _pending(replica, settings.namespace) == BEFORE, "the held link let writes by"
    pair.fail_over()
    # At once, before intake met the failover: requests applied on the promoted replica
    # on top of what it lost must not hide the lost ones from the re-read.
    _schedule(bootstrap, settings.intake_topic, target, "after", AFTER)
    return sent + COUNTDOWN


def _schedule(bootstrap: str, intake: str, target: str, kind: str, count: int) -> None:
    """`count` schedules spread evenly over the intake partitions, each message unique."""
    produce_to(bootstrap, intake, [(n % PARTITIONS, None, envelope(target, body, COUNTDOWN))
                                   for n, body in enumerate(_bodies(kind, count))])  # fmt: skip


def _bodies(kind: str, count: int) -> list[str]:
    return [f"{kind}-{n}" for n in range(count)]


def _pending(client: redis.Redis, namespace: str) -> int:
    """Schedules due or in flight in `namespace`, over all its shards."""
    recorded = client.get(Layout(namespace).shard_count)
    layout = Layout(namespace, int(recorded) if recorded is not None else 1)
    return sum(client.zcard(k.due) + client.zcard(k.in_flight) for k in layout.shards)


def _committed_to_end(settings: Settings) -> bool:
    """Whether the group's committed offset reached the end of every intake partition."""
    consumer = Consumer({**settings.kafka, "group.id": settings.group_id})
    try:
        partitions = [TopicPartition(settings.intake_topic, p) for p in range(PARTITIONS)]
        committed = consumer.committed(partitions, timeout=5)
        ends = [consumer.get_watermark_offsets(p, timeout=5)[1] for p in partitions]
        return all(c.offset == end for c, end in zip(committed, ends, strict=True))
    finally:
        consumer.close()


def _read_until_all(target: TopicReader, deadline: float) -> dict[str, set[str]]:
    """Each message body read from `target` until every one scheduled arrived or the
    (monotonic) deadline passed, with the `blackbox-id`s it came under."""
    expected = {*_bodies("before", BEFORE), *_bodies("during", DURING), *_bodies("after", AFTER)}
    delivered: dict[str, set[str]] = defaultdict(set)
    while time.monotonic() < deadline and not expected <= delivered.keys():
        target.poll()
        _collect(target, delivered)
    target.read_to_end()  # a second copy written after the last first one is read too
    _collect(target, delivered)
    return delivered


def _collect(target: TopicReader, delivered: dict[str, set[str]]) -> None:
    for record in target.records:
        delivered[(record.value or b"").decode()].add(record.header("blackbox-id"))


def ready(port: int) -> bool:
    """Whether the service's /ready answers 200."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=2) as answer:
            return bool(answer.status == 200)
    except OSError:  # HTTPError (a 503) included
        return False


def test_a_failover_fires_nothing_again_that_the_old_primary_fired_during_the_lag(
    start_service: ServiceFactory, reader: ReaderFactory, any_pair: ReplicatedRedis
) -> None:
    """Issue 50: schedules replicated, then fired and acknowledged on the primary while the
    link was held, are due again on the promoted replica (the acks never reached it): 53
    copies in the issue's Sentinel run. The claims after the failover name another server,
    so what the target topic shows delivered since the longest lag is settled, unproduced;
    every message arrives once, and the service goes on."""
    pair = any_pair
    service = start_service(REDIS_URL=pair.url)
    target = unique("fired-in-lag")
    bootstrap = service.settings.kafka["bootstrap.servers"]
    produce(bootstrap, service.settings.intake_topic,
            [envelope(target, f"lag-{n}", 3.0) for n in range(LAGGED)])  # fmt: skip
    with pair.client(pair.replica) as replica:
        wait_until(lambda: _pending(replica, service.settings.namespace) == LAGGED, 30,
                   "the schedules on the replica")  # fmt: skip
    pair.partition()
    delivered = reader(target)
    delivered.wait_count(LAGGED)  # fired on the primary; their acks stay there
    pair.fail_over()

    produce(bootstrap, service.settings.intake_topic,
            [envelope(target, f"after-{n}", 0) for n in range(AFTER)])  # fmt: skip
    # On the topic, not by blackbox_delivered_total: what is passed over counts there too.
    after = {f"after-{n}" for n in range(AFTER)}
    delivered.wait_for(lambda records: after <= {(r.value or b"").decode() for r in records}, 60)
    bodies = Counter((r.value or b"").decode() for r in delivered.read_to_end())
    assert sorted(bodies.items()) == sorted(
        [(f"lag-{n}", 1) for n in range(LAGGED)] + [(f"after-{n}", 1) for n in range(AFTER)]
    )
    assert service.metrics.value("blackbox_redeliveries_passed_over_total") == LAGGED


@pytest.fixture
def watched_by_three(tmp_path: Path) -> Iterator[WatchedRedis]:
    """The pair watched by three Sentinels, quorum 2: two must find the primary down, and
    the one a majority elects promotes the replica."""
    watched = WatchedRedis(tmp_path / "redis", sentinels=3)
    with watched:
        yield watched


# The groups of the three-Sentinel test: what each is, and its countdown in seconds.
FIRED_IN_LAG = 3.0  # replicated, then fired on the old primary while the link was held
LAGGED_FIRED = 0.5  # applied during the lag (never replicated) and fired on the old primary
LATE = 12.0  # due after the failover: replicated, or applied during the lag
GROUP = 30  # schedules in each group


def test_three_sentinels_promote_a_lagging_replica_and_nothing_is_lost_or_sent_twice(
    watched_by_three: WatchedRedis, start_service: ServiceFactory, reader: ReaderFactory,
    env: dict[str, str],
) -> None:  # fmt: skip
    """Issue 50, guarantees 1 and 2 with three `redis-sentinel`s: schedules replicated, then
    more applied and committed while the replication link was held, some of each fired on
    the old primary during the lag; the primary is killed and the Sentinels elect one of
    them to promote the lagging replica. Every schedule arrives exactly once (the re-read
    writes back the lag, the recheck passes over what the old primary fired), no intake
    record is answered twice nor `updated`, /ready answers 200 again and the failover is
    counted as lag, not lost data: nothing held, no alert."""
    pair = watched_by_three
    config = {"bootstrap.servers": env["KAFKA_BOOTSTRAP_SERVERS"]}
    clients.ensure_topics(config, [env["BLACKBOX_INTAKE_TOPIC"]], PARTITIONS)
    service = start_service(REDIS_URL=pair.url)
    target, events = unique("three-sentinels"), reader(service.settings.events_topic)
    delivered = reader(target)
    sent = _fire_in_and_after_the_lag(service, pair, target, delivered)

    everything = {body for group in sent.values() for body in group}
    delivered.wait_for(lambda records: everything <= _bodies_of(records), 60)
    settle(service)  # nothing due or in flight on the promoted replica: no copy to come
    bodies = Counter((r.value or b"").decode() for r in delivered.read_to_end())
    answers = [_answer(r) for r in events.read_to_end()]
    per_record = Counter(where for where, _ in answers)
    records = sum(len(group) for group in sent.values())
    assert {
        "lost": len(everything - bodies.keys()),
        "copies": sum(bodies.values()) - len(bodies),
        "records answered": len(per_record),
        "records answered twice": sum(1 for n in per_record.values() if n > 1),
        "outcomes": dict(Counter(outcome for _, outcome in answers)),
    } == {"lost": 0, "copies": 0, "records answered": records, "records answered twice": 0,
          "outcomes": {"scheduled": records}}  # fmt: skip
    fired_in_lag = len(sent["replicated, fired"]) + len(sent["lagged, fired"])
    _assert_told_as_lag(service, fired_in_lag)


def _fire_in_and_after_the_lag(
    service: Service, pair: WatchedRedis, target: str, delivered: TopicReader
) -> dict[str, list[str]]:
    """Schedule the groups, partition, fire some on the old primary, fail over; the bodies
    sent, by group."""
    settings = service.settings
    bootstrap, intake = settings.kafka["bootstrap.servers"], settings.intake_topic
    sent = {"replicated, fired": _bodies("replicated-fired", GROUP),
            "replicated, late": _bodies("replicated-late", GROUP),
            "lagged, fired": _bodies("lagged-fired", GROUP),
            "lagged, late": _bodies("lagged-late", GROUP),
            "after": _bodies("after", GROUP)}  # fmt: skip

    def schedule(group: str, countdown: float) -> None:
        produce_to(bootstrap, intake, [(n % PARTITIONS, None, envelope(target, body, countdown))
                                       for n, body in enumerate(sent[group])])  # fmt: skip

    schedule("replicated, fired", FIRED_IN_LAG)
    schedule("replicated, late", LATE)
    with pair.client(pair.replica) as replica:
        wait_until(lambda: _pending(replica, settings.namespace) == 2 * GROUP, 30,
                   "the first schedules on the replica")  # fmt: skip
    pair.partition()
    schedule("lagged, fired", LAGGED_FIRED)
    schedule("lagged, late", LATE)
    wait_until(lambda: _committed_to_end(settings), 30, "intake committing every record")
    fired = set(sent["replicated, fired"]) | set(sent["lagged, fired"])
    delivered.wait_for(lambda records: fired <= _bodies_of(records), 30)  # on the old primary
    pair.fail_over()
    with pair.client(pair.replica) as replica:  # read-only until the Sentinels promote it
        assert _pending(replica, settings.namespace) == 2 * GROUP, "the held link let writes by"
    wait_until(pair.promoted, 30, "the Sentinels promoting the replica")
    schedule("after", 0)
    return sent


def _bodies_of(records: list[Received]) -> set[str]:
    return {(r.value or b"").decode() for r in records}


def _answer(record: Received) -> tuple[tuple[int, int], str]:
    """An answer on the events topic: the intake record it answers, and its outcome."""
    answer = orjson.loads(record.value or b"")
    return (answer["intake"]["partition"], answer["intake"]["offset"]), answer["outcome"]


def _assert_told_as_lag(service: Service, fired_in_lag: int) -> None:
    """/ready answers 200 again and the failover is counted as lag: no kind of lost data,
    nothing held, firing on, the alert's two conditions at 0."""
    assert service.endpoints is not None
    port = service.endpoints.port
    wait_until(lambda: ready(port), 30, "/ready answering 200")
    metrics = service.metrics
    assert metrics.value("blackbox_redis_gaps_total", {"kind": "lag"}) >= 1
    lost = [k.value for k in Kind if k not in (Kind.FINE, Kind.LAG)
            and metrics.value("blackbox_redis_gaps_total", {"kind": k.value})]  # fmt: skip
    assert lost == []
    assert metrics.value("blackbox_intake_stopped_partitions") == 0
    assert metrics.value("blackbox_firing_held_for_lost_data") == 0
    assert "held" not in service.health.report()
    assert service.firing is not None and service.firing.lost is None
    # What the old primary fired: the replicated ones due again on the promoted replica,
    # the lagged ones written back by the re-read; each passed over, none produced.
    assert metrics.value("blackbox_redeliveries_passed_over_total") >= fired_in_lag
