"""`blackbox rebuild`: a Redis that lost everything is written back from Kafka. Every pending
schedule is delivered once, nothing delivered before arrives again, a series goes on at
its count, a paused one stays paused (intake/rebuild.py)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from structlog.testing import capture_logs

from blackbox.intake import passover, rebuild
from blackbox.schedule import Schedule
from blackbox.service import Service
from blackbox.signing import Parts, Signer, public_text
from blackbox.storage import rebuilding
from blackbox.storage.keys import Layout
from tests.integration.conftest import ReaderFactory, ServiceFactory, wipe_namespace
from tests.kafkatools import Received, produce, unique, wait_until
from tests.process import BlackboxProcess

pytestmark = pytest.mark.both_store_modes  # the storage-touching tests: both modes

CALLER = [("CALLER_SERVICE", b"billing")]
LATER = 40  # seconds: due after the flush and the rebuild
PLAIN = 20_000  # plain schedules pending at the flush: the size


def _send(service: Service, *requests: dict[str, Any], caller: bool = True) -> None:
    values = [orjson.dumps(r) for r in requests]
    produce(service.settings.kafka["bootstrap.servers"], service.settings.intake_topic, values,
            headers=CALLER if caller else ())  # fmt: skip


def _every_kind(service: Service, target: str) -> None:
    """Plain and caller's schedules, updates, cancels, a reschedule and two series."""
    _send(service, *({"topic": target, "message": f"early-{n}", "countdown": 0} for n in range(5)),
          *({"topic": target, "message": f"late-{n}", "countdown": LATER} for n in range(PLAIN)),
          caller=False)  # fmt: skip
    soon = time.time() + 600
    _send(
        service,
        *({"id": f"o-{n}", "topic": target, "message": f"o-{n} v1", "countdown": LATER}
          for n in range(4)),
        *({"id": f"o-{n}", "topic": target, "message": f"o-{n} v2", "countdown": LATER}
          for n in range(2)),
        *({"id": f"c-{n}", "topic": target, "message": f"c-{n}", "countdown": LATER}
          for n in range(2)),
        {"id": "c-0", "cancel": True}, {"id": "c-1", "cancel": True},
        {"id": "r-0", "topic": target, "message": "r-0", "countdown": 600},
        {"id": "r-0", "reschedule": True, "countdown": LATER},
        {"id": "s-run", "topic": target, "message": "s-run", "every": 5, "limit": 4,
         "missed": "all"},
        {"id": "s-held", "topic": target, "message": "s-held", "every": 5, "start": soon - 595},
        {"id": "s-held", "pause": True},
    )  # fmt: skip


def _bodies(records: list[Received]) -> Counter[str]:
    return Counter((r.value or b"").decode() for r in records)


def _all_in(found: Counter[str], wanted: Iterable[str]) -> bool:
    return all(found[body] >= 1 for body in wanted)


def test_a_flushed_redis_is_rebuilt_from_kafka_with_nothing_lost_or_delivered_twice(
    start_service: ServiceFactory,
    reader: ReaderFactory,
    redis_client: redis.Redis,
    env: dict[str, str],
    tmp_path: Path,
) -> None:
    """Guarantee 1 (a wiped Redis is never run on silently, and every pending schedule can
    be rebuilt from Kafka): after FLUSHALL the service stops intake; `blackbox rebuild`
    writes back what was pending; then every pending schedule is delivered once, nothing
    delivered before arrives again, updates and cancels hold, the series goes on to its
    limit, and the paused series stays silent until resumed."""
    first = start_service()
    target = unique("rebuilt")
    delivered = reader(target)
    _every_kind(first, target)
    delivered.wait_for(lambda records: sum(_bodies(records)[f"early-{n}"] for n in range(5)) == 5
                       and _bodies(records)["s-run"] >= 2, timeout=30)  # fmt: skip
    first.stop()
    before = _bodies(delivered.read_to_end())
    wipe_namespace(redis_client, first.settings.namespace)

    refusing = start_service()
    wait_until(lambda: refusing.metrics.value("blackbox_intake_stopped_partitions") == 1,
               what="intake stopped on the wiped Redis")  # fmt: skip
    refusing.stop()

    rebuilt = BlackboxProcess(env, tmp_path / "rebuild.log", "rebuild", "--yes")
    assert rebuilt.wait(120) == 0, rebuilt.output()

    after = start_service()
    expected = {**{f"late-{n}": 1 for n in range(PLAIN)}, "o-0 v2": 1, "o-1 v2": 1, "o-2 v1": 1,
                "o-3 v1": 1, "r-0": 1}  # fmt: skip
    delivered.wait_for(lambda records: _all_in(_bodies(records), expected)
                       and _bodies(records)["s-run"] >= 4, timeout=LATER + 40)  # fmt: skip
    assert after.metrics.value("blackbox_intake_stopped_partitions") == 0
    everything = _bodies(delivered.read_to_end())
    for body, count in expected.items():
        assert everything[body] == count, body
    for n in range(5):
        assert everything[f"early-{n}"] == before[f"early-{n}"] == 1
    assert everything["s-run"] == 4  # its limit: those before the flush, the rest after
    occurrences = Counter(r.header("blackbox-occurrence-ms") for r in delivered.records
                          if r.value == b"s-run")  # fmt: skip
    assert set(occurrences.values()) == {1}
    for gone in ("o-0 v1", "o-1 v1", "c-0", "c-1", "s-held"):
        assert everything[gone] == 0, gone

    _send(after, {"id": "s-held", "resume": True})
    delivered.wait_for(lambda records: _bodies(records)["s-held"] >= 1, timeout=30)


def test_rebuild_refuses_while_a_replica_runs_and_without_yes(
    start_service: ServiceFactory, env: dict[str, str], tmp_path: Path
) -> None:
    """A rebuild deletes the namespace's keys: it asks for --yes, and refuses while a
    replica of the namespace runs (exit code 2, the reason on stderr)."""
    unconfirmed = BlackboxProcess(env, tmp_path / "no.log", "rebuild")
    assert unconfirmed.wait(60) == 2
    assert "--yes" in unconfirmed.output()
    start_service()
    running = BlackboxProcess(env, tmp_path / "running.log", "rebuild", "--yes")
    assert running.wait(60) == 2
    assert "still run" in running.output()


def _snapshot(client: redis.Redis, namespace: str) -> list[tuple[bytes, int, bytes]]:
    """Every key of the namespace as DUMP gives it, with its time to live (ms, 0: none);
    the processes' heartbeats left out (in a snapshot hours old they have all expired)."""
    keys = [k for k in client.scan_iter(match="{" + namespace + "*", count=1000)
            if not k.endswith((b":procs", b":firers"))]  # fmt: skip
    return [(k, max(0, int(client.pttl(k))), client.dump(k)) for k in keys]  # type: ignore[misc]


def _restore(client: redis.Redis, namespace: str, snapshot: list[tuple[bytes, int, bytes]]) -> None:
    wipe_namespace(client, namespace)
    for key, ttl, dumped in snapshot:
        client.restore(key, ttl, dumped, replace=True)


def test_a_redis_restored_from_an_old_snapshot_is_rebuilt_without_firing_twice(
    start_service: ServiceFactory,
    reader: ReaderFactory,
    redis_client: redis.Redis,
    env: dict[str, str],
    tmp_path: Path,
) -> None:
    """Guarantee 1: a snapshot taken before some schedules fired and before others were
    accepted is restored; after the rebuild the ones accepted since are delivered, and the
    ones that fired since (pending again in the snapshot) are not delivered a second time."""
    first = start_service()
    target = unique("restored")
    delivered = reader(target)
    _send(first, *({"topic": target, "message": f"fired-{n}", "countdown": 3} for n in range(5)),
          *({"topic": target, "message": f"kept-{n}", "countdown": LATER} for n in range(5)),
          caller=False)  # fmt: skip
    wait_until(lambda: sum(first.store.counts()) == 10, what="10 stored")
    snapshot = _snapshot(redis_client, first.settings.namespace)
    _send(first, *({"topic": target, "message": f"since-{n}", "countdown": LATER}
                   for n in range(5)), caller=False)  # fmt: skip
    delivered.wait_for(lambda records: len(records) >= 5)
    wait_until(lambda: sum(first.store.counts()) == 10, what="the later 5 stored")
    first.stop()
    _restore(redis_client, first.settings.namespace, snapshot)

    rebuilt = BlackboxProcess(env, tmp_path / "rebuild.log", "rebuild", "--yes")
    assert rebuilt.wait(120) == 0, rebuilt.output()
    start_service()
    wanted = [*(f"kept-{n}" for n in range(5)), *(f"since-{n}" for n in range(5))]
    delivered.wait_for(lambda records: _all_in(_bodies(records), wanted), LATER + 40)
    everything = _bodies(delivered.read_to_end())
    assert {b: everything[b] for b in wanted} == dict.fromkeys(wanted, 1)
    assert {f"fired-{n}": everything[f"fired-{n}"] for n in range(5)} == {
        f"fired-{n}": 1 for n in range(5)
    }


# An attack review's findings: each case below delivered again (or crashed) before.


def _pending(client: redis.Redis, service: Service) -> set[str]:
    """The ids due in `service`'s namespace, over every shard."""
    due = [client.zrange(k.due, 0, -1) for k in service.store.layout.shards]
    return {bytes(i).decode() for ids in due for i in ids}  # type: ignore[arg-type]


def _stored_ids(client: redis.Redis, service: Service) -> dict[str, Schedule]:
    """Every schedule due in `service`'s namespace, by the message it carries."""
    found = {}
    for schedule_id in _pending(client, service):
        # In index mode a reference, read back from the store topic (store.reader).
        schedule = service.store.load(schedule_id)
        assert schedule is not None, schedule_id
        found[(schedule.value or b"").decode()] = schedule
    return found


def _flush_and_rebuild(client: redis.Redis, service: Service) -> rebuild.Counts:
    """Stop `service`, lose its Redis, rebuild from Kafka in this process."""
    service.stop()
    wipe_namespace(client, service.settings.namespace)
    return rebuild.rebuild(service.settings)


def _delivered(service: Service, count: int) -> None:
    wait_until(lambda: service.metrics.value("blackbox_delivered_total") >= count,
               what=f"{count} delivered")  # fmt: skip


def _forget_before(bootstrap: str, topic: str, offset: int) -> None:
    """What retention does: the partition's records before `offset` deleted."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.delete_records([TopicPartition(topic, 0, offset)]).values():
        future.result(30)


def test_a_delivery_the_target_topic_no_longer_keeps_is_not_delivered_again(
    start_service: ServiceFactory, reader: ReaderFactory, redis_client: redis.Redis,
    store_mode: str,
) -> None:  # fmt: skip
    """C1: the target topic's retention removed the deliveries: one-offs due before its
    oldest kept record are passed over (counted), those due after are written back. (With a
    store topic, the delivered ones are tombstones there: never read back at all.)"""
    first = start_service()
    target = unique("aged-target")
    _send(first, *({"topic": target, "message": f"gone-{n}", "countdown": 0} for n in range(3)),
          {"topic": target, "message": "pending", "countdown": 600}, caller=False)  # fmt: skip
    _delivered(first, 3)
    bootstrap = first.settings.kafka["bootstrap.servers"]
    produce(bootstrap, target, [b"kept, after the deliveries"])
    _forget_before(bootstrap, target, 3)
    counts = _flush_and_rebuild(redis_client, first)
    assert set(_stored_ids(redis_client, first)) == {"pending"}
    assert (counts.aged_out, counts.stored) == ((3, 0) if store_mode == "no-store" else (0, 1))


def test_a_schedule_dead_lettered_when_it_fired_is_not_delivered_again(
    start_service: ServiceFactory, reader: ReaderFactory, redis_client: redis.Redis,
    store_mode: str,
) -> None:  # fmt: skip
    """C2: a schedule whose delivery failed for good sits in the dead-letter topic: ended."""
    first = start_service(BLACKBOX_MAX_ATTEMPTS="1")
    target = unique("small-target")
    admin = AdminClient(dict(first.settings.kafka))
    small = NewTopic(target, 1, 1, config={"max.message.bytes": "2000"})
    admin.create_topics([small])[target].result(30)
    big = "x" * 5000
    _send(first, {"topic": target, "message": big, "countdown": 0},
          {"id": "big", "topic": target, "message": big, "countdown": 0},
          {"topic": target, "message": "pending", "countdown": 600}, caller=False)  # fmt: skip
    dead = reader(first.settings.dlq_topic)
    dead.wait_count(2, timeout=60)
    counts = _flush_and_rebuild(redis_client, first)
    assert set(_stored_ids(redis_client, first)) == {"pending"}
    expected = (2, 0) if store_mode == "no-store" else (0, 1)  # tombstones in the store
    assert (counts.dead_lettered, counts.stored) == expected


def test_a_forged_blackbox_id_on_another_topic_hides_no_schedule(
    start_service: ServiceFactory, reader: ReaderFactory, redis_client: redis.Redis
) -> None:
    """C3: a caller writes another caller's id and version as headers to its own topic (and
    first among a delivered record's headers): the schedule is still written back."""
    first = start_service()
    victim_topic, own_topic = unique("victim"), unique("attacker")
    _send(first, {"topic": own_topic, "message": "own", "countdown": 0}, caller=False)
    _delivered(first, 1)  # read first by the rebuild, as a target topic
    _send(first, {"id": "pay", "topic": victim_topic, "message": "victim", "countdown": 600})
    wait_until(lambda: "victim" in _stored_ids(redis_client, first), what="stored")
    victim = _stored_ids(redis_client, first)["victim"]
    forged = [("blackbox-id", victim.id.encode()), ("blackbox-version", victim.version.encode())]
    produce(first.settings.kafka["bootstrap.servers"], own_topic, [b"forged"], headers=forged)
    _flush_and_rebuild(redis_client, first)
    assert set(_stored_ids(redis_client, first)) == {"victim"}


def test_an_if_absent_retry_answered_already_fired_is_not_delivered_again(
    start_service: ServiceFactory, reader: ReaderFactory, redis_client: redis.Redis
) -> None:
    """I: a create retried with if_absent after the first fired was answered already_fired;
    the rebuild leaves it so, and the id's ended marker is back."""
    first = start_service()
    target = unique("absent")
    request = {"id": "once", "topic": target, "message": "once", "countdown": 0, "if_absent": True}
    _send(first, request)
    _delivered(first, 1)
    _send(first, request, {"topic": target, "message": "pending", "countdown": 600})
    wait_until(lambda: "pending" in _stored_ids(redis_client, first), what="stored")
    _flush_and_rebuild(redis_client, first)
    assert set(_stored_ids(redis_client, first)) == {"pending"}
    ended = first.store.layout.keys_of("@billing/once").ended("@billing/once")
    assert redis_client.get(ended) == b"f"


def test_a_forged_occurrence_beyond_64_bits_is_skipped_not_a_crash(
    start_service: ServiceFactory, reader: ReaderFactory, redis_client: redis.Redis
) -> None:
    """C4: a delivered record's blackbox-occurrence-ms too large for a due time is skipped
    (counted); the series is written back."""
    first = start_service()
    target = unique("occurrence")
    _send(first, {"id": "s", "topic": target, "message": "s", "every": 600, "start":
                  time.time() + 600})  # fmt: skip
    wait_until(lambda: "s" in _stored_ids(redis_client, first), what="stored")
    series = _stored_ids(redis_client, first)["s"]
    forged = [("blackbox-id", series.id.encode()), ("blackbox-version", series.version.encode()),
              ("blackbox-occurrence-ms", b"9" * 30)]  # fmt: skip
    produce(first.settings.kafka["bootstrap.servers"], target, [b"forged"], headers=forged)
    counts = _flush_and_rebuild(redis_client, first)
    assert set(_stored_ids(redis_client, first)) == {"s"}
    assert counts.skipped == 1


def test_a_target_partition_emptied_by_retention_ends_its_read(
    start_service: ServiceFactory, reader: ReaderFactory, redis_client: redis.Redis
) -> None:
    """F: a target partition whose records were all deleted is read at once (empty)."""
    first = start_service()
    target = unique("emptied")
    _send(first, {"topic": target, "message": "gone", "countdown": 0},
          {"topic": target, "message": "pending", "countdown": 600}, caller=False)  # fmt: skip
    _delivered(first, 1)
    _forget_before(first.settings.kafka["bootstrap.servers"], target, 1)
    _flush_and_rebuild(redis_client, first)
    assert set(_stored_ids(redis_client, first)) == {"pending"}


def test_intake_records_aged_out_stop_the_rebuild_unless_accepted(
    start_service: ServiceFactory, redis_client: redis.Redis, store_mode: str
) -> None:
    """G: the intake topic no longer holds its first records (a series' creation may be
    among them): the rebuild refuses, deleting nothing, unless the loss is accepted. With
    a store topic, which holds what they created, nothing is lost: no refusal."""
    first = start_service()
    target = unique("aged-intake")
    _send(first, *({"topic": target, "message": f"m-{n}", "countdown": 600} for n in range(3)),
          caller=False)  # fmt: skip
    wait_until(lambda: len(_pending(redis_client, first)) == 3, what="stored")
    first.stop()
    _forget_before(first.settings.kafka["bootstrap.servers"], first.settings.intake_topic, 1)
    if store_mode != "no-store":
        assert rebuild.rebuild(first.settings).stored == 3
        assert set(_stored_ids(redis_client, first)) == {"m-0", "m-1", "m-2"}
        return
    with pytest.raises(rebuild.AgedOut, match="--accept-aged-out"):
        rebuild.rebuild(first.settings)
    assert len(_pending(redis_client, first)) == 3
    rebuild.rebuild(first.settings, accept_aged_out=True)
    assert set(_stored_ids(redis_client, first)) == {"m-1", "m-2"}


def test_a_rebuild_in_progress_keeps_intake_stopped_and_the_replica_unready(
    start_service: ServiceFactory, redis_client: redis.Redis, env: dict[str, str]
) -> None:
    """K: a rebuild that stopped half-way leaves its marker: a service started then takes
    nothing from the intake topic and is not ready until a rebuild finishes."""
    layout = Layout(env["BLACKBOX_NAMESPACE"], 1)
    rebuilding.begin(redis_client, layout)
    held = start_service()
    target = unique("held")
    _send(held, {"topic": target, "message": "held", "countdown": 600}, caller=False)
    wait_until(lambda: "rebuild" in str(held.health.report()), what="unready for the rebuild")
    assert not held.health.ready
    assert _pending(redis_client, held) == set()
    rebuilding.end(redis_client, layout)
    wait_until(lambda: _pending(redis_client, held) != set(), what="intake started")


def test_a_signed_copy_refused_for_its_age_is_not_taken_by_the_rebuild(
    start_service: ServiceFactory, redis_client: redis.Redis, tmp_path: Path, store_mode: str
) -> None:
    """M: a signed record sent again long after it was signed (its create time kept) was
    refused for its age; the rebuild, which judges no age, does not take it either."""
    key = Ed25519PrivateKey.generate()
    policy = tmp_path / "policy.yaml"
    policy.write_text("callers:\n  billing:\n    require_signature: true\n"
                      "    signature_max_age_seconds: 4\n"
                      f'    keys: {{billing-1: "{public_text(key.public_key())}"}}\n')  # fmt: skip
    first = start_service(BLACKBOX_POLICY_FILE=str(policy))
    target = unique("stale")
    old = int(time.time() * 1000) - 60_000
    value = orjson.dumps({"topic": target, "message": "stale", "countdown": 600})
    parts = Parts(first.settings.intake_topic, None, value, CALLER)
    signed = [*CALLER, Signer(key, "billing-1").header(parts, issued_ms=old)]
    produce(first.settings.kafka["bootstrap.servers"], first.settings.intake_topic, [value],
            headers=signed, timestamp_ms=old)  # fmt: skip
    _send(first, {"topic": target, "message": "pending", "countdown": 600}, caller=False)
    wait_until(lambda: "pending" in _stored_ids(redis_client, first), what="stored")
    counts = _flush_and_rebuild(redis_client, first)
    assert set(_stored_ids(redis_client, first)) == {"pending"}
    # With a store topic, records below the commit are not read again: it never held it.
    expected = (1, 0) if store_mode == "no-store" else (0, 1)
    assert (counts.refused_before, counts.stored) == expected


# A second attack review's findings.


def _commit_back(service: Service, offset: int) -> None:
    """The group's committed offset on intake partition 0 put back to `offset`: what a
    replica killed less than an auto-commit interval after it handled the rest leaves."""
    settings = service.settings
    consumer = Consumer({"bootstrap.servers": settings.kafka["bootstrap.servers"],
                         "group.id": settings.group_id, "enable.auto.commit": False})  # fmt: skip
    try:
        consumer.commit(offsets=[TopicPartition(settings.intake_topic, 0, offset)],
                        asynchronous=False)  # fmt: skip
    finally:
        consumer.close()


def test_records_handled_past_the_committed_offset_are_not_delivered_again(
    start_service: ServiceFactory, reader: ReaderFactory, redis_client: redis.Redis,
    store_mode: str,
) -> None:  # fmt: skip
    """U: a replica killed after it fired records it had not committed yet; Redis is lost.
    The rebuild replays each intake partition to its end, so the service, reading again
    from the committed offset, skips them as re-reads: nothing is delivered twice, and what
    was pending there is written back."""
    first = start_service()
    target = unique("uncommitted")
    delivered = reader(target)
    _send(first, *({"topic": target, "message": f"a-{n}", "countdown": 0} for n in range(3)),
          caller=False)  # fmt: skip
    delivered.wait_count(3)
    _send(first, *({"topic": target, "message": f"b-{n}", "countdown": 0} for n in range(3)),
          {"topic": target, "message": "pending", "countdown": 600}, caller=False)  # fmt: skip
    delivered.wait_count(6)
    wait_until(lambda: "pending" in _stored_ids(redis_client, first), what="stored")
    first.stop()
    _commit_back(first, 3)
    counts = _flush_and_rebuild(redis_client, first)
    assert set(_stored_ids(redis_client, first)) == {"pending"}
    # With a store topic only the records past the commit are replayed (the rest are
    # tombstones in the store): the three delivered there are passed over.
    delivered_again = 6 if store_mode == "no-store" else 3
    assert counts.passed_over[passover.Reason.DELIVERED] == delivered_again
    after = start_service()
    _send(after, {"topic": target, "message": "last", "countdown": 0}, caller=False)
    delivered.wait_for(lambda records: _bodies(records)["last"] == 1)
    everything = _bodies(delivered.read_to_end())
    assert [everything[f"b-{n}"] for n in range(3)] == [1, 1, 1]


def test_firing_waits_while_a_rebuild_is_under_way(
    start_service: ServiceFactory, reader: ReaderFactory, redis_client: redis.Redis,
    env: dict[str, str],
) -> None:  # fmt: skip
    """K: a replica started while a rebuild runs (or after one stopped half-way) fires
    nothing of the half-written Redis until the rebuild ends."""
    first = start_service()
    target = unique("held-firing")
    delivered = reader(target)
    _send(first, {"topic": target, "message": "due", "countdown": 5}, caller=False)
    wait_until(lambda: "due" in _stored_ids(redis_client, first), what="stored")
    first.stop()
    layout = Layout(env["BLACKBOX_NAMESPACE"], 1)
    rebuilding.begin(redis_client, layout)
    held = start_service()
    assert held.firing is not None
    due_ms = _stored_ids(redis_client, held)["due"].due_ms
    wait_until(lambda: time.time() * 1000 > due_ms, what="due")
    rounds = held.firing.held_rounds
    wait_until(lambda: held.firing is not None and held.firing.held_rounds >= rounds + 2,
               what="firing held twice after the due time")  # fmt: skip
    assert delivered.read_to_end() == []
    rebuilding.end(redis_client, layout)
    delivered.wait_for(lambda records: _bodies(records)["due"] == 1)


def test_a_replica_started_while_the_rebuild_planned_stops_it_before_any_delete(
    start_service: ServiceFactory, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """K: the rebuild looks for running replicas again after its planning, right before it
    deletes anything; it leaves no mark behind when it stops there."""
    first = start_service()
    target = unique("late-replica")
    _send(first, {"topic": target, "message": "kept", "countdown": 600}, caller=False)
    wait_until(lambda: "kept" in _stored_ids(redis_client, first), what="stored")
    first.stop()
    layout = first.store.layout
    planned = rebuild.planned

    def replica_starts(*args: Any, **kwargs: Any) -> rebuild.Plan:
        plan = planned(*args, **kwargs)
        redis_client.zadd(layout.processes, {"late": time.time() * 1000 + 60_000})
        return plan

    monkeypatch.setattr(rebuild, "planned", replica_starts)
    with pytest.raises(rebuild.ReplicasRunning):
        rebuild.rebuild(first.settings)
    assert set(_stored_ids(redis_client, first)) == {"kept"}
    assert not rebuilding.under_way(redis_client, layout)


def test_a_one_off_rescheduled_after_its_first_due_time_aged_out_is_kept(
    start_service: ServiceFactory, reader: ReaderFactory, redis_client: redis.Redis
) -> None:
    """Q: a caller's one-off moved to later, its first due time before the oldest record its
    target topic keeps, is judged by its latest due time: written back, not aged out."""
    first = start_service()
    target = unique("moved")
    _send(first, {"id": "inv", "topic": target, "message": "inv", "countdown": 2},
          {"id": "inv", "reschedule": True, "countdown": 600})  # fmt: skip
    wait_until(lambda: "inv" in _stored_ids(redis_client, first), what="stored")
    first_due = int(time.time() * 1000) + 2000
    wait_until(lambda: time.time() * 1000 > first_due + 100, what="its first due time passed")
    bootstrap = first.settings.kafka["bootstrap.servers"]
    produce(bootstrap, target, [b"old", b"kept"])
    _forget_before(bootstrap, target, 1)
    counts = _flush_and_rebuild(redis_client, first)
    assert set(_stored_ids(redis_client, first)) == {"inv"}
    assert counts.aged_out == 0


def test_schedules_accepted_before_a_key_rotation_and_a_policy_change_are_rebuilt(
    start_service: ServiceFactory, redis_client: redis.Redis, tmp_path: Path
) -> None:
    """R: the caller's signing key rotated as the README says, another caller moved to a
    new topic: what the service accepted before (under the group's committed offset, not
    refused in the dead-letter topic) is written back as it was, keyed to its caller."""
    old_key, new_key = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    target, moved_to = unique("rotated"), unique("moved-to")
    policy = tmp_path / "policy.yaml"
    policy.write_text("callers:\n  billing:\n    require_signature: true\n"
                      f'    keys: {{billing-1: "{public_text(old_key.public_key())}"}}\n'
                      f"  ops:\n    topics: [{target}]\n")  # fmt: skip
    first = start_service(BLACKBOX_POLICY_FILE=str(policy))
    value = orjson.dumps({"id": "inv", "topic": target, "message": "signed", "countdown": 600})
    parts = Parts(first.settings.intake_topic, None, value, CALLER)
    signer = Signer(old_key, "billing-1")
    produce(first.settings.kafka["bootstrap.servers"], first.settings.intake_topic, [value],
            headers=[*CALLER, signer.header(parts, issued_ms=int(time.time() * 1000))])  # fmt: skip
    ops = orjson.dumps({"id": "job", "topic": target, "message": "ops", "countdown": 600})
    produce(first.settings.kafka["bootstrap.servers"], first.settings.intake_topic, [ops],
            headers=[("CALLER_SERVICE", b"ops")])  # fmt: skip
    wait_until(lambda: len(_pending(redis_client, first)) == 2, what="both stored")
    policy.write_text("callers:\n  billing:\n    require_signature: true\n"
                      f'    keys: {{billing-2: "{public_text(new_key.public_key())}"}}\n'
                      f"  ops:\n    topics: [{moved_to}]\n")  # fmt: skip
    counts = _flush_and_rebuild(redis_client, first)
    assert _pending(redis_client, first) == {"@billing/inv", "@ops/job"}
    assert counts.refused == 0


def test_a_rebuild_warns_when_the_dead_letter_topic_lost_its_first_letters(
    start_service: ServiceFactory, redis_client: redis.Redis
) -> None:
    """D: the dead-letter topic's retention removed letters: what they showed refused or
    failed cannot be told any more, and the rebuild says so."""
    first = start_service()
    bootstrap = first.settings.kafka["bootstrap.servers"]
    produce(bootstrap, first.settings.dlq_topic, [b"an old letter", b"a newer one"])
    _forget_before(bootstrap, first.settings.dlq_topic, 1)
    with capture_logs() as logs:
        _flush_and_rebuild(redis_client, first)
    warned = [e for e in logs if e["event"] == "dead_letters_aged_out"]
    assert warned and warned[0]["log_level"] == "warning"


def test_an_if_absent_id_reused_after_its_ended_marker_expired_is_rebuilt(
    start_service: ServiceFactory, reader: ReaderFactory, redis_client: redis.Redis,
    store_mode: str,
) -> None:  # fmt: skip
    """I: the ended marker of an id delivered, or cancelled, expires after
    BLACKBOX_FIRED_RETENTION (counted from the delivery or the cancel); the service then
    takes an if_absent create of the id again. The rebuild judges it the same way, and a
    cancel's marker it writes back runs out when the service's would have."""
    first = start_service(BLACKBOX_FIRED_RETENTION="4")
    target = unique("reused")
    delivered = reader(target)
    _send(first, {"id": "rep", "if_absent": True, "topic": target, "message": "rep 1",
                  "countdown": 0},
          {"id": "can", "if_absent": True, "topic": target, "message": "can 1", "countdown": 600},
          {"id": "can", "cancel": True})  # fmt: skip
    delivered.wait_count(1)
    layout = first.store.layout
    markers = [layout.keys_of(i).ended(i) for i in ("@billing/rep", "@billing/can")]
    wait_until(lambda: not any(redis_client.exists(m) for m in markers), what="markers expired")
    _send(first, {"id": "rep", "if_absent": True, "topic": target, "message": "rep 2",
                  "countdown": 600},
          {"id": "can", "if_absent": True, "topic": target, "message": "can 2", "countdown": 600},
          {"id": "late", "topic": target, "message": "late", "countdown": 600},
          {"id": "late", "cancel": True})  # fmt: skip
    cancelled_by_ms = time.time() * 1000
    wait_until(lambda: set(_stored_ids(redis_client, first)) == {"rep 2", "can 2"}, what="stored")
    if store_mode != "no-store":  # its tombstone's time: when the service applied the cancel
        cancelled_by_ms = time.time() * 1000
    _flush_and_rebuild(redis_client, first)
    assert set(_stored_ids(redis_client, first)) == {"rep 2", "can 2"}
    late = layout.keys_of("@billing/late").ended("@billing/late")
    read_from_ms = time.time() * 1000
    left_ms = int(redis_client.pttl(late))
    assert left_ms == -2 or left_ms <= cancelled_by_ms + 4000 - read_from_ms


def test_a_series_whose_first_deliveries_aged_out_stops_at_its_limit(
    start_service: ServiceFactory, reader: ReaderFactory, redis_client: redis.Redis
) -> None:
    """S: a series with a limit whose first deliveries its target topic's retention removed:
    every occurrence before the oldest kept record counts as delivered, so the series never
    runs past its limit."""
    first = start_service()
    target = unique("limited")
    delivered = reader(target)
    _send(first, {"id": "s", "topic": target, "message": "tick", "every": 1, "limit": 6})
    delivered.wait_count(3)
    _forget_before(first.settings.kafka["bootstrap.servers"], target, 2)
    _flush_and_rebuild(redis_client, first)
    after = start_service()
    wait_until(lambda: "tick" not in _stored_ids(redis_client, after), what="the series ended")
    assert len(delivered.read_to_end()) <= 6


def test_a_record_past_the_committed_offset_refused_is_dead_lettered_by_the_service_once(
    start_service: ServiceFactory, reader: ReaderFactory, redis_client: redis.Redis
) -> None:
    """U: a record the service never read (sent while every replica was stopped) lies past
    the committed offset, and the rebuild replays to the end: a refusal there is not lost,
    the service dead-letters it when it reads it, once."""
    first = start_service()
    target = unique("tail")
    letters = reader(first.settings.dlq_topic)
    _send(first, {"topic": target, "message": "pending", "countdown": 600}, caller=False)
    wait_until(lambda: "pending" in _stored_ids(redis_client, first), what="stored")
    first.stop()
    produce(first.settings.kafka["bootstrap.servers"], first.settings.intake_topic,
            [b"not a request"], headers=CALLER)  # fmt: skip
    wipe_namespace(redis_client, first.settings.namespace)
    counts = rebuild.rebuild(first.settings)
    assert counts.refused == 1
    after = start_service()
    letters.wait_count(1)
    _send(after, {"topic": target, "message": "later", "countdown": 600}, caller=False)
    wait_until(lambda: "later" in _stored_ids(redis_client, after), what="read past it")
    assert len(letters.read_to_end()) == 1
