"""Attacks on index mode (BLACKBOX_STORAGE_MODE=index) on the real stack: a caller's id
created if absent and moved in one poll, claims of big messages held as small references,
mode switches. After each, every reference Redis keeps names its id's latest store record
(the one compaction keeps), and what fires is the latest version byte for byte."""

from __future__ import annotations

import base64
import time
from pathlib import Path

import httpx
import redis

from blackbox.clock import now_ms
from blackbox.intake import rebuild
from blackbox.kafka import clients
from blackbox.reference import Reference, is_reference
from blackbox.role import Role
from blackbox.schedule import Schedule
from blackbox.service import Service
from tests.integration.conftest import (
    ReaderFactory,
    ServiceFactory,
    wipe_namespace,
    with_store_topic,
)
from tests.integration.store_attack_tools import send, sid
from tests.integration.test_store_topic import assert_store_matches, redis_pending
from tests.kafkatools import end_offset, rewind_intake, unique, wait_until
from tests.process import BlackboxProcess

TOKEN = "index-attack-token-0123456789"  # noqa: S105 - a test token


def _index(env: dict[str, str]) -> dict[str, str]:
    return {**with_store_topic(env), "BLACKBOX_STORAGE_MODE": "index"}


def _overrides(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k in ("BLACKBOX_STORE_TOPIC", "BLACKBOX_STORAGE_MODE")}


def _settled(service: Service, env: dict[str, str]) -> None:
    """Wait until the store's latest records are exactly what Redis holds (references
    naming them); fail with the last difference seen."""
    last: list[str] = []

    def matches() -> bool:
        try:
            assert_store_matches(service, env)
        except AssertionError as e:
            last[:] = [str(e)[:2000]]
            return False
        return True

    try:
        wait_until(matches, 20, "the store matches Redis")
    except AssertionError as e:
        raise AssertionError(f"{e}: {last}") from e


def test_an_if_absent_create_of_a_pending_id_moved_in_the_same_poll_keeps_its_message(
    start_service: ServiceFactory, reader: ReaderFactory, env: dict[str, str]
) -> None:
    """Promise 2 (idempotent intake): `if_absent` of an id pending changes nothing, even
    when a move of that id follows it in the same poll: the moved schedule delivers the
    message that was pending, not the refused one; and an `if_absent` create of a new id
    moved in the same poll leaves Redis naming the id's latest store record."""
    env = _index(env)
    service = start_service(**_overrides(env))
    target = reader(unique("target"))
    t = target.topic
    send(env, {"id": "kept", "topic": t, "message": "original", "countdown": 3600})
    wait_until(lambda: sid("kept") in redis_pending(service), what="stored")
    events = reader(env["BLACKBOX_EVENTS_TOPIC"])
    events.wait_count(1)
    # One produce call: the records land in one intake poll.
    send(env,
         {"id": "kept", "topic": t, "message": "refused", "countdown": 3600, "if_absent": True},
         {"id": "kept", "reschedule": True, "countdown": 3000},
         {"id": "fresh", "topic": t, "message": "fresh", "countdown": 3600, "if_absent": True},
         {"id": "fresh", "reschedule": True, "countdown": 3000})  # fmt: skip
    events.wait_count(5)
    _settled(service, env)
    shown = service.store.load(sid("kept"))
    assert shown is not None
    assert shown.value == b"original"


def test_a_claim_of_references_is_bounded_by_the_bytes_of_their_records(
    start_service: ServiceFactory, env: dict[str, str]
) -> None:
    """BLACKBOX_BATCH_BYTES bounds what one claim holds, in index mode too: a reference is
    some 30 bytes in Redis, but firing holds its record's whole message once read back,
    so a claim counts the size the reference keeps (ten 100 KB messages are not taken in
    one claim of 350 KB)."""
    env = _index(env)
    service = start_service(**_overrides(env), BLACKBOX_SHARDS="1")
    send(env, *[{"id": f"big-{n}", "topic": unique("target"), "message": "x" * 100_000,
                 "countdown": 3600} for n in range(10)])  # fmt: skip
    wait_until(lambda: len(redis_pending(service)) == 10, what="stored")
    now = now_ms()
    first = service.store.claim_due(now, 1000, 30_000, due_by_ms=now + 7_200_000,
                                    max_bytes=350_000)  # fmt: skip
    assert len(first.ids) == 3
    assert first.more


def test_switching_index_to_inline_and_back_loses_nothing(
    start_service: ServiceFactory, reader: ReaderFactory, env: dict[str, str]
) -> None:
    """Promise 11 (upgrade in place) for the storage mode: schedules stored as references
    fire in inline mode (the store topic still set), moves and updates there make them
    whole again, and back in index mode a move makes a whole one a reference; nothing is
    dead-lettered, the store matches Redis at each step."""
    env = _index(env)
    service = start_service(**_overrides(env))
    target, dead = reader(unique("target")), reader(env["BLACKBOX_DLQ_TOPIC"])
    t = target.topic
    send(env, *[{"id": n, "topic": t, "message": f"{n}-v1", "countdown": 3600}
                for n in ("a", "b", "c")],
         {"id": "soon", "topic": t, "message": "soon-v1", "countdown": 6})  # fmt: skip
    wait_until(lambda: len(redis_pending(service)) == 4, what="stored")
    service.stop()

    inline = {**env, "BLACKBOX_STORAGE_MODE": "inline"}
    second = start_service(**_overrides(inline))
    send(env, {"id": "a", "reschedule": True, "countdown": 3000},
         {"id": "b", "topic": t, "message": "b-v2", "countdown": 3600})  # fmt: skip
    target.wait_for(lambda r: any(x.value == b"soon-v1" for x in r), timeout=30)
    _settled(second, env)
    held = redis_pending(second)
    assert not is_reference(held[sid("a")]) and not is_reference(held[sid("b")])
    assert is_reference(held[sid("c")])
    second.stop()

    third = start_service(**_overrides(env))
    send(env, {"id": "a", "reschedule": True, "countdown": 1},
         {"id": "c", "reschedule": True, "countdown": 1})  # fmt: skip
    target.wait_for(lambda r: {b"a-v1", b"c-v1"} <= {x.value for x in r}, timeout=30)
    _settled(third, env)
    assert is_reference(redis_pending(third)[sid("b")]) is False
    assert dead.read_to_end() == []


def test_unsetting_the_store_topic_over_references_does_not_dead_letter_them(
    start_service: ServiceFactory, reader: ReaderFactory, env: dict[str, str]
) -> None:
    """Promise 1: an operator turning index mode off by unsetting BLACKBOX_STORE_TOPIC (and
    the mode) while references are pending: only the store topic holds their messages, so
    firing holds them back, never dead-letters them; with the store topic set again they
    are delivered whole."""
    env = _index(env)
    service = start_service(**_overrides(env))
    target, dead = reader(unique("target")), reader(env["BLACKBOX_DLQ_TOPIC"])
    send(env, {"id": "soon", "topic": target.topic, "message": "soon", "countdown": 3})
    wait_until(lambda: len(redis_pending(service)) == 1, what="stored")
    due_ms = Reference.decode(redis_pending(service)[sid("soon")]).due_ms
    service.stop()

    plain = start_service()  # the fixture's environment: no store topic, inline
    keys = plain.store.layout.keys_of(sid("soon"))

    def held_back() -> bool:
        score = plain.store.client.zscore(keys.due, sid("soon"))
        return score is not None and score > due_ms

    wait_until(held_back, 20, "claimed and held back")
    assert dead.read_to_end() == []
    plain.stop()
    # Due again at once rather than after UNSET_RETRY_MS (what a claim then would take).
    plain.store.client.zadd(keys.due, {sid("soon"): due_ms}, xx=True)

    start_service(**_overrides(env))
    delivered = target.wait_count(1, timeout=60)
    assert delivered[0].value == b"soon"
    assert dead.read_to_end() == []


def test_a_new_store_topic_filled_over_references_holds_their_messages(
    start_service: ServiceFactory, reader: ReaderFactory, env: dict[str, str], tmp_path: Path
) -> None:
    """Promise 1: moving a namespace in index mode to another store topic the documented
    way (the service refuses the new topic, `blackbox fill-store --yes`, start): the
    references Redis holds name records of the old topic, so filling the new one reads
    their messages back from the old one, writes them, and points Redis at the new
    records; none is dead-lettered as missing, each fires whole."""
    env = _index(env)
    service = start_service(**_overrides(env))
    target, dead = reader(unique("target")), reader(env["BLACKBOX_DLQ_TOPIC"])
    send(env, *[{"id": f"m-{n}", "topic": target.topic, "message": f"m-{n}", "countdown": 3600}
                for n in range(3)])  # fmt: skip
    wait_until(lambda: len(redis_pending(service)) == 3, what="stored")
    service.stop()

    moved = {**with_store_topic(env), "BLACKBOX_STORAGE_MODE": "index"}
    fill = BlackboxProcess(moved, tmp_path / "fill.log", "fill-store", "--yes")
    assert fill.wait(60) == 0, fill.output()
    again = start_service(**_overrides(moved))
    assert_store_matches(again, moved)  # Redis names the new topic's records
    send(moved, *[{"id": f"m-{n}", "reschedule": True, "countdown": 0} for n in range(3)])
    target.wait_for(lambda r: len(r) == 3 or dead.read_to_end() != [], timeout=30)
    assert dead.read_to_end() == []
    assert sorted(r.value or b"" for r in target.read_to_end()) == [b"m-0", b"m-1", b"m-2"]


def test_many_updates_cancels_recreates_and_moves_leave_redis_naming_the_latest_record(
    start_service: ServiceFactory, reader: ReaderFactory, env: dict[str, str]
) -> None:
    """Promise 2: ids updated many times in one poll and across polls, cancelled,
    created again plainly and `if_absent`, moved between: every reference names its id's
    latest store record, and what fires is the latest version, byte for byte."""
    env = _index(env)
    service = start_service(**_overrides(env))
    target, dead = reader(unique("target")), reader(env["BLACKBOX_DLQ_TOPIC"])
    t = target.topic
    names = [f"k{n}" for n in range(5)]

    def put(name: str, version: int, **more: object) -> dict[str, object]:
        return {"id": name, "topic": t, "message": f"{name}-v{version}", "countdown": 3600,
                **more}  # fmt: skip

    def move(name: str, countdown: float) -> dict[str, object]:
        return {"id": name, "reschedule": True, "countdown": countdown}

    for name in names:  # one poll each: creates, 19 updates, moves between
        send(env, put(name, 1), *[put(name, v) for v in range(2, 21)], move(name, 3000),
             put(name, 21), move(name, 2000))  # fmt: skip
    send(env, *[r for n in names for r in (
        {"id": n, "cancel": True}, put(n, 22, if_absent=True), put(n, 23),
        put(n, 24, if_absent=True), move(n, 1000))])  # fmt: skip
    for name in names:  # across polls
        send(env, put(name, 25))
        send(env, move(name, 1500))
        send(env, put(name, 26, if_absent=True), move(name, 1200))

    def moved_last(name: str) -> bool:
        shown = service.store.load(sid(name))
        return (
            shown is not None
            and shown.value.endswith(b"-v25")
            and (shown.due_ms < now_ms() + 1_300_000)
        )

    wait_until(lambda: all(moved_last(n) for n in names), 30, "the last moves")
    _settled(service, env)
    send(env, *[move(n, 0) for n in names])
    records = target.wait_count(len(names), timeout=30)
    assert sorted(r.value or b"" for r in records) == [f"{n}-v25".encode() for n in names]
    assert dead.read_to_end() == []


def test_intake_read_again_over_references_changes_nothing(
    start_service: ServiceFactory, reader: ReaderFactory, env: dict[str, str]
) -> None:
    """Promise 2: every intake record read again (a commit lost) after creates, updates,
    moves, cancels and derived ids stored as references: Redis keeps what it held, each
    reference names its id's latest store record, nothing is delivered twice or lost."""
    env = _index(env)
    service = start_service(**_overrides(env))
    target, dead = reader(unique("target")), reader(env["BLACKBOX_DLQ_TOPIC"])
    events = reader(env["BLACKBOX_EVENTS_TOPIC"])
    t = target.topic
    send(env, *[{"id": f"r{n}", "topic": t, "message": f"r{n}-v1", "countdown": 3600}
                for n in range(4)],
         *[{"topic": t, "message": f"derived-{n}", "countdown": 5} for n in range(3)])  # fmt: skip
    send(env, {"id": "r0", "topic": t, "message": "r0-v2", "countdown": 3600},
         {"id": "r1", "reschedule": True, "countdown": 4},
         {"id": "r2", "cancel": True},
         {"id": "r3", "topic": t, "message": "r3-v2", "countdown": 3600,
          "if_absent": True})  # fmt: skip
    events.wait_count(4 + 3 + 4)
    _settled(service, env)
    before = redis_pending(service)
    service.stop()
    rewind_intake(env)

    again = start_service(**_overrides(env))
    intake = (env["BLACKBOX_INTAKE_TOPIC"], 0)
    end = end_offset(env["KAFKA_BOOTSTRAP_SERVERS"], intake[0])
    committed = clients.committed_offsets(again.settings)
    wait_until(lambda: committed([intake])[intake] == end, 30, "everything read again")
    _settled(again, env)
    assert {k: Reference.decode(v).due_ms for k, v in redis_pending(again).items()} == {
        k: Reference.decode(v).due_ms for k, v in before.items()
    }
    target.wait_count(4, timeout=30)  # r1 and the derived ones
    records = target.read_to_end()
    assert sorted(r.value or b"" for r in records) == [
        b"derived-0", b"derived-1", b"derived-2", b"r1-v1"]  # fmt: skip
    assert {
        k: (again.store.load(k) or Schedule("", "", b"", 0)).value for k in (sid("r0"), sid("r3"))
    } == {sid("r0"): b"r0-v2", sid("r3"): b"r3-v1"}
    assert dead.read_to_end() == []


def test_a_flush_rebuilt_from_a_store_of_three_partitions_gives_back_each_reference(
    start_service: ServiceFactory, reader: ReaderFactory, env: dict[str, str],
    redis_client: redis.Redis,
) -> None:  # fmt: skip
    """Promise 1: a store topic of three partitions, ids updated and moved, FLUSHALL and
    `blackbox rebuild`: Redis gets back each reference as it was (partition, offset, due
    time), and a process with an empty cache fires each latest version from its partition."""
    store = unique("store")
    clients.ensure_topics({"bootstrap.servers": env["KAFKA_BOOTSTRAP_SERVERS"]}, [store], 3,
                          topic_config={"cleanup.policy": "compact"})  # fmt: skip
    env = {**env, "BLACKBOX_STORE_TOPIC": store, "BLACKBOX_STORAGE_MODE": "index"}
    service = start_service(**_overrides(env))
    target = reader(unique("target"))
    t = target.topic
    names = [f"p{n}" for n in range(30)]
    send(env, *[{"id": n, "topic": t, "message": f"{n}-v1", "countdown": 3600} for n in names])
    send(env, *[{"id": n, "topic": t, "message": f"{n}-v2", "countdown": 3600}
                for n in names[::2]],
         *[{"id": n, "reschedule": True, "countdown": 3000} for n in names[::3]])  # fmt: skip
    events = reader(env["BLACKBOX_EVENTS_TOPIC"])
    events.wait_count(len(names) + len(names[::2]) + len(names[::3]))  # each answered
    _settled(service, env)
    before = redis_pending(service)
    assert len({Reference.decode(v).partition for v in before.values()}) == 3
    service.stop()
    wipe_namespace(redis_client, service.settings.namespace)

    rebuild.rebuild(service.settings)

    assert redis_pending(service) == before
    again = start_service(**_overrides(env))
    send(env, *[{"id": n, "reschedule": True, "countdown": 0} for n in names])
    records = target.wait_count(len(names), timeout=30)
    assert sorted(r.value or b"" for r in records) == sorted(
        f"{n}-v2".encode() if i % 2 == 0 else f"{n}-v1".encode() for i, n in enumerate(names)
    )
    assert again.metrics.value("blackbox_store_records_missing_total") == 0


def test_a_dispatcher_with_an_empty_cache_reads_thousands_of_scattered_records_in_time(
    start_service: ServiceFactory, reader: ReaderFactory, env: dict[str, str]
) -> None:
    """Promise 6: 3,000 references due at one instant, their records scattered among as
    many others over a store of three partitions, fired by a dispatch-only process that
    never wrote them (an empty cache) in claims of 100: each is delivered once, whole,
    within seconds of its due time; none is taken for missing."""
    store = unique("store")
    clients.ensure_topics({"bootstrap.servers": env["KAFKA_BOOTSTRAP_SERVERS"]}, [store], 3,
                          topic_config={"cleanup.policy": "compact"})  # fmt: skip
    env = {**env, "BLACKBOX_STORE_TOPIC": store, "BLACKBOX_STORAGE_MODE": "index"}
    intake = start_service(Role.INTAKE, **_overrides(env))
    target, dead = reader(unique("target")), reader(env["BLACKBOX_DLQ_TOPIC"])
    count = 3000
    due_s = time.time() + 15
    send(env, *[r for n in range(count) for r in (
        {"id": f"due-{n}", "topic": target.topic, "message": f"due-{n}", "deliver_at": due_s},
        {"id": f"noise-{n}", "topic": target.topic, "message": "n" * 200, "countdown": 3600},
    )])  # fmt: skip
    wait_until(lambda: len(redis_pending(intake)) == 2 * count, 12, "stored")
    intake.stop()
    dispatcher = start_service(Role.DISPATCH, **_overrides(env), BLACKBOX_BATCH_LIMIT="100")
    records = target.wait_count(count, timeout=45)
    late_s = max(r.received_ms for r in records) / 1000 - due_s
    assert sorted(r.value or b"" for r in target.read_to_end()) == sorted(
        f"due-{n}".encode() for n in range(count)
    )
    assert dead.read_to_end() == []
    assert dispatcher.metrics.value("blackbox_store_records_missing_total") == 0

    assert late_s < 10, f"the last was delivered {late_s:.1f} s after its due time"


def test_the_api_shows_moves_and_cancels_referenced_schedules_of_any_bytes(
    start_service: ServiceFactory, reader: ReaderFactory, env: dict[str, str]
) -> None:
    """The API over references: GET and the listing show binary messages, keys and
    headers whole; a derived id moved by the admin path (Redis alone) fires whole at its
    new time; one cancelled is not delivered; a reference whose record is missing is a
    404 and left out of the listing, never a 500."""
    env = {**_index(env), "BLACKBOX_API_TOKEN": TOKEN}
    service = start_service(**_overrides(env), BLACKBOX_API_TOKEN=TOKEN)
    target = reader(unique("target"))
    value = bytes(range(256)) * 3
    encoded = base64.b64encode(value).decode()
    send(env, *[{"topic": target.topic, "message_base64": encoded, "key": f"k{n}",
                 "headers": {"h": f"v{n}"}, "countdown": 3600} for n in range(3)],
         {"id": "own", "topic": target.topic, "message_base64": encoded,
          "countdown": 3600})  # fmt: skip
    wait_until(lambda: len(redis_pending(service)) == 4, what="stored")
    derived = sorted(i for i in redis_pending(service) if not i.startswith("@"))
    assert service.endpoints is not None
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=f"http://127.0.0.1:{service.endpoints.port}/api/v1",
                      headers=auth, timeout=15) as api:  # fmt: skip
        for schedule_id in [*derived, sid("own")]:
            shown = api.get(f"/schedules/{schedule_id}")
            assert shown.status_code == 200, shown.text
            assert base64.b64decode(shown.json()["value_base64"]) == value
        listed = api.get("/schedules").json()["items"]
        assert {i["blackbox_id"]: i["size"] for i in listed} == {
            i: len(value) for i in [*derived, sid("own")]
        }
        moved = api.post(f"/schedules/{derived[0]}/reschedule", json={"countdown": 1})
        assert moved.status_code == 200, moved.text
        assert api.delete(f"/schedules/{derived[1]}").status_code == 200
        record = target.wait_count(1, timeout=20)[0]
        assert (record.value, record.key, record.header("h")) == (value, b"k0", "v0")

        key = service.store.layout.keys_of(derived[2]).payload(derived[2])
        ref = Reference.decode(service.store.client.get(key))  # type: ignore[arg-type]
        wrong = Reference(ref.due_ms, ref.partition, ref.offset + 100, ref.size, ref.caller)
        service.store.client.set(key, wrong.encode(), keepttl=True)
        assert api.get(f"/schedules/{derived[2]}").status_code == 404
        listed = api.get("/schedules").json()["items"]
        assert derived[2] not in {i["blackbox_id"] for i in listed}
