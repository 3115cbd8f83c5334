"""The Lua scripts on a real Redis: updates and cancels that meet an id in flight, ended
markers, and re-read intake records."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import redis

from blackbox.clock import now_ms
from blackbox.dev.servers import RedisServer
from blackbox.schedule import Schedule, scoped_id
from blackbox.storage.applying import SCRIPT_CHUNK, Applied, Cancellation, IntakeSlice, Write
from blackbox.storage.keys import Layout
from blackbox.storage.store import Acks, RedisStore
from tests.kafkatools import unique, wait_until

ID = scoped_id(b"svc", "order-1")


@pytest.fixture
def store(redis_server: RedisServer) -> Iterator[RedisStore]:
    client = redis.Redis.from_url(redis_server.url)
    yield RedisStore(client, Layout(unique("ns")), grace_seconds=60)
    client.close()


class Intake:
    """Feeds one intake partition to the store, offset after offset."""

    def __init__(self, store: RedisStore) -> None:
        self.store, self.offset = store, -1

    def send(self, write: Write) -> Applied:
        self.offset += 1
        (code,) = self.store.apply([IntakeSlice("in", 0, self.offset, [(self.offset, write)])],
                                   now_ms())  # fmt: skip
        return code

    def replay(self, offset: int, write: Write) -> Applied:
        (code,) = self.store.apply([IntakeSlice("in", 0, offset, [(offset, write)])], now_ms())
        return code


def _version(value: bytes, due_ms: int, offset: int) -> Schedule:
    return Schedule(ID, "orders", value, due_ms, b"svc", origin=f"in:0:{offset}")


def _state(store: RedisStore) -> tuple[bool, bool, bytes | None, bytes | None]:
    """(in due, in flight, payload, ended marker) of ID."""
    client, keys = store.client, store.layout.shards[0]
    payload, ended = client.mget([keys.payload(ID), keys.ended(ID)])
    assert not isinstance(payload, str) and not isinstance(ended, str)
    return (
        client.zscore(keys.due, ID) is not None,
        client.zscore(keys.in_flight, ID) is not None,
        payload,
        ended,
    )


def test_an_update_while_in_flight_is_queued_and_survives_the_old_ack(store: RedisStore) -> None:
    """The firing version is acked; the new version stays due with its payload."""
    intake, now = Intake(store), now_ms()
    assert intake.send(_version(b"v1", now - 1, 0)) is Applied.SCHEDULED
    claim = store.claim_due(now_ms(), 10, 30_000)
    assert claim.ids == [ID]

    assert intake.send(_version(b"v2", now + 60_000, 1)) is Applied.SCHEDULED
    assert store.ack([ID], claim.token) == 1

    in_due, in_flight, payload, ended = _state(store)
    assert (in_due, in_flight, ended) == (True, False, None)
    assert payload is not None
    assert Schedule.decode(ID, payload).value == b"v2"


def test_a_claim_reads_payloads_attempts_and_markers_with_the_ids(store: RedisStore) -> None:
    """One call takes the due ids and reads what firing them needs: the version claimed,
    the failed attempts so far, and for a caller's id its ended marker."""
    intake, now = Intake(store), now_ms()
    intake.send(_version(b"v1", now - 1, 0))
    first = store.claim_due(now_ms(), 10, 30_000)
    assert [(i.id, i.payload, i.attempts, i.ended) for i in first.loaded] == [
        (ID, _version(b"v1", now - 1, 0).encode(), 0, None)
    ]
    store.retry([ID], first.token, now_ms() - 1)

    (loaded,) = store.claim_due(now_ms(), 10, 30_000).loaded
    assert (loaded.attempts, loaded.ended) == (1, None)
    assert Schedule.decode(ID, loaded.payload or b"").value == b"v1"


def test_a_claim_of_several_ids_keeps_each_ones_payload_attempts_and_marker_aligned(
    store: RedisStore,
) -> None:
    """A payload gone, attempts on one id only, a marker on a caller's id: each lands on
    its own id (a hole in the script's lists would shift the ones after it)."""
    client, keys, due = store.client, store.layout.shards[0], now_ms() - 10
    plain, retried, caller = "in:0:0", "in:0:1", ID
    client.zadd(keys.due, {plain: due, retried: due + 1, caller: due + 2})
    client.set(keys.payload(retried), b"r")
    client.set(keys.payload(caller), b"c")
    client.hset(keys.attempts, retried, 2)
    client.set(keys.ended(caller), b"c")

    claim = store.claim_due(now_ms(), 10, 30_000)

    assert [(i.id, i.payload, i.attempts, i.ended) for i in claim.loaded] == [
        (plain, None, 0, None), (retried, b"r", 2, None), (caller, b"c", 0, b"c"),
    ]  # fmt: skip
    assert claim.ids == [plain, retried, caller]


def test_an_update_after_the_claim_leaves_the_claimed_version_to_fire(store: RedisStore) -> None:
    """The claim holds the version it read; the update waits, due, behind it."""
    intake, now = Intake(store), now_ms()
    intake.send(_version(b"v1", now - 1, 0))
    claim = store.claim_due(now_ms(), 10, 30_000)
    intake.send(_version(b"v2", now + 60_000, 1))

    (loaded,) = claim.loaded
    assert Schedule.decode(ID, loaded.payload or b"").value == b"v1"
    assert store.client.zscore(store.layout.shards[0].due, ID) == now + 60_000


def test_a_released_id_goes_back_to_its_due_time_untouched(store: RedisStore) -> None:
    """What the dispatcher does with a claimed payload due later than the claim."""
    intake, now = Intake(store), now_ms()
    intake.send(_version(b"v1", now - 1, 0))
    claim = store.claim_due(now_ms(), 10, 30_000)
    (loaded,) = claim.loaded

    assert store.release([(ID, now + 60_000)], claim.token) == 1

    assert store.client.zscore(store.layout.shards[0].due, ID) == now + 60_000
    assert _state(store)[1:3] == (False, loaded.payload)


def test_a_cancel_while_a_failed_attempt_holds_the_id_is_honoured(store: RedisStore) -> None:
    """A retry brings the id back; the "c" marker makes the dispatcher drop it, and the
    acks that follow keep the answer `cancelled`."""
    intake, now = Intake(store), now_ms()
    intake.send(_version(b"v1", now - 1, 0))
    first = store.claim_due(now_ms(), 10, 30_000)
    intake.send(_version(b"v2", now + 3_600_000, 1))
    assert intake.send(Cancellation(ID)) is Applied.CANCELLED
    assert store.retry([ID], first.token, now_ms() - 1) == 1  # the v1 attempt failed

    second = store.claim_due(now_ms(), 10, 30_000)
    (loaded,) = second.loaded
    assert loaded.ended == b"c"
    assert store.ack([ID], second.token) == 1

    assert _state(store) == (False, False, None, b"c")
    assert intake.send(Cancellation(ID)) is Applied.CANCELLED


def test_a_fired_id_answers_already_fired_then_can_be_scheduled_anew(store: RedisStore) -> None:
    intake, now = Intake(store), now_ms()
    intake.send(_version(b"v1", now - 1, 0))
    claim = store.claim_due(now_ms(), 10, 30_000)
    store.ack([ID], claim.token)

    assert intake.send(Cancellation(ID)) is Applied.ALREADY_FIRED
    assert intake.send(_version(b"v2", now + 60_000, 2)) is Applied.SCHEDULED
    assert _state(store)[3] is None
    assert intake.send(Cancellation(ID)) is Applied.CANCELLED


def test_a_cancel_of_an_unknown_id_is_not_found(store: RedisStore) -> None:
    assert Intake(store).send(Cancellation(ID)) is Applied.NOT_FOUND


def test_a_re_read_changes_nothing_but_answers_a_cancel_again(store: RedisStore) -> None:
    """Records at or below the watermark are not applied twice; a cancel is answered again."""
    intake, now = Intake(store), now_ms()
    intake.send(_version(b"v1", now + 60_000, 0))
    intake.send(Cancellation(ID))
    intake.send(Cancellation(scoped_id(b"svc", "never-existed")))

    assert intake.replay(0, _version(b"v1", now + 60_000, 0)) is Applied.REPLAYED
    assert _state(store) == (False, False, None, b"c")
    assert intake.replay(1, Cancellation(ID)) is Applied.CANCELLED
    assert intake.replay(2, Cancellation(scoped_id(b"svc", "never-existed"))) is Applied.REPLAYED


def test_a_re_read_of_a_schedule_still_pending_is_answered_again(store: RedisStore) -> None:
    """Guarantee 2: a re-read request whose id is still pending changes nothing and is
    answered again (the replica that stored it may have died before answering); one whose
    id fired or is gone is replayed silently."""
    intake, now = Intake(store), now_ms()
    intake.send(_version(b"v1", now + 60_000, 0))
    assert intake.replay(0, _version(b"v2", now + 1, 0)) is Applied.REREAD_PENDING
    assert b"v1" in (_state(store)[2] or b"")  # v1 stays, v2 is not applied


def test_an_update_of_a_pending_id_replaces_payload_and_due_time(store: RedisStore) -> None:
    intake, now = Intake(store), now_ms()
    intake.send(_version(b"v1", now + 60_000, 0))

    assert intake.send(_version(b"v2", now + 5_000, 1)) is Applied.UPDATED

    assert store.client.zscore(store.layout.shards[0].due, ID) == now + 5_000
    assert Schedule.decode(ID, _state(store)[2] or b"").value == b"v2"


def test_intake_survives_redis_losing_its_script_cache(store: RedisStore) -> None:
    """Guarantee 5: after a Redis restart (scripts flushed), intake loads its script again
    and applies the request once, rather than failing until the service restarts."""
    intake = Intake(store)
    assert intake.send(_version(b"v1", now_ms() + 60_000, 0)) is Applied.SCHEDULED
    store.client.script_flush()
    assert intake.send(Cancellation(ID)) is Applied.CANCELLED
    assert _state(store) == (False, False, None, b"c")
    assert store.client.ping()  # the connection the failed call dropped was replaced


def test_a_chunk_whose_predecessor_failed_applies_nothing(store: RedisStore) -> None:
    """Guarantee 1: a batch of one partition larger than a script call is applied chunk by
    chunk; if an earlier chunk's call failed (NOSCRIPT after a restart, out of memory),
    the later one must not move the watermark past it, or the retry would skip it."""
    due = now_ms() + 60_000
    items = [(o, Schedule(f"in:0:{o}", "orders", b"v", due)) for o in range(SCRIPT_CHUNK + 100)]
    whole = IntakeSlice("in", 0, SCRIPT_CHUNK + 99, items)
    (_, _, first_mark), (second, after, mark) = list(whole.chunks(list(enumerate(items))))
    assert after == first_mark == SCRIPT_CHUNK - 1 and mark == SCRIPT_CHUNK + 99

    call = store.intake.evalsha(*store.intake.chunk_call(whole, 0, second, (after, mark), now_ms()))
    store.client.script_load(store.intake.text)  # whichever test runs first
    with pytest.raises(redis.ResponseError, match="BLACKBOX_GAP"):
        store.client.execute_command("EVALSHA", *call)  # type: ignore[no-untyped-call]
    assert store.counts() == (0, 0)
    assert store.client.hget(store.layout.shards[0].intake_marks, whole.field) is None

    codes = store.apply([whole], now_ms())
    assert codes == [Applied.SCHEDULED] * (SCRIPT_CHUNK + 100)
    assert store.counts() == (SCRIPT_CHUNK + 100, 0)


def test_a_namespace_beyond_ascii_keeps_ids_whole(redis_server: RedisServer) -> None:
    """Ids are cut from payload keys in bytes: a non-ASCII namespace must not shift them."""
    client = redis.Redis.from_url(redis_server.url)
    store = RedisStore(client, Layout(unique("né-ß")), grace_seconds=60)
    due = now_ms() - 1
    store.apply([IntakeSlice("in", 0, 0, [(0, Schedule("in:0:0", "orders", b"v", due))])], due)
    claim = store.claim_due(now_ms(), 10, lease_ms=30_000)
    assert claim.ids == ["in:0:0"]
    (loaded,) = claim.loaded
    assert loaded.payload is not None
    assert Schedule.decode(loaded.id, loaded.payload).value == b"v"
    client.close()


def _plain(offsets: range, due_ms: int, partition: int = 0) -> list[tuple[int, Write]]:
    return [(o, Schedule(f"in:{partition}:{o}", "orders", b"v", due_ms)) for o in offsets]


def test_parts_sent_in_one_session_answer_in_the_order_sent(store: RedisStore) -> None:
    """Guarantee 2: intake sends a batch part by part, Redis applying one while the next is
    parsed; every request is applied once and answered in the order it was sent."""
    due = now_ms() + 60_000
    with store.applying(now_ms()) as applying:
        applying.send([IntakeSlice("in", 0, 9, _plain(range(10), due)),
                       IntakeSlice("in", 1, 4, _plain(range(5), due, partition=1))])  # fmt: skip
        applying.send([IntakeSlice("in", 0, 19, _plain(range(5, 20), due))])  # 5-9 re-read
        codes = applying.codes()

    reread = [Applied.REREAD_PENDING] * 5  # pending still: answered again, nothing stored
    assert codes == [Applied.SCHEDULED] * 15 + reread + [Applied.SCHEDULED] * 10
    assert store.counts() == (25, 0)
    assert store.client.hmget(store.layout.shards[0].intake_marks, ["in:0", "in:1"]) == [
        b"19",
        b"4",
    ]


def test_a_part_whose_predecessor_failed_moves_no_watermark(store: RedisStore) -> None:
    """Guarantee 1: if an earlier part's script call failed, a later part of the same
    partition must not move the watermark past it, or the retry would skip its records as
    re-reads. The later part here holds only refused records: a bare watermark move."""
    store.client.set(store.layout.shards[0].due, "not a sorted set")  # the first part's call fails
    with (
        pytest.raises(redis.ResponseError, match="BLACKBOX_CORRUPT"),
        store.applying(now_ms()) as applying,
    ):
        applying.send([IntakeSlice("in", 0, 9, _plain(range(10), now_ms()))])
        applying.send([IntakeSlice("in", 0, 19, [])])
        applying.codes()

    assert store.client.hget(store.layout.shards[0].intake_marks, "in:0") is None
    assert store.client.ping()  # the connection left with unread replies was replaced


def test_a_health_check_falling_due_between_parts_reads_no_reply_of_ours(
    redis_server: RedisServer,
) -> None:
    """Guarantee 5: redis-py PINGs a connection idle past its health-check interval before
    sending on it; between two parts that PING would read the first part's reply, fail,
    and pause intake for nothing. The session checks once, before it sends anything."""
    client = redis.Redis.from_url(redis_server.url, health_check_interval=10)
    store = RedisStore(client, Layout(unique("ns")), grace_seconds=60)
    due = now_ms() + 60_000
    with store.applying(now_ms()) as applying:
        applying.send([IntakeSlice("in", 0, 9, _plain(range(10), due))])
        (lane,) = applying._lanes.values()
        lane.connection.next_health_check = 0  # as if a dead letter waited 10 s
        applying.send([IntakeSlice("in", 0, 19, _plain(range(10, 20), due))])
        codes = applying.codes()

    assert codes == [Applied.SCHEDULED] * 20
    client.close()


def test_a_script_cache_lost_mid_session_resends_only_what_did_not_run(store: RedisStore) -> None:
    """Guarantee 5: when Redis loses its scripts between two parts (a restart), the part
    that met NOSCRIPT is sent again; the part that had run keeps its codes, so its
    requests are still answered as scheduled rather than as re-reads."""
    due = now_ms() + 60_000
    store.apply([IntakeSlice("other", 0, 0, [])], now_ms())  # the script is loaded
    with store.applying(now_ms()) as applying:
        applying.send([IntakeSlice("in", 0, 9, _plain(range(10), due))])
        wait_until(lambda: store.counts() == (10, 0), what="the first part applied")
        store.client.script_flush()
        applying.send([IntakeSlice("in", 0, 19, _plain(range(10, 20), due))])
        codes = applying.codes()

    assert codes == [Applied.SCHEDULED] * 20
    assert store.counts() == (20, 0)


def test_a_claim_larger_than_one_lease_chunk_leases_every_id_with_its_payload(
    store: RedisStore,
) -> None:
    """Guarantee 3: the claim leases ids 1,000 at a time; a claim of 2,500 (the batch limit
    goes up to 10,000) moves every one to in flight, each with its own payload."""
    due = now_ms() - 1
    items = [(o, Schedule(f"in:0:{o}", "orders", str(o).encode(), due)) for o in range(2500)]
    store.apply([IntakeSlice("in", 0, 2499, items)], now_ms())

    claim = store.claim_due(now_ms(), 2500, lease_ms=30_000)

    assert len(claim.ids) == 2500 and store.counts() == (0, 2500)
    values = {i.id: Schedule.decode(i.id, i.payload or b"").value for i in claim.loaded}
    assert values == {f"in:0:{o}": str(o).encode() for o in range(2500)}
    assert store.ack(claim.ids, claim.token) == 2500


LateCall = Callable[[RedisStore, float], int]
LATE_CALLS: dict[str, LateCall] = {
    "ack": lambda store, token: store.ack([ID], token),
    "retry": lambda store, token: store.retry([ID], token, now_ms() - 1),
    "release": lambda store, token: store.release([(ID, now_ms() - 1)], token),
}


@pytest.mark.parametrize("call", LATE_CALLS.values(), ids=LATE_CALLS.keys())
def test_a_stale_lease_token_moves_nothing(store: RedisStore, call: LateCall) -> None:
    """Guarantee 3: a replica whose lease expired and whose id was claimed again cannot ack,
    retry or release it: the id, its payload and the new lease stay with the new owner."""
    intake, now = Intake(store), now_ms()
    intake.send(_version(b"v1", now - 1, 0))
    first = store.claim_due(now, 10, lease_ms=1)
    assert store.reclaim(now + 2, 10) == 1  # the first replica's lease ran out
    second = store.claim_due(now + 3, 10, lease_ms=30_000)
    assert second.ids == [ID]
    before = _lease(store)
    assert before[1:3] == (second.token, b"1")  # the expired lease counted as an attempt

    assert call(store, first.token) == 0
    assert call(store, second.token + 1) == 0

    assert _lease(store) == before


def _lease(store: RedisStore) -> tuple[object, ...]:
    """(state, lease score, attempts) of ID."""
    client, keys = store.client, store.layout.shards[0]
    return _state(store), client.zscore(keys.in_flight, ID), client.hget(keys.attempts, ID)


def test_a_fired_marker_is_forgotten_after_its_retention(redis_server: RedisServer) -> None:
    """The already_fired marker lives BLACKBOX_FIRED_RETENTION seconds, then expires (a cancel
    then answers not_found): fired ids do not pile up in Redis."""
    client = redis.Redis.from_url(redis_server.url)
    store = RedisStore(client, Layout(unique("ns")), grace_seconds=60, ended_retention_seconds=1)
    Intake(store).send(_version(b"v1", now_ms() - 1, 0))
    claim = store.claim_due(now_ms(), 10, 30_000)
    assert store.ack([ID], claim.token) == 1

    assert client.get(store.layout.shards[0].ended(ID)) == b"f"
    assert 0 < client.pttl(store.layout.shards[0].ended(ID)) <= 1000
    wait_until(
        lambda: not client.exists(store.layout.shards[0].ended(ID)), timeout=5, what="expiry"
    )
    client.close()


def test_two_claims_in_one_millisecond_hold_different_leases(store: RedisStore) -> None:
    """Guarantee 3: an id updated while in flight and claimed again in the same millisecond
    with the same lease gets a lease token of its own, so the first claim's ack finds its
    lease lost and leaves the second claimer's lease (and the new version) alone."""
    intake, now = Intake(store), now_ms()
    intake.send(_version(b"v1", now - 1, 0))
    first = store.claim_due(now, 10, 30_000)
    intake.send(_version(b"v2", now - 1, 1))  # the update is due at once
    second = store.claim_due(now, 10, 30_000)
    assert second.ids == [ID]

    assert first.token != second.token
    assert store.ack([ID], first.token) == 0
    assert _state(store)[1]  # still in flight, under the second claim
    assert store.ack([ID], second.token) == 1


def test_a_claim_is_bounded_by_payload_bytes(store: RedisStore) -> None:
    """A claim takes ids while their payloads fit in `max_bytes` (one at least, whatever
    its size), so 1,000 payloads of 1 MiB are never held at once; what it left is due and
    said so (`more`), and the next claims take it."""
    now = now_ms()
    writes = [(o, Schedule(f"in:0:{o}", "orders", bytes(100_000), now - 1000 + o))
              for o in range(10)]  # fmt: skip
    store.apply([IntakeSlice("in", 0, 9, writes)], now)

    first = store.claim_due(now, 1000, 30_000, max_bytes=350_000)
    assert first.ids == ["in:0:0", "in:0:1", "in:0:2"]
    assert first.more
    alone = store.claim_due(now, 1000, 30_000, max_bytes=10)
    assert alone.ids == ["in:0:3"]
    rest = store.claim_due(now, 1000, 30_000, max_bytes=10_000_000)
    assert len(rest.ids) == 6
    assert not rest.more


def test_a_new_id_whose_key_holds_a_stray_value_is_refused_not_taken_for_applied(
    store: RedisStore,
) -> None:
    """Issue 50: a new id's key already holding a value blackbox did not write was answered
    as applied before (SET NX failed), and the schedule was never due. Now the call is
    refused (BLACKBOX_CORRUPT) until the key is gone; the same version written before (a
    call that failed before its watermark moved, read again) is still no refusal."""
    new = Schedule("derived-1", "orders", b"v", now_ms() + 60_000, b"svc")
    keys, intake = store.layout.shards[0], Intake(store)
    store.client.set(keys.payload(new.id), b"stray")
    with pytest.raises(redis.ResponseError, match="BLACKBOX_CORRUPT"):
        intake.send(new)
    store.client.delete(keys.payload(new.id))
    store.client.hset(keys.payload(new.id), "a", "b")  # another type altogether
    with pytest.raises(redis.ResponseError, match="BLACKBOX_CORRUPT"):
        intake.send(new)
    store.client.delete(keys.payload(new.id))
    store.client.set(keys.payload(new.id), new.encode())  # written by a call that then failed
    assert intake.send(new) is Applied.REPLAYED
    store.client.delete(keys.payload(new.id))
    assert intake.send(new) is Applied.SCHEDULED


def test_an_ack_tells_which_ids_ended_and_whether_a_cancel_did(store: RedisStore) -> None:
    """The store topic's tombstones come from the ack (ack.lua): an id delivered ends
    ("fired"), one cancelled while it flew ends as cancelled, one updated while it flew is
    due again and does not end, one whose lease was lost is another's to tell."""
    intake, now = Intake(store), now_ms()
    ids = ["@svc/done", "@svc/cancelled", "@svc/updated", "in:0:9"]
    for schedule_id in ids:
        assert intake.send(Schedule(schedule_id, "t", b"v1", now - 1, b"svc")) is Applied.SCHEDULED
    claim = store.claim_due(now_ms(), 10, 30_000)
    assert sorted(claim.ids) == sorted(ids)
    # A cancel of a one-off in flight is answered already_fired (it is being delivered);
    # one the dispatcher found cancelled before it produced it left its "c" marker.
    assert intake.send(Cancellation("@svc/done")) is Applied.ALREADY_FIRED
    keys = store.layout.shards[0]
    store.client.set(keys.ended("@svc/cancelled"), "c")
    assert intake.send(Schedule("@svc/updated", "t", b"v2", now + 60_000, b"svc")) is not None
    ended: list[tuple[str, bool]] = []
    assert store.ack_all([Acks(claim.ids, claim.token, 0)], ended) == [4]
    assert sorted(ended) == [("@svc/cancelled", True), ("@svc/done", False), ("in:0:9", False)]
    again: list[tuple[str, bool]] = []
    assert store.ack_all([Acks(["@svc/done"], claim.token, 0)], again) == [0]
    assert again == []  # no longer in flight under that lease: nothing to tell
