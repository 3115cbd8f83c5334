"""Releases upgrade in place (guarantee 11), on real processes: the previous release
(tests/releases.py, a commit of main) and this one on one Redis and one Kafka, with the same
namespace, group and topics.

- What the previous release stored, this one delivers: schedules of every kind accepted by
  the previous release, which then stops (SIGTERM, or SIGKILL with ids in flight), are
  delivered by this one, once, under the ids the previous release gave them.
- A rolling upgrade under load (as `helm upgrade` with `maxSurge: 1`) loses nothing.
- Going back one release: what this release stored, the previous one delivers.
- What an operator meets: a watermark the previous release left far behind (it moved a
  shard's mark only in polls holding a request for that shard) stops intake of the
  partition at this release's first start, until it is read again.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import pytest
import redis
from confluent_kafka import KafkaError, Producer

from blackbox.dev.servers import KafkaBroker, RedisServer
from blackbox.envelope import CALLER_HEADER
from blackbox.intake.incarnations import tag_of
from blackbox.kafka import clients
from blackbox.schedule import scoped_id
from blackbox.settings import Settings
from blackbox.storage.keys import Layout
from blackbox.storage.shardcount import DEFAULT_SHARDS
from tests.integration.conftest import ReaderFactory, service_env
from tests.kafkatools import Received, TopicReader, produce, unique, wait_until
from tests.releases import PREVIOUS_RELEASE, RELEASES, ReleaseUnavailable, Replica, extract

CALLER = b"billing"
TOKEN = "upgrade-test-token-0123456789"  # noqa: S105 - a test token
LATER = 20.0  # s: schedules left pending for the next release, due after the switch
# A burst due while the first release runs, in waves 1 s apart, to stop it mid-delivery.
BURST, WAVES, WAVE_SIZE = 4.0, 4, 15
BURST_SIZE = WAVES * WAVE_SIZE
EVERY, LIMIT = 2, 8  # the running series: an occurrence every 2 s, 8 in all
ATTEMPTS = 6  # of the delivery to a missing topic: some by each release
# Both releases read the same settings: deliveries to a missing topic fail (no automatic
# creation, known missing within 0.5 s) and are retried 1, 2, 4, 4, 4 s apart; a killed
# replica's leases end within 9 s.
SETTINGS = {
    "KAFKA_PRODUCER_ALLOW_AUTO_CREATE_TOPICS": "false",
    "KAFKA_PRODUCER_TOPIC_METADATA_PROPAGATION_MAX_MS": "500",
    "BLACKBOX_MAX_ATTEMPTS": str(ATTEMPTS),
    "BLACKBOX_RETRY_BACKOFF": "1",
    "BLACKBOX_RETRY_BACKOFF_MAX": "4",
    "BLACKBOX_DELIVERY_TIMEOUT": "4",
    "BLACKBOX_LEASE_SECONDS": "9",
    "BLACKBOX_API_TOKEN": TOKEN,
}
READY_S = 90.0  # a replica's start on a loaded 2-core machine


def _tree(commit: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A release's tree, extracted from git; the test skips where the clone cannot give
    it (a shallow clone), and says why."""
    try:
        return extract(commit, tmp_path_factory.mktemp("release"))
    except ReleaseUnavailable as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def previous_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The previous release's tree."""
    return _tree(PREVIOUS_RELEASE, tmp_path_factory)


@pytest.fixture(scope="module")
def first_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """0.1.0's tree: the release whose watermarks could lie far behind."""
    return _tree(RELEASES["0.1.0"], tmp_path_factory)


class Fleet:
    """The replicas of one test, of either release, stopped at its end; and what Redis
    holds of the namespace."""

    def __init__(self, env: dict[str, str], logs: Path, previous: Path, redis_url: str) -> None:
        self.env, self.logs, self.previous = env, logs, previous
        self.replicas: list[Replica] = []
        self.client = redis.Redis.from_url(redis_url)
        self.layout = Layout(env["BLACKBOX_NAMESPACE"], DEFAULT_SHARDS)

    def start(
        self, release: str, overrides: Mapping[str, str] | None = None, *, ready: bool = True
    ) -> Replica:
        """A replica of "previous" or "this" release with the fleet's settings and
        `overrides`, once ready (unless `ready` is False)."""
        tree = self.previous if release == "previous" else None
        log = self.logs / f"{release}-{len(self.replicas)}.log"
        replica = Replica({**self.env, **(overrides or {})}, log, tree)
        self.replicas.append(replica)
        if ready:
            wait_until(replica.ready, READY_S, f"{replica} ready")
        return replica

    def in_flight(self) -> set[str]:
        """Every id claimed and not yet acknowledged, in any shard."""
        pipe = self.client.pipeline(transaction=False)
        for keys in self.layout.shards:
            pipe.zrange(keys.in_flight, 0, -1)
        return {i.decode() for found in pipe.execute() for i in found}

    def attempts(self, blackbox_id: str) -> int:
        """Failed or interrupted delivery attempts of an id."""
        return int(self.client.hget(self.layout.keys_of(blackbox_id).attempts, blackbox_id) or 0)

    def close(self) -> None:
        for replica in self.replicas:
            if replica.process.process.poll() is None:
                replica.kill()
        self.client.close()


@pytest.fixture
def fleet(
    redis_server: RedisServer, broker: KafkaBroker, previous_tree: Path, tmp_path: Path
) -> Iterator[Fleet]:
    env = service_env(redis_server.url, broker.bootstrap, **SETTINGS)
    started = Fleet(env, tmp_path, previous_tree, redis_server.url)
    yield started
    started.close()


@dataclass
class Sent:
    """What a test sent to the intake topic: each record's offset by its name."""

    intake: str
    tag: str
    offsets: dict[str, int] = field(default_factory=dict)

    def origin(self, name: str) -> str:
        """The intake coordinates a record's schedule is known by (its id, or its version)."""
        return f"{self.intake}:0:{self.offsets[name]}:{self.tag}"


def _every_kind(fleet: Fleet, target: str, missing: str) -> Sent:
    """One-offs with and without ids, updates, cancels, a reschedule, a series running and
    one paused, a burst due soon and a delivery to a topic that does not exist."""
    settings = Settings.from_env(fleet.env)
    intake = settings.intake_topic
    topic_id = clients.topic_id_lookup(settings.kafka)([intake])[intake]
    sent = Sent(intake, tag_of(topic_id))
    plain = [
        *((f"early-{n}", {"topic": target, "message": f"early-{n}", "countdown": 0})
          for n in range(5)),
        *((f"late-{n}", {"topic": target, "message": f"late-{n}", "countdown": LATER})
          for n in range(5)),
        *((f"burst-{n}", {"topic": target, "message": f"burst-{n}",
                          "countdown": BURST + n // WAVE_SIZE}) for n in range(BURST_SIZE)),
    ]  # fmt: skip
    own = [
        *((f"o-{n} v1", {"id": f"o-{n}", "topic": target, "message": f"o-{n} v1",
                         "countdown": LATER}) for n in range(4)),
        *((f"o-{n} v2", {"id": f"o-{n}", "topic": target, "message": f"o-{n} v2",
                         "countdown": LATER}) for n in range(2)),
        *((f"c-{n}", {"id": f"c-{n}", "topic": target, "message": f"c-{n}", "countdown": LATER})
          for n in range(2)),
        *((f"cancel c-{n}", {"id": f"c-{n}", "cancel": True}) for n in range(2)),
        ("r-0", {"id": "r-0", "topic": target, "message": "r-0", "countdown": 600}),
        ("move r-0", {"id": "r-0", "reschedule": True, "countdown": LATER}),
        ("s-run", {"id": "s-run", "topic": target, "message": "s-run", "every": EVERY,
                   "limit": LIMIT, "missed": "all"}),
        ("s-held", {"id": "s-held", "topic": target, "message": "s-held", "every": EVERY,
                    "start": time.time() + 5}),
        ("pause s-held", {"id": "s-held", "pause": True}),
        ("x-0", {"id": "x-0", "topic": missing, "message": "x-0", "countdown": 0}),
    ]  # fmt: skip
    bootstrap = settings.kafka["bootstrap.servers"]
    for batch, headers in ((plain, []), (own, [(CALLER_HEADER, CALLER)])):
        for name, _ in batch:
            sent.offsets[name] = len(sent.offsets)
        produce(bootstrap, intake, [orjson.dumps(doc) for _, doc in batch], headers=headers)
    return sent


def _bodies(records: list[Received]) -> Counter[str]:
    return Counter((r.value or b"").decode() for r in records)


def _burst_claimed(fleet: Fleet, sent: Sent) -> bool:
    """Whether ids of the burst are claimed and not yet acknowledged."""
    return any(i.startswith(f"{sent.intake}:") for i in fleet.in_flight())


def _catch_burst(fleet: Fleet, sent: Sent) -> None:
    """Return at an instant the burst is being delivered (a claim lasts milliseconds: Redis
    is asked every 2 ms), failing once the last wave is over."""
    deadline = time.monotonic() + BURST + WAVES + 30
    while time.monotonic() < deadline:
        if _burst_claimed(fleet, sent):
            return
        time.sleep(0.002)
    raise AssertionError("never saw the burst in flight")


def _kill_holding_claims(fleet: Fleet, replica: Replica, sent: Sent) -> set[str]:
    """SIGKILL `replica` at an instant it holds claimed ids of the burst (frozen first, so
    they are still held when looked at); every id in flight at the kill."""
    for _ in range(100):
        _catch_burst(fleet, sent)
        replica.freeze()
        if _burst_claimed(fleet, sent):
            held = fleet.in_flight()
            replica.kill()
            return held
        replica.thaw()
    raise AssertionError("the first release never held a claim of the burst when frozen")


@dataclass
class Switch:
    """What happened around the switch of releases."""

    stopped_ms: int  # when the first release had exited
    in_flight: set[str]  # ids claimed by the first release when it was killed
    attempts_before: int  # of the delivery to the missing topic, by the first release


def _stop_first(fleet: Fleet, first: Replica, sent: Sent, *, kill: bool) -> Switch:
    """Once the delivery to the missing topic failed, stop the first release while the burst
    is being delivered: SIGTERM, or SIGKILL while it holds claims."""
    missing_id = scoped_id(CALLER, "x-0")
    wait_until(lambda: fleet.attempts(missing_id) >= 1, 30, "a failed delivery attempt of x-0")
    if kill:
        in_flight = _kill_holding_claims(fleet, first, sent)
        assert fleet.client.hlen(fleet.layout.intake_handling) > 0  # its crash notes, left
    else:
        in_flight = set()
        _catch_burst(fleet, sent)
        assert first.terminate() == 0, first.output()[-3000:]
    attempts = fleet.attempts(missing_id)
    assert 1 <= attempts < ATTEMPTS, attempts
    return Switch(int(time.time() * 1000), in_flight, attempts)


def _switch_releases(fleet: Fleet, reader: ReaderFactory, first: str, then: str,
                     *, kill: bool = False) -> None:  # fmt: skip
    """The first release accepts schedules of every kind and fires what is due early; it
    stops; the other release starts on the same Redis and Kafka and delivers the rest."""
    settings = Settings.from_env(fleet.env)
    target, missing = unique("target"), unique("missing")
    clients.ensure_topics(settings.kafka, [*settings.own_topics, target])
    delivered, dead = reader(target), reader(settings.dlq_topic)
    # Killed, the first release has committed nothing: the next one reads every record again.
    uncommitted = {"KAFKA_CONSUMER_AUTO_COMMIT_INTERVAL_MS": "3600000"} if kill else {}
    before = fleet.start(first, uncommitted)
    _check_release(before)
    sent = _every_kind(fleet, target, missing)
    delivered.wait_for(lambda r: sum(_bodies(r)[f"early-{n}"] for n in range(5)) == 5
                       and _bodies(r)["s-run"] >= 2, timeout=30)  # fmt: skip
    cursor = _first_page_cursor(before)
    switch = _stop_first(fleet, before, sent, kill=kill)
    after = fleet.start(then)
    _check_release(after)
    _check_cursor_honoured(after, cursor)
    delivered.wait_for(lambda r: _all_arrived(_bodies(r)), timeout=LATER + 60)
    dead.wait_for(lambda r: len(r) >= 1, timeout=60)
    resumed_ms = _resume_held(settings)
    delivered.wait_for(lambda r: _bodies(r)["s-held"] >= 1, timeout=30)
    records = delivered.read_to_end()
    _check_delivered(sent, records, switch, resumed_ms)
    _check_dead_letter(dead.read_to_end())
    reread = _check_nothing_stored_anew(after, sent, kill=kill)
    copies = len(records) - len(
        {(r.value, r.headers.get("blackbox-occurrence-ms")) for r in records}
    )
    _show(f"{first} -> {then} ({'SIGKILL' if kill else 'SIGTERM'}): {len(switch.in_flight)} "
          f"in flight at the kill, {copies} copies, x-0 attempts {switch.attempts_before} of "
          f"{ATTEMPTS} before the switch, {reread:.0f} records read again as applied")  # fmt: skip


def _resume_held(settings: Settings) -> int:
    """Resume the paused series through the intake; the instant it was sent."""
    resume = orjson.dumps({"id": "s-held", "resume": True})
    produce(settings.kafka["bootstrap.servers"], settings.intake_topic, [resume],
            headers=[(CALLER_HEADER, CALLER)])  # fmt: skip
    return int(time.time() * 1000)


def _check_nothing_stored_anew(after: Replica, sent: Sent, *, kill: bool) -> float:
    """The next release stored nothing anew from what the first one had read (after a kill
    it read every record again, each found applied); how many it read again."""
    assert after.ready()
    if after.release == "this":
        assert after.metric("blackbox_intake_stopped_partitions") == 0
    records = {outcome: after.metric("blackbox_intake_records_total", {"outcome": outcome}) or 0
               for outcome in ("scheduled", "updated", "duplicate")}  # fmt: skip
    assert records["scheduled"] == records["updated"] == 0, records
    if kill:  # (the two cancels read again are answered again, as cancelled)
        assert records["duplicate"] >= len(sent.offsets) - 2, records
    return records["duplicate"]


def _show(line: str) -> None:
    """Report a figure of the run (shown under `pytest -s`)."""
    print(line)  # noqa: T201 - what each switch met


def _check_release(replica: Replica) -> None:
    """The replica runs the release it was started as (both read the version of the
    package installed, so by what it counts): the previous one counts no gap of records
    Kafka no longer holds (added since)."""
    gauge = replica.metric("blackbox_redis_gaps_total", {"kind": "aged_out"})
    assert (gauge is None) == (replica.release == "previous"), (replica, gauge)


EXPECTED_ONCE = (
    *(f"late-{n}" for n in range(5)), "o-0 v2", "o-1 v2", "o-2 v1", "o-3 v1", "r-0",
)  # fmt: skip
NEVER = ("o-0 v1", "o-1 v1", "c-0", "c-1")


def _all_arrived(bodies: Counter[str]) -> bool:
    return (
        all(bodies[b] >= 1 for b in EXPECTED_ONCE)
        and all(bodies[f"burst-{n}"] >= 1 for n in range(BURST_SIZE))
        and bodies["s-run"] >= LIMIT
    )


def _first_page_cursor(replica: Replica) -> str:
    page = replica.get("/api/v1/schedules?limit=1", TOKEN)
    assert page.status_code == 200, page.text
    cursor = page.json()["cursor"]
    assert isinstance(cursor, str)
    return cursor


def _check_cursor_honoured(replica: Replica, cursor: str) -> None:
    """A listing cursor of the other release goes on where it left off: both seal their
    cursors alike (0.1.0's were refused, 400)."""
    answer = replica.get(f"/api/v1/schedules?limit=1&cursor={cursor}", TOKEN)
    assert answer.status_code == 200, answer.text
    assert replica.get("/api/v1/schedules?limit=1", TOKEN).status_code == 200


def _check_delivered(sent: Sent, records: list[Received], switch: Switch, resumed_ms: int) -> None:
    """Every schedule once under the id the first release gave it (copies only of ids in
    flight at a kill, under the same id); what was pending fired by the next release."""
    bodies = _bodies(records)
    by_body: dict[str, list[Received]] = defaultdict(list)
    for record in records:
        by_body[(record.value or b"").decode()].append(record)
    for body in (*EXPECTED_ONCE, *(f"early-{n}" for n in range(5))):
        copies = by_body[body]
        ids = {r.header("blackbox-id") for r in copies}
        assert len(ids) == 1, (body, ids)
        assert len(copies) == 1 or ids <= switch.in_flight, (body, len(copies))
    for n in range(BURST_SIZE):
        copies = by_body[f"burst-{n}"]
        assert {r.header("blackbox-id") for r in copies} == {sent.origin(f"burst-{n}")}
        assert len(copies) == 1 or sent.origin(f"burst-{n}") in switch.in_flight
    for n in range(5):
        assert by_body[f"late-{n}"][0].header("blackbox-id") == sent.origin(f"late-{n}")
        assert by_body[f"early-{n}"][0].received_ms < switch.stopped_ms
    for name, version in (("o-0", "o-0 v2"), ("o-1", "o-1 v2"), ("o-2", "o-2 v1"),
                          ("o-3", "o-3 v1"), ("r-0", "r-0")):  # fmt: skip
        (record,) = {r.header("blackbox-version"): r for r in by_body[version]}.values()
        assert record.header("blackbox-id") == scoped_id(CALLER, name)
        assert record.header("blackbox-version") == sent.origin(version)
    for body in EXPECTED_ONCE:  # pending at the switch: the next release fired them
        assert all(r.received_ms > switch.stopped_ms for r in by_body[body]), body
    for body in NEVER:
        assert bodies[body] == 0, body
    _check_series(sent, by_body["s-run"], switch)
    held = by_body["s-held"]
    assert held and all(r.received_ms >= resumed_ms for r in held), "s-held fired while paused"


def _check_series(sent: Sent, records: list[Received], switch: Switch) -> None:
    """The running series: its limit in all, each occurrence once (a copy only if it was in
    flight at a kill), every 2 s, some by each release, under one id and version."""
    series_id = scoped_id(CALLER, "s-run")
    assert {r.header("blackbox-id") for r in records} == {series_id}
    assert {r.header("blackbox-version") for r in records} == {sent.origin("s-run")}
    occurrences = Counter(int(r.header("blackbox-occurrence-ms")) for r in records)
    assert len(occurrences) == LIMIT, sorted(occurrences)
    assert set(occurrences.values()) == {1} or series_id in switch.in_flight, occurrences
    ordered = sorted(occurrences)
    assert {b - a for a, b in itertools.pairwise(ordered)} == {EVERY * 1000}
    assert min(r.received_ms for r in records) < switch.stopped_ms
    assert max(r.received_ms for r in records) > switch.stopped_ms


def _check_dead_letter(records: list[Received]) -> None:
    """Only the delivery to the missing topic is dead-lettered, after all its attempts
    counted across both releases (no record set aside for the first one's death)."""
    (letter,) = records
    assert letter.header("blackbox-id") == scoped_id(CALLER, "x-0")
    assert letter.header("blackbox-dlq-reason") == "unknown_topic"
    assert f"after {ATTEMPTS} attempts" in letter.header("blackbox-dlq-detail")
    assert letter.value == b"x-0"


def test_what_the_previous_release_stored_is_delivered_after_a_sigterm(
    fleet: Fleet, reader: ReaderFactory
) -> None:
    """Guarantee 11 (what one release stored, the next delivers): the previous release
    accepts one-offs with and without ids, a pending update, a cancel, a reschedule, a
    series running and one paused, a burst and a delivery failing to a missing topic, and
    stops with SIGTERM while the burst is delivered; this release delivers every one once
    under the same blackbox-id and blackbox-version, the series to its limit with each
    occurrence once, the failing delivery dead-lettered after its attempts counted across
    both, and the paused series silent until resumed."""
    _switch_releases(fleet, reader, "previous", "this")


def test_what_the_previous_release_stored_is_delivered_after_a_sigkill(
    fleet: Fleet, reader: ReaderFactory
) -> None:
    """Guarantee 11, through a crash: as above, but the previous release is killed (SIGKILL)
    while it holds claimed ids, having committed no intake offset. This release reads every
    record again past the previous one's crash notes (none is stored twice or set aside as
    unreadable), fires what the dead replica held once its leases end, and delivers every
    schedule under the same blackbox-id and blackbox-version: a copy only of an id in flight
    at the kill."""
    _switch_releases(fleet, reader, "previous", "this", kill=True)


def test_going_back_one_release_delivers_what_this_release_stored(
    fleet: Fleet, reader: ReaderFactory
) -> None:
    """Guarantee 11, in reverse (a rollback): this release accepts schedules of every kind
    and stops with SIGTERM; the previous release, started on the same Redis and Kafka,
    delivers every one once under the same ids, with the series' count, the attempts and
    the paused series intact; the key this release added (the listing cursors' seal) is
    left alone, and a cursor sealed by one release is refused by the other with a 400."""
    _switch_releases(fleet, reader, "this", "previous")


RATE = 20  # schedules a second while the fleet rolls: a few hundred in all
STEP_DELIVERIES = 20  # delivered once only this release runs, at least
LEAST_SENT = 150  # sent in all, however fast the replicas start


class Load(threading.Thread):
    """Schedules produced at a steady rate until stopped, due 0.5 to 3 s ahead so that they
    are accepted and fire throughout: `m-N`, every other one a caller's id."""

    def __init__(self, bootstrap: str, intake: str, target: str) -> None:
        super().__init__(name="load", daemon=True)
        self.intake, self.target = intake, target
        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
        self.stopping = threading.Event()
        self.sent = 0
        self.failures: list[str] = []

    def _report(self, error: KafkaError | None, _message: object) -> None:
        if error is not None:
            self.failures.append(str(error))

    def run(self) -> None:
        next_at = time.monotonic()
        while not self.stopping.is_set():
            n = self.sent
            document: dict[str, object] = {"topic": self.target, "message": f"m-{n}",
                                            "countdown": 0.5 + (n % 6) / 2}  # fmt: skip
            headers: list[tuple[str, str | bytes | None]] = (
                [(CALLER_HEADER, CALLER)] if n % 2 else []
            )
            if n % 2:
                document["id"] = f"m-{n}"
            self.producer.produce(self.intake, orjson.dumps(document), headers=headers,
                                  on_delivery=self._report)  # fmt: skip
            self.producer.poll(0)
            self.sent += 1
            next_at += 1 / RATE
            self.stopping.wait(max(0.0, next_at - time.monotonic()))  # the pace, not a settle

    def stop(self) -> int:
        """Stop producing; how many were sent, each acknowledged by the broker."""
        self.stopping.set()
        self.join(30)
        assert self.producer.flush(30) == 0
        assert self.failures == []
        return self.sent


def _counter(replica: Replica, sample: str, labels: dict[str, str] | None = None) -> float:
    return replica.metric(sample, labels) or 0.0


def _both_fire(old: Replica, new: Replica) -> None:
    """Wait until each of the two replicas delivered more than it had: side by side, both
    fire their shares of the shards."""
    marks = {r: _counter(r, "blackbox_delivered_total") for r in (old, new)}
    wait_until(lambda: all(_counter(r, "blackbox_delivered_total") > marks[r] for r in marks),
               60, f"{old} and {new} both delivering")  # fmt: skip


def test_a_rolling_upgrade_under_load_loses_nothing(fleet: Fleet, reader: ReaderFactory) -> None:
    """Guarantee 11 (a rolling upgrade with both releases side by side loses nothing): two
    replicas of the previous release take schedules on two intake partitions and fire them
    while a producer sends 20 a second; as `helm upgrade` does with `maxSurge: 1`, a replica
    of this release starts, then an old one stops (SIGTERM), twice, each step waiting until
    both releases deliver. Then only this release runs: every schedule sent is delivered,
    each under one blackbox-id (a copy only under the same id), nothing dead-lettered."""
    settings = Settings.from_env(fleet.env)
    target = unique("rolled")
    clients.ensure_topics(settings.kafka, [settings.intake_topic], partitions=2)
    clients.ensure_topics(settings.kafka, [settings.dlq_topic, settings.events_topic, target])
    delivered = reader(target)
    olds = [fleet.start("previous") for _ in range(2)]
    load = Load(settings.kafka["bootstrap.servers"], settings.intake_topic, target)
    load.start()
    try:
        news = []
        for old in olds:
            news.append(fleet.start("this"))
            _both_fire(old, news[-1])
            assert old.terminate() == 0, old.output()[-3000:]
        _grows(delivered, STEP_DELIVERIES)
        wait_until(lambda: all(_counter(r, "blackbox_intake_records_total",
                                        {"outcome": "scheduled"}) > 0 for r in news),
                   60, "both new replicas taking intake records")  # fmt: skip
        wait_until(lambda: load.sent >= LEAST_SENT, 60, f"{LEAST_SENT} schedules sent")
    finally:
        sent = load.stop()
    wanted = {f"m-{n}" for n in range(sent)}
    delivered.wait_for(lambda r: wanted <= set(_bodies(r)), timeout=60)
    records = delivered.read_to_end()
    ids: dict[str, set[str]] = defaultdict(set)
    for record in records:
        ids[(record.value or b"").decode()].add(record.header("blackbox-id"))
    assert set(ids) == wanted  # 0 lost, nothing else
    assert all(len(found) == 1 for found in ids.values())  # copies only under the same id
    copies = len(records) - len(wanted)
    assert reader(settings.dlq_topic).read_to_end() == []
    _show(f"rolling upgrade: {sent} sent, {len(wanted)} delivered, {copies} copies; delivered "
          f"by each replica: {[_counter(r, 'blackbox_delivered_total') for r in news]} new, "
          "old ones stopped")  # fmt: skip


def _grows(target: TopicReader, count: int) -> None:
    """Wait until `count` more records arrived on the target topic."""
    before = len(target.records)
    target.wait_for(lambda r: len(r) >= before + count, timeout=60)


FLOOD = 60  # malformed records: twice the re-read limit below


def _id_off_shard_zero(fleet: Fleet, prefix: str) -> str:
    """A caller's id of `prefix` whose shard is not shard 0 (which a poll of refusals alone
    moves along)."""
    return next(f"{prefix}-{n}" for n in itertools.count()
                if fleet.layout.shard_of(scoped_id(CALLER, f"{prefix}-{n}")) != 0)  # fmt: skip


def _marks(fleet: Fleet, field: str) -> list[int | None]:
    """Every shard's watermark of one intake partition."""
    pipe = fleet.client.pipeline(transaction=False)
    for keys in fleet.layout.shards:
        pipe.hget(keys.intake_marks, field)
    return [None if mark is None else int(mark) for mark in pipe.execute()]


def test_a_mark_the_previous_release_left_behind_is_not_taken_for_lost_data(
    fleet: Fleet, reader: ReaderFactory, first_tree: Path
) -> None:
    """Guarantees 11 and 1, what an operator meets after upgrading from 0.1.0: it moved a
    shard's intake watermark only in polls holding a request for that shard, so a
    partition whose last records (60 malformed ones, over a BLACKBOX_REREAD_LIMIT of 30)
    held none for a shard leaves that shard's mark far behind with nothing lost. This
    release judges such marks by the newest until it has marked every shard itself: it
    does not stop the partition as lost data, delivers the pending schedule once, and
    neither delivers nor dead-letters anything twice."""
    settings = Settings.from_env(fleet.env)
    target = unique("marks")
    clients.ensure_topics(settings.kafka, [*settings.own_topics, target])
    bootstrap, intake = settings.kafka["bootstrap.servers"], settings.intake_topic
    delivered, dead = reader(target), reader(settings.dlq_topic)
    fleet.previous = first_tree
    old = fleet.start("previous")
    kept, fired = _id_off_shard_zero(fleet, "kept"), _id_off_shard_zero(fleet, "fired")
    own = [(CALLER_HEADER, CALLER)]
    produce(bootstrap, intake, [orjson.dumps({"id": kept, "topic": target, "message": "kept",
                                              "countdown": LATER})], headers=own)  # fmt: skip
    wait_until(lambda: fleet.client.zscore(fleet.layout.keys_of(scoped_id(CALLER, kept)).due,
                                           scoped_id(CALLER, kept)) is not None)  # fmt: skip
    produce(bootstrap, intake, [orjson.dumps({"id": fired, "topic": target, "message": "fired",
                                              "countdown": 0})], headers=own)  # fmt: skip
    delivered.wait_for(lambda r: _bodies(r)["fired"] == 1)
    produce(bootstrap, intake, [b"not json"] * FLOOD)
    dead.wait_count(FLOOD)
    assert old.terminate() == 0, old.output()[-3000:]
    topic_id = clients.topic_id_lookup(settings.kafka)([intake])[intake]
    marks = _marks(fleet, f"{intake}:0:{tag_of(topic_id)}")
    assert marks[fleet.layout.shard_of(scoped_id(CALLER, kept))] == 0  # left behind
    assert marks[0] == FLOOD + 1

    limit = {"BLACKBOX_REREAD_LIMIT": str(FLOOD // 2)}
    upgraded = fleet.start("this", limit)
    delivered.wait_for(lambda r: _bodies(r)["kept"] == 1, timeout=LATER + 30)
    assert _counter(upgraded, "blackbox_intake_stopped_partitions") == 0
    assert _counter(upgraded, "blackbox_redis_gaps_total", {"kind": "far_behind"}) == 0
    assert _bodies(delivered.read_to_end()) == {"fired": 1, "kept": 1}
    assert len(dead.read_to_end()) == FLOOD
