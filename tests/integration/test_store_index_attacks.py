"""Attacks on index mode (BLACKBOX_STORAGE_MODE=index) on the real stack: a caller's id
created if absent and moved in one poll, claims of big messages held as small references,
mode switches. After each, every reference Redis keeps names its id's latest store record
(the one compaction keeps), and what fires is the latest version byte for byte."""

from __future__ import annotations

from blackbox.clock import now_ms
from blackbox.service import Service
from tests.integration.conftest import ReaderFactory, ServiceFactory, with_store_topic
from tests.integration.store_attack_tools import send, sid
from tests.integration.test_store_topic import assert_store_matches, redis_pending
from tests.kafkatools import unique, wait_until


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
