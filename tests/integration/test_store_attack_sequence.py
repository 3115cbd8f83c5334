"""Attack: a mixed sequence of requests (creates, updates, if_absent creates of ids pending
and fired, cancels of ids pending, fired and never seen, moves, pauses and resumes, series
with limits, bad records, kcat tombstones with text and binary keys), its deliveries, then
a FLUSHALL and `blackbox rebuild` with the intake topic emptied up to its commits. The store
must hold exactly what Redis holds pending, and the rebuild give back every pending
schedule byte for byte and every caller's id's ended marker as Redis had it."""

from __future__ import annotations

import subprocess
import time

import orjson
import redis
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient

from blackbox.envelope import CALLER_HEADER
from blackbox.intake import rebuild
from tests.integration.conftest import (
    ReaderFactory,
    ServiceFactory,
    wipe_namespace,
    with_store_topic,
)
from tests.integration.store_attack_tools import CALLER, send, settled_differences, sid
from tests.integration.test_store_topic import redis_pending
from tests.kafkatools import end_offset, produce, unique, wait_until

NAMES = ("now-a", "later-a", "later-b", "later-c", "later-d", "once-x", "tick", "daily",
         "daily2", "never", "fresh")  # fmt: skip


def _kcat(bootstrap: str, topic: str, key: bytes, value: bytes | None) -> None:
    args = ["kcat", "-P", "-b", bootstrap, "-t", topic, "-K", "@@k@@", "-D", "@@r@@", "-Z",
            "-H", f"{CALLER_HEADER}={CALLER}"]  # fmt: skip
    subprocess.run(args, input=key + b"@@k@@" + (value or b"") + b"@@r@@", check=True,
                   timeout=30)  # fmt: skip


def _empty_intake(bootstrap: str, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    partitions = admin.list_topics(topic, timeout=10).topics[topic].partitions
    wanted = [TopicPartition(topic, p, end_offset(bootstrap, topic, p)) for p in partitions]
    for future in admin.delete_records(wanted).values():
        future.result(30)


def test_a_mixed_sequence_keeps_the_store_and_a_rebuild_gives_back_redis_as_it_was(
    start_service: ServiceFactory, reader: ReaderFactory, env: dict[str, str],
    redis_client: redis.Redis,
) -> None:  # fmt: skip
    env = with_store_topic(env)
    bootstrap, intake = env["KAFKA_BOOTSTRAP_SERVERS"], env["BLACKBOX_INTAKE_TOPIC"]
    overrides = {"BLACKBOX_STORE_TOPIC": env["BLACKBOX_STORE_TOPIC"]}
    service = start_service(**overrides)
    target, events = reader(unique("target")), reader(env["BLACKBOX_EVENTS_TOPIC"])
    t = target.topic

    def one(name: str, countdown: float, message: str = "m", **more: object) -> dict[str, object]:
        return {"id": name, "topic": t, "message": f"{name}:{message}", "countdown": countdown,
                **more}  # fmt: skip

    send(env, one("now-a", 0), one("later-a", 3600), one("later-b", 3600),
         one("later-c", 3600), one("later-d", 3600), one("once-x", 3600, if_absent=True),
         {"topic": t, "message": "derived-later", "countdown": 3600},
         {"topic": t, "message": "derived-now", "countdown": 0},
         {"id": "tick", "topic": t, "message": "tick", "every": 1, "limit": 3},
         {"id": "daily", "topic": t, "message": "daily", "every": 86400,
          "start": time.time() + 600},
         {"id": "daily2", "topic": t, "message": "daily2", "every": 86400,
          "start": time.time() + 600})  # fmt: skip
    target.wait_for(lambda r: sum(1 for x in r if x.value == b"tick") == 3, timeout=30)
    send(env, one("later-a", 3600, "v2"), one("once-x", 60, "v2", if_absent=True),
         one("now-a", 60, "again", if_absent=True), {"id": "later-b", "cancel": True},
         {"id": "later-c", "reschedule": True, "countdown": 7200},
         {"id": "daily", "pause": True}, {"id": "daily2", "pause": True})  # fmt: skip
    produce(bootstrap, intake, [b"{not json", orjson.dumps(one("bad", -5))],
            [(CALLER_HEADER, CALLER.encode())])  # fmt: skip
    _kcat(bootstrap, intake, b"later-d", None)  # a tombstone cancels later-d
    _kcat(bootstrap, intake, b"\xff\xfe-binary", None)  # dead-lettered: the key is no text
    send(env, {"id": "daily", "resume": True}, {"id": "never", "cancel": True},
         {"id": "now-a", "cancel": True})  # fmt: skip
    events.wait_for(lambda r: len(r) >= 11 + 7 + 2 + 2 + 3 + 3, timeout=30)

    found = settled_differences(service, env)
    assert found == {}, found  # promise 1: the store is Redis

    before = redis_pending(service)
    ids = [sid(n) for n in NAMES]
    markers = dict(zip(ids, service.store.ended_markers(ids), strict=True))
    assert markers[sid("never")] is None, "Redis keeps no marker for an id never pending"
    assert markers[sid("now-a")] == b"f", "a cancel of a fired id leaves its 'fired'"
    service.stop()
    delivered = [r.value for r in target.read_to_end()]
    _empty_intake(bootstrap, intake)
    wipe_namespace(redis_client, service.settings.namespace)

    rebuild.rebuild(service.settings)

    assert redis_pending(service) == before  # promise 3: byte for byte
    markers_after = dict(zip(ids, service.store.ended_markers(ids), strict=True))
    assert {k: v for k, v in markers_after.items() if v != markers[k]} == {}, (
        markers, markers_after)  # fmt: skip

    again = start_service(**overrides)
    # Answered as before the flush: an id never pending may be created if absent.
    send(env, one("never", 3600, "created", if_absent=True), one("fresh", 3600))
    wait_until(lambda: sid("fresh") in redis_pending(again), 20, "fresh stored")
    assert sid("never") in redis_pending(again)
    # A probe due now: once it arrives, firing has been through what was due before it.
    send(env, one("probe", 0))
    target.wait_for(lambda records: any(r.value == b"probe:m" for r in records), timeout=20)
    again_delivered = [r.value for r in target.read_to_end()[len(delivered) :]]
    assert again_delivered == [b"probe:m"], "nothing delivered again"
