"""Index mode on the real stack (BLACKBOX_STORAGE_MODE=index): Redis keeps a reference of
a few dozen bytes per one-off schedule, whatever its message; what fires is the store's
record, byte for byte, read back by a process that never wrote it; the API shows the whole
message; a reference whose record is missing is dead-lettered with a reason of its own,
counted, never skipped in silence."""

from __future__ import annotations

import base64
from typing import Any

import httpx
import orjson

from blackbox.envelope import CALLER_HEADER
from blackbox.reference import Reference, is_reference
from blackbox.service import Service
from tests.integration.conftest import ReaderFactory, ServiceFactory, with_store_topic
from tests.integration.test_store_topic import redis_pending
from tests.kafkatools import produce, unique, wait_until

CALLER = "shop"
TOKEN = "index-token-0123456789abcdef"  # noqa: S105 - a test token
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def _index_env(env: dict[str, str]) -> dict[str, str]:
    return {**with_store_topic(env), "BLACKBOX_STORAGE_MODE": "index",
            "BLACKBOX_API_TOKEN": TOKEN}  # fmt: skip


def _start(start_service: ServiceFactory, env: dict[str, str]) -> Service:
    return start_service(**{k: v for k, v in env.items() if k.startswith("BLACKBOX_")})


def _send(env: dict[str, str], *documents: dict[str, Any]) -> None:
    produce(
        env["KAFKA_BOOTSTRAP_SERVERS"], env["BLACKBOX_INTAKE_TOPIC"],
        [orjson.dumps(d) for d in documents], [(CALLER_HEADER, CALLER.encode())],
    )  # fmt: skip


def test_a_reference_fires_the_stores_record_byte_for_byte_from_another_process(
    start_service: ServiceFactory, reader: ReaderFactory, env: dict[str, str]
) -> None:
    """4 KB binary messages with keys and headers are kept in Redis as references of the
    same small size whatever the message; the API shows each whole; after a restart (an
    empty cache: each record read back from the store topic) each is delivered exactly as
    sent, one of them moved first."""
    env = _index_env(env)
    service = _start(start_service, env)
    target = reader(unique("target"))
    messages = {f"m-{n}": bytes([n]) * 2048 + bytes(range(256)) * 8 for n in range(8)}
    _send(env, *[
        {"id": name, "topic": target.topic, "message_base64": base64.b64encode(value).decode(),
         "key": f"key-{name}", "headers": {"trace": f"t-{name}"}, "countdown": 4}
        for name, value in messages.items()
    ])  # fmt: skip
    _send(env, {"id": "m-0", "reschedule": True, "countdown": 5})
    wait_until(lambda: len(redis_pending(service)) == 8, what="stored")
    held = redis_pending(service)
    assert all(is_reference(raw) for raw in held.values())
    # 28 bytes and the caller's: what a one-off costs Redis beside its key, whatever its size
    assert {len(raw) for raw in held.values()} == {28 + len(CALLER)}
    assert all(Reference.decode(raw).size > 4096 for raw in held.values())

    assert service.endpoints is not None
    with httpx.Client(base_url=f"http://127.0.0.1:{service.endpoints.port}", timeout=15) as api:
        shown = api.get(f"/api/v1/schedules/@{CALLER}/m-3", headers=AUTH).json()
        assert base64.b64decode(shown["value_base64"]) == messages["m-3"]
        listed = api.get("/api/v1/schedules", params={"caller": CALLER}, headers=AUTH).json()
        assert {i["blackbox_id"]: i["size"] for i in listed["items"]} == {
            f"@{CALLER}/{name}": len(value) for name, value in messages.items()
        }
    service.stop()

    again = _start(start_service, env)  # its cache empty: every record is read back
    records = target.wait_count(8, timeout=30)
    assert {(r.key, r.value, r.headers["trace"]) for r in records} == {
        (f"key-{name}".encode(), value, f"t-{name}".encode()) for name, value in messages.items()
    }
    assert again.metrics.value("blackbox_store_reads_total", {"source": "topic"}) >= 8
    assert again.metrics.value("blackbox_store_records_missing_total") == 0


def test_a_reference_whose_record_is_missing_is_dead_lettered_and_counted(
    start_service: ServiceFactory, reader: ReaderFactory, env: dict[str, str]
) -> None:
    """A reference naming a place that holds another id's record, or one past the
    partition's end (as after the store was emptied or recreated), is dead-lettered as
    store_record_missing and counted; the others of its claim are delivered."""
    env = _index_env(env)
    service = _start(start_service, env)
    target, dead = reader(unique("target")), reader(env["BLACKBOX_DLQ_TOPIC"])
    _send(env, *[{"id": f"m-{n}", "topic": target.topic, "message": f"v-{n}", "countdown": 3}
                 for n in range(3)])  # fmt: skip
    wait_until(lambda: len(redis_pending(service)) == 3, what="stored")
    key = service.store.layout.keys_of(f"@{CALLER}/m-1").payload(f"@{CALLER}/m-1")
    ref = Reference.decode(service.store.client.get(key))  # type: ignore[arg-type]
    other = Reference.decode(redis_pending(service)[f"@{CALLER}/m-2"])
    wrong = Reference(ref.due_ms, other.partition, other.offset, ref.size, ref.caller)
    service.store.client.set(key, wrong.encode(), keepttl=True)
    # And one past the partition's end (the topic recreated smaller): missing too.
    key_0 = service.store.layout.keys_of(f"@{CALLER}/m-0").payload(f"@{CALLER}/m-0")
    ref_0 = Reference.decode(service.store.client.get(key_0))  # type: ignore[arg-type]
    beyond = Reference(ref_0.due_ms, ref_0.partition, ref_0.offset + 10_000, ref_0.size,
                       ref_0.caller)  # fmt: skip
    service.store.client.set(key_0, beyond.encode(), keepttl=True)

    letters = dead.wait_count(2, timeout=30)
    assert {r.header("blackbox-dlq-reason") for r in letters} == {"store_record_missing"}
    assert {r.header("blackbox-id") for r in letters} == {f"@{CALLER}/m-0", f"@{CALLER}/m-1"}
    delivered = target.wait_count(1, timeout=30)
    assert [r.value for r in delivered] == [b"v-2"]
    assert service.metrics.value("blackbox_store_records_missing_total") == 2


def test_what_falls_due_soon_is_read_ahead_before_it_is_due(
    start_service: ServiceFactory, reader: ReaderFactory, env: dict[str, str]
) -> None:
    """A process that never wrote the records (restarted: its cache empty) reads those of
    what falls due within the read-ahead window from the store topic before they are due,
    so firing them reads nothing back then."""
    env = _index_env(env)
    service = _start(start_service, env)
    target = reader(unique("target"))
    _send(env, *[{"id": f"m-{n}", "topic": target.topic, "message": f"v-{n}", "countdown": 8}
                 for n in range(20)])  # fmt: skip
    wait_until(lambda: len(redis_pending(service)) == 20, what="stored")
    service.stop()
    again = _start(start_service, env)

    def read_ahead() -> bool:
        return again.metrics.value("blackbox_store_reads_total", {"source": "topic"}) >= 20

    wait_until(read_ahead, 8, "the records read before they are due")
    assert target.read_to_end(timeout=1) == [], "read ahead, not fired early"
    delivered = target.wait_count(20, timeout=30)
    assert sorted(r.value or b"" for r in delivered) == sorted(f"v-{n}".encode() for n in range(20))
    # The claims found every record in the cache: nothing more was read from the topic.
    assert again.metrics.value("blackbox_store_reads_total", {"source": "topic"}) == 20
    assert again.metrics.value("blackbox_store_reads_total", {"source": "cache"}) >= 20
