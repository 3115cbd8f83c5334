"""The dispatcher on a real Redis, with a broker that never answers: waiting for delivery
reports must not make the next due message late."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import redis
from confluent_kafka import Producer

from blackbox.clock import now_ms
from blackbox.dev.servers import KafkaBroker, RedisServer, free_port
from blackbox.firing.dispatcher import FIRE_AHEAD_MS, Dispatcher
from blackbox.firing.retry import RetryPolicy
from blackbox.firing.shares import Share
from blackbox.kafka import clients
from blackbox.kafka.outbox import Outbox
from blackbox.metrics import Metrics
from blackbox.schedule import Schedule
from blackbox.storage.applying import IntakeSlice
from blackbox.storage.keys import Layout
from blackbox.storage.store import RedisStore
from tests.kafkatools import TopicReader, unique

POLICY = RetryPolicy(batch_limit=100, lease_ms=30_000, max_attempts=3, backoff_ms=100,
                     backoff_max_ms=1000, dlq_topic="dlq", events_topic="events")  # fmt: skip
REPORT_WAIT_S = 20.0


@pytest.fixture
def store(redis_server: RedisServer) -> Iterator[RedisStore]:
    client = redis.Redis.from_url(redis_server.url)
    yield RedisStore(client, Layout(unique("ns")), grace_seconds=60)
    client.close()


def _two_due(store: RedisStore, second_in_ms: int) -> tuple[Schedule, Schedule]:
    """One schedule due now, another `second_in_ms` from now."""
    now = now_ms()
    first = Schedule("in:0:0", "orders", b"a", now - 1)
    second = Schedule("in:0:1", "orders", b"b", now + second_in_ms)
    store.apply([IntakeSlice("in", 0, 1, [(0, first), (1, second)])], now)
    return first, second


@pytest.fixture
def silent_producer() -> Iterator[Producer]:
    """A producer whose broker accepts connections and never answers: no report comes."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        producer = Producer({"bootstrap.servers": f"127.0.0.1:{silent.getsockname()[1]}",
                             "message.timeout.ms": 60_000})  # fmt: skip
        yield producer
        producer.purge()
        producer.close()  # before its broker goes: no reconnecting to a closed port


def test_a_broker_slow_to_acknowledge_does_not_hold_back_the_next_due_time(
    store: RedisStore, silent_producer: Producer
) -> None:
    """Guarantee 6 (on time): with one batch sent and unacknowledged, fire_due returns in
    time for the next due message instead of waiting out the report deadline; the batch
    stays in flight, to be settled on a later run."""
    _, second = _two_due(store, 1000)
    dispatcher = Dispatcher(store, Outbox(silent_producer, REPORT_WAIT_S), POLICY, Metrics())

    started = time.monotonic()
    fired = dispatcher.fire_due(threading.Event())
    waited_s = time.monotonic() - started

    assert fired.next_due_ms == second.due_ms
    assert waited_s < REPORT_WAIT_S / 4  # back by the next due time, not the report deadline
    assert store.counts() == (1, 1)  # the first is still in flight, unsettled


def test_a_nudge_ends_the_wait_for_reports(store: RedisStore, silent_producer: Producer) -> None:
    """Guarantee 6: a schedule due now, stored while the dispatcher waits for reports with
    the next due time a minute away, is not held back by the wait."""
    _two_due(store, 60_000)
    dispatcher = Dispatcher(store, Outbox(silent_producer, REPORT_WAIT_S), POLICY, Metrics())
    arrives_ms = now_ms() + 300

    started = time.monotonic()
    dispatcher.fire_due(threading.Event(), lambda: arrives_ms if now_ms() >= arrives_ms else None)

    assert time.monotonic() - started < REPORT_WAIT_S / 4
    assert store.counts() == (1, 1)


def test_a_batch_reported_before_the_next_due_time_is_acked_in_the_same_run(
    store: RedisStore, broker: KafkaBroker
) -> None:
    """Guarantee 1 (what a crash delivers again): with the next message due 40 ms after
    the firing window, the run waits for the broker's report on what it sent and
    acknowledges it in Redis then, not at a later due instant; a kill in between would
    deliver it twice. It may return with the batch unsettled only once the next due time
    is a few ms away."""
    clients.ensure_topics({"bootstrap.servers": broker.bootstrap}, ["orders"])
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    producer.list_topics("orders", timeout=10)  # the report then waits on the broker alone
    _, second = _two_due(store, FIRE_AHEAD_MS + 40)
    dispatcher = Dispatcher(store, Outbox(producer, REPORT_WAIT_S), POLICY, Metrics())

    fired = dispatcher.fire_due(threading.Event())
    returned_ms = now_ms()

    assert fired.next_due_ms == second.due_ms
    acked = store.counts() == (1, 0) and fired.delivered == 1
    assert acked or returned_ms >= second.due_ms - 10  # unsettled: no report came in time
    producer.flush(10)


def test_reports_missing_past_their_deadline_are_retried_though_nothing_is_due(
    store: RedisStore, silent_producer: Producer
) -> None:
    """Guarantee 1: waiting only until the next due time never outlasts a batch's report
    deadline; what got no report goes back to due, counted as an attempt."""
    first, _ = _two_due(store, 60_000)
    dispatcher = Dispatcher(store, Outbox(silent_producer, 1.0), POLICY, Metrics())

    started = time.monotonic()
    dispatcher.fire_due(threading.Event())

    assert time.monotonic() - started < REPORT_WAIT_S / 4
    assert store.counts() == (2, 0)
    assert store.client.hget(store.layout.shards[0].attempts, first.id) == b"1"


def test_many_unacknowledged_batches_do_not_hold_back_the_next_one(
    store: RedisStore, silent_producer: Producer
) -> None:
    """Guarantee 6: steady firing sends batches of one as each message falls due; with many
    of them sent and not yet acknowledged, the next is still sent at once, not after the
    oldest batch's report deadline."""
    now = now_ms()
    steady = [(o, Schedule(f"in:0:{o}", "orders", b"m", now + 10 * o)) for o in range(12)]
    later = Schedule("in:0:12", "orders", b"later", now + 300)  # the last run waits for it
    store.apply([IntakeSlice("in", 0, 12, [*steady, (12, later)])], now)
    dispatcher = Dispatcher(store, Outbox(silent_producer, REPORT_WAIT_S), POLICY, Metrics())

    started = time.monotonic()
    while store.counts()[1] < len(steady) and time.monotonic() - started < REPORT_WAIT_S:
        dispatcher.fire_due(threading.Event())  # each run sends what fell due since the last

    assert time.monotonic() - started < REPORT_WAIT_S / 4
    assert store.counts() == (1, 12)  # all twelve sent, in flight, unsettled


def _id_in(layout: Layout, shard: int, prefix: str) -> str:
    return next(f"{prefix}:{n}" for n in range(100) if layout.shard_of(f"{prefix}:{n}") == shard)


def test_a_sweep_leases_from_the_claim_not_from_its_cutoff(
    redis_server: RedisServer, silent_producer: Producer
) -> None:
    """Guarantee 3: an id another replica's sweep claims is leased for the full lease from
    the moment of the claim. (A lease counted from the sweep's cutoff, now minus the sweep
    delay, had already run out with a sweep delay as long as the lease: the owner's reclaim
    put the id back while the sweeper was still sending it.)"""
    client = redis.Redis.from_url(redis_server.url)
    layout = Layout(unique("ns"), 2)
    store = RedisStore(client, layout, grace_seconds=600)
    share = Share(layout, sweep_after_ms=POLICY.lease_ms)
    client.zadd(layout.members, {"~other": now_ms() + 60_000})  # ranks after this replica
    share.beat(client, now_ms(), 60_000)
    assert share.owned == [0]
    now = now_ms()
    swept = Schedule(_id_in(layout, 1, "in:0"), "orders", b"late", now - POLICY.lease_ms - 1000)
    later = Schedule(_id_in(layout, 0, "in:1"), "orders", b"later", now + 60_000)
    store.apply([IntakeSlice("in", 0, 1, [(0, swept)]), IntakeSlice("in", 1, 1, [(0, later)])], now)
    outbox = Outbox(silent_producer, REPORT_WAIT_S)
    dispatcher = Dispatcher(store, outbox, POLICY, Metrics(), share)

    dispatcher.fire_due(threading.Event(), now_ms, sweep=True)  # returns with it unsettled

    lease_until = client.zscore(layout.shards[1].in_flight, swept.id)
    assert lease_until is not None
    assert lease_until >= now + POLICY.lease_ms
    client.close()


class _CountingConnection(redis.Connection):
    """A connection that counts what it sends: one send is one round trip to Redis."""

    sends = 0

    def send_packed_command(self, command: object, check_health: bool = True) -> None:
        type(self).sends += 1
        super().send_packed_command(command, check_health)  # type: ignore[no-untyped-call]


def _due_in_every_shard(store: RedisStore, later_ms: int) -> None:
    """One schedule due now in every shard, and one more due `later_ms` from now."""
    now = now_ms()
    layout = store.layout
    due = [Schedule(_id_in(layout, s, f"in:{s}"), "orders", b"v", now - 1)
           for s in range(layout.count)]  # fmt: skip
    due.append(Schedule("in:99:0", "orders", b"later", now + later_ms))
    store.apply([IntakeSlice("in", n, 0, [(0, s)]) for n, s in enumerate(due)], now)


@pytest.fixture
def counted(redis_server: RedisServer) -> Iterator[RedisStore]:
    """A store of 16 shards whose client counts its round trips, its scripts loaded."""
    pool = redis.ConnectionPool.from_url(redis_server.url, connection_class=_CountingConnection)
    client = redis.Redis(connection_pool=pool)
    store = RedisStore(client, Layout(unique("ns"), 16), grace_seconds=60)
    empty = store.claim_due(now_ms(), 1, 1000)  # loads the claim script
    store.ack(["none"], empty.token)  # and the ack script
    yield store
    client.close()


def test_shards_due_at_one_instant_are_claimed_in_one_round_trip(
    counted: RedisStore, silent_producer: Producer
) -> None:
    """Many shards cost what one does: a message due now in each of 16 shards is claimed
    in one round trip to Redis, not one per shard (16 were a waker's work at every due
    instant, and the default count's steady lateness several times one shard's)."""
    _due_in_every_shard(counted, later_ms=200)
    dispatcher = Dispatcher(counted, Outbox(silent_producer, REPORT_WAIT_S), POLICY, Metrics())
    before = _CountingConnection.sends

    dispatcher.fire_due(threading.Event())

    assert _CountingConnection.sends - before == 1
    assert counted.counts() == (1, 16)  # all sixteen claimed and sent, unsettled


def test_batches_reported_together_are_acked_in_one_round_trip(
    counted: RedisStore, broker: KafkaBroker
) -> None:
    """Many shards cost what one does: the batches of 16 shards, reported at once, are
    claimed in one round trip and acknowledged together, not one round trip per shard."""
    clients.ensure_topics({"bootstrap.servers": broker.bootstrap}, ["orders"])
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    _due_in_every_shard(counted, later_ms=600_000)
    dispatcher = Dispatcher(counted, Outbox(producer, REPORT_WAIT_S), POLICY, Metrics())
    before = _CountingConnection.sends

    fired = dispatcher.fire_due(threading.Event())

    assert fired.delivered == 16
    assert counted.counts() == (1, 0)
    # One claim, then acks grouped as the broker's reports come in: one or two on a quiet
    # machine, a few more when the reports straggle (past 9 once, in a loaded CI run);
    # one per shard would make 17.
    assert _CountingConnection.sends - before <= 12
    producer.flush(10)


def _commands(client: redis.Redis) -> int:
    """Commands Redis has run so far (those inside scripts counted), INFO itself left out."""
    stats: dict[str, dict[str, int]] = client.info("commandstats")
    return sum(int(s["calls"]) for name, s in stats.items() if name != "cmdstat_info")


def _idle_dispatcher(
    redis_server: RedisServer, producer: Producer, shards: int = 16
) -> tuple[Dispatcher, RedisStore]:
    """A dispatcher of `shards` shards, leases known for half a lease, after its first tick."""
    client = redis.Redis.from_url(redis_server.url)
    layout = Layout(unique("ns"), shards)
    store = RedisStore(client, layout, grace_seconds=60)
    share = Share(layout, refresh_ms=POLICY.lease_ms // 2)
    dispatcher = Dispatcher(store, Outbox(producer, REPORT_WAIT_S), POLICY, Metrics(), share)
    dispatcher.reclaim_expired()
    dispatcher.fire_due(threading.Event(), sweep=True)
    return dispatcher, store


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of the test's own: its command counts are this test's alone (the
    session's server may be serving what another test left running)."""
    server = RedisServer(free_port(), tmp_path)
    server.start()
    yield server
    server.stop()


def test_an_idle_tick_looks_at_every_shard_in_one_command(
    own_redis: RedisServer, silent_producer: Producer
) -> None:
    """Many shards cost what one does at idle (issue 40): with nothing pending, a tick's
    reclaim and sweep of 16 shards cost one script running one command, not a reclaim (2
    commands) and a claim (3) per shard."""
    dispatcher, store = _idle_dispatcher(own_redis, silent_producer)
    before = _commands(store.client)  # type: ignore[arg-type]

    dispatcher.reclaim_expired()
    dispatcher.fire_due(threading.Event(), sweep=True)

    assert _commands(store.client) - before == 2  # type: ignore[arg-type]
    store.client.close()


def test_a_due_id_no_nudge_announced_is_fired_by_the_next_sweep(
    redis_server: RedisServer, silent_producer: Producer
) -> None:
    """Guarantee 1, a published nudge lost: an id stored without any nudge in a shard the
    dispatcher knows as empty is not claimed by the waker's run, and is by the tick's
    sweep (a poll interval at most)."""
    dispatcher, store = _idle_dispatcher(redis_server, silent_producer)
    now = now_ms()
    lost = Schedule(_id_in(store.layout, 5, "in:0"), "orders", b"unannounced", now - 1)
    later = Schedule(_id_in(store.layout, 5, "in:1"), "orders", b"later", now + 60_000)
    store.apply([IntakeSlice("in", 0, 1, [(0, lost), (1, later)])], now)

    dispatcher.fire_due(threading.Event())
    assert store.counts() == (2, 0)  # the waker knows shard 5 as empty
    dispatcher.fire_due(threading.Event(), now_ms, sweep=True)  # returns with it unsettled
    assert store.counts() == (1, 1)  # claimed and sent (the broker never reports)
    store.client.close()


def test_a_lease_left_in_a_shard_known_as_empty_is_reclaimed_once_it_runs_out(
    redis_server: RedisServer, silent_producer: Producer
) -> None:
    """Guarantee 3: a lease another process took in an owned shard after the dispatcher
    last looked (a sweep, then the process died) is reclaimed at the first tick after it
    ran out, though no claim of the dispatcher's told of it: what is known of a shard's
    leases is looked at again after half a lease."""
    lease_ms, tick_s = 1_200, 0.05
    policy = replace(POLICY, lease_ms=lease_ms)
    client = redis.Redis.from_url(redis_server.url)
    layout = Layout(unique("ns"), 4)
    store = RedisStore(client, layout, grace_seconds=60)
    share = Share(layout, refresh_ms=lease_ms // 2)
    dispatcher = Dispatcher(store, Outbox(silent_producer, REPORT_WAIT_S), policy, Metrics(), share)
    dispatcher.reclaim_expired()
    dispatcher.fire_due(threading.Event(), sweep=True)  # all four known as empty
    now = now_ms()
    left = Schedule(_id_in(layout, 2, "in:0"), "orders", b"orphan", now - 1)
    store.apply([IntakeSlice("in", 0, 0, [(0, left)])], now)
    dead = store.claim_due(now_ms(), 10, lease_ms, 2)  # the other process, then it died
    assert dead.ids == [left.id]

    deadline = time.monotonic() + 5
    while not dispatcher.reclaim_expired():
        assert time.monotonic() < deadline, "never reclaimed"
        time.sleep(tick_s)

    # Not before it ran out, and not a whole lease after (the tick was every 50 ms).
    assert dead.token <= now_ms() <= dead.token + lease_ms
    assert store.counts() == (1, 0)
    client.close()


def _fire_until_settled(dispatcher: Dispatcher, store: RedisStore, timeout: float) -> None:
    """Run the dispatcher as the waker does, at each instant it asks to be woken, until
    nothing is due or in flight."""
    stop, deadline = threading.Event(), time.monotonic() + timeout
    while store.counts() != (0, 0) and time.monotonic() < deadline:
        fired = dispatcher.fire_due(stop)
        wake_ms = fired.wake_ms if fired.wake_ms is not None else now_ms() + 50
        stop.wait(max(0.0, (wake_ms - now_ms()) / 1000))


def test_a_window_is_claimed_once_and_each_delivery_leaves_at_its_due_instant(
    store: RedisStore, broker: KafkaBroker
) -> None:
    """Guarantee 6 (on time, never early): schedules falling due within one firing window
    are taken by one claim (a steady stream pays a claim per window, not per message), and
    each is handed to the producer at its own due instant: its record's create time is at
    or after its due time, and within a few ms of it."""
    topic = unique("window")
    clients.ensure_topics({"bootstrap.servers": broker.bootstrap}, [topic])
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    producer.list_topics(topic, timeout=10)
    now = now_ms()
    window = [(o, Schedule(f"in:0:{o}", topic, str(o).encode(), now + 300 + 3 * o))
              for o in range(5)]  # fmt: skip
    store.apply([IntakeSlice("in", 0, 4, window)], now)
    dispatcher = Dispatcher(store, Outbox(producer, REPORT_WAIT_S), POLICY, Metrics())
    dispatcher.fire_due(threading.Event())  # nothing due within a window yet: learns when
    claims = dispatcher.claims

    _fire_until_settled(dispatcher, store, REPORT_WAIT_S)
    reader = TopicReader(broker.bootstrap, topic)
    records = reader.wait_count(len(window))
    reader.close()

    assert dispatcher.claims == claims + 1
    due_of = {s.id: s.due_ms for _, s in window}
    early = [(r.header("blackbox-id"), r.created_ms - due_of[r.header("blackbox-id")])
             for r in records if r.created_ms < due_of[r.header("blackbox-id")]]  # fmt: skip
    assert early == []
    assert sorted(r.created_ms for r in records) == [r.created_ms for r in records]
    producer.flush(10)


def test_stopping_within_a_window_returns_what_is_not_due_yet_unproduced(
    store: RedisStore, broker: KafkaBroker
) -> None:
    """Guarantee 1 and 6: a process told to stop while it releases a claimed window
    produces nothing before its due time; what was not due yet goes back to due at its own
    time, with no attempt counted, for whoever fires next."""
    topic = unique("stopped")
    clients.ensure_topics({"bootstrap.servers": broker.bootstrap}, [topic])
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    now = now_ms()
    first = Schedule("in:0:0", topic, b"now", now - 1)
    later = Schedule("in:0:1", topic, b"later", now + 5_000)
    store.apply([IntakeSlice("in", 0, 1, [(0, first), (1, later)])], now)
    dispatcher = Dispatcher(store, Outbox(producer, REPORT_WAIT_S), POLICY, Metrics())
    dispatcher.ahead_ms = 10_000  # both in one claim
    stop = threading.Event()
    firing = threading.Thread(target=dispatcher.fire_due, args=(stop,))
    reader = TopicReader(broker.bootstrap, topic)

    firing.start()
    reader.wait_count(1)  # the first left; the other waits for its due time
    stop.set()
    firing.join(10)
    dispatcher.settle_all(threading.Event())

    assert not firing.is_alive()
    assert [r.value for r in reader.read_to_end()] == [b"now"]
    reader.close()
    shard = store.layout.shards[0]
    assert store.client.zscore(shard.due, later.id) == later.due_ms
    assert store.client.zscore(shard.in_flight, later.id) is None
    assert store.client.hget(shard.attempts, later.id) is None
    producer.flush(10)


def test_a_message_stored_while_a_window_is_held_leaves_at_its_own_due_time(
    store: RedisStore, broker: KafkaBroker
) -> None:
    """Guarantee 6: a schedule stored after a window was claimed and due before that
    window's deliveries (a short countdown) is not held back behind them: the nudge that
    announces it has it claimed just before its due time, and it leaves then, at or
    after its due instant and well before the held ones."""
    topic = unique("nudged")
    clients.ensure_topics({"bootstrap.servers": broker.bootstrap}, [topic])
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    producer.list_topics(topic, timeout=10)
    dispatcher = Dispatcher(store, Outbox(producer, REPORT_WAIT_S), POLICY, Metrics())
    dispatcher.ahead_ms = 5_000
    now = now_ms()
    held = Schedule("in:0:0", topic, b"held", now + 2_000)
    store.apply([IntakeSlice("in", 0, 0, [(0, held)])], now)
    dispatcher.fire_due(threading.Event())  # claims the window: `held` waits in the process
    assert dispatcher.held_due_ms() == held.due_ms
    short = Schedule("in:0:1", topic, b"short", now_ms() + 300)
    store.apply([IntakeSlice("in", 0, 1, [(1, short)])], now_ms())
    dispatcher.share.nudged(0, short.due_ms)  # what intake tells the firing part

    _fire_until_settled(dispatcher, store, REPORT_WAIT_S)
    reader = TopicReader(broker.bootstrap, topic)
    records = {r.value: r for r in reader.wait_count(2)}
    reader.close()

    assert short.due_ms <= records[b"short"].created_ms < short.due_ms + 200
    assert records[b"held"].created_ms >= held.due_ms
    producer.flush(10)
