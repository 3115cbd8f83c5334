"""Quotas: a caller with `max_pending` schedules pending has its next new ones refused as
`over_quota`, while its updates and cancels, and every other caller, go on; room comes back
as its schedules fire or are cancelled."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
import redis
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from blackbox.clock import now_ms
from blackbox.envelope import CALLER_HEADER, Header
from blackbox.errors import DeadLetterReason
from blackbox.signing import Parts, Signer, public_text
from tests.integration.conftest import ReaderFactory, ServiceFactory
from tests.kafkatools import Received, produce, rewind_intake, unique

pytestmark = pytest.mark.both_store_modes  # the storage-touching tests: both modes

POLICY = """
default:
  topics: ["*"]
callers:
  greedy:
    max_pending: 5
  calm: {}
"""


def _send(env: dict[str, str], caller: str, *documents: dict[str, Any]) -> list[bytes]:
    values = [orjson.dumps(d) for d in documents]
    produce(env["KAFKA_BOOTSTRAP_SERVERS"], env["BLACKBOX_INTAKE_TOPIC"], values,
            [(CALLER_HEADER, caller.encode())])  # fmt: skip
    return values


def _answers(records: list[Received]) -> list[dict[str, Any]]:
    return [orjson.loads(r.value or b"") for r in records]


def _outcomes(events: list[dict[str, Any]], caller: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for event in events:
        if event.get("caller") == caller:
            found.setdefault(str(event.get("id")), []).append(str(event["outcome"]))
    return found


def test_a_caller_at_its_quota_is_refused_new_schedules_and_no_one_else_is(
    start_service: ServiceFactory, reader: ReaderFactory, env: dict[str, str],
    tmp_path: Path, redis_client: redis.Redis,
) -> None:  # fmt: skip
    target = unique("quota-target")
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    service = start_service(BLACKBOX_POLICY_FILE=str(policy))
    events, dlq = reader(env["BLACKBOX_EVENTS_TOPIC"]), reader(env["BLACKBOX_DLQ_TOPIC"])

    def one(n: int, countdown: int, message: str = "m") -> dict[str, Any]:
        return {"topic": target, "message": f"{message}{n}", "countdown": countdown, "id": f"g{n}"}

    # Five fill the quota (two fire soon); the next two are refused; an update of a pending
    # id and another caller's schedules go through.
    _send(env, "greedy", one(0, 2), one(1, 2), one(2, 3600), one(3, 3600), one(4, 3600))
    refused = _send(env, "greedy", one(5, 3600), one(6, 3600))
    _send(env, "greedy", one(2, 3600, "again"))
    _send(env, "calm", *({"topic": target, "message": f"c{n}", "countdown": 3600, "id": f"c{n}"}
                         for n in range(8)))  # fmt: skip
    answered = events.wait_for(lambda r: len(r) >= 5 + 2 + 1 + 8, timeout=30)
    greedy = _outcomes(_answers(answered), "greedy")
    assert greedy == {"g0": ["scheduled"], "g1": ["scheduled"], "g2": ["scheduled", "updated"],
                      "g3": ["scheduled"], "g4": ["scheduled"], "g5": ["dead_lettered"],
                      "g6": ["dead_lettered"]}  # fmt: skip
    calm = _outcomes(_answers(answered), "calm")
    assert calm == {f"c{n}": ["scheduled"] for n in range(8)}
    letters = dlq.wait_count(2, timeout=30)
    assert [r.value for r in letters] == refused  # byte for byte
    assert {r.header("blackbox-dlq-reason") for r in letters} == {DeadLetterReason.OVER_QUOTA}
    dead = [e for e in _answers(answered) if e["outcome"] == "dead_lettered"]
    assert {e["reason"] for e in dead} == {"over_quota"}
    assert all("its quota of 5" in e["detail"] for e in dead)

    # Two fire, one is cancelled: three new ones fit, the fourth does not.
    delivered = reader(target).wait_count(2, timeout=30)
    assert sorted(r.value or b"" for r in delivered) == [b"m0", b"m1"]
    _send(env, "greedy", {"id": "g3", "cancel": True})
    events.wait_for(lambda r: any(b'"cancelled"' in (x.value or b"") for x in r), timeout=30)
    _send(env, "greedy", one(7, 3600), one(8, 3600), one(9, 3600), one(10, 3600))
    answered = events.wait_for(lambda r: "g10" in _outcomes(_answers(r), "greedy"), timeout=30)
    greedy = _outcomes(_answers(answered), "greedy")
    assert [greedy[f"g{n}"] for n in (7, 8, 9, 10)] == [
        ["scheduled"],
        ["scheduled"],
        ["scheduled"],
        ["dead_lettered"],
    ]
    shards = service.store.layout.shards
    pending = {m for k in shards for m in redis_client.zrange(k.due, 0, -1)}
    assert pending == {f"@greedy/g{n}".encode() for n in (2, 4, 7, 8, 9)} | {
        f"@calm/c{n}".encode() for n in range(8)
    }
    again = reader(target).read_to_end()  # nothing else fired
    assert [(r.offset, r.value) for r in again] == [(r.offset, r.value) for r in delivered]
    owned = {m for k in shards for m in redis_client.zrange(k.owned("greedy"), 0, -1)}
    # The fired ones pruned, the cancelled one removed.
    assert owned == {f"@greedy/g{n}".encode() for n in (2, 4, 7, 8, 9)}


def test_callers_the_policy_does_not_list_share_the_default_quota(
    start_service: ServiceFactory, reader: ReaderFactory, env: dict[str, str], tmp_path: Path
) -> None:
    """Anyone may name a new caller: the callers without a rule of their own (anonymous
    records too) share the default's quota, so a new name per record gains nothing; a
    listed caller keeps its own."""
    target = unique("quota-shared")
    policy = tmp_path / "policy.yaml"
    policy.write_text('default:\n  topics: ["*"]\n  max_pending: 3\ncallers:\n  listed: {}\n')
    start_service(BLACKBOX_POLICY_FILE=str(policy))
    events = reader(env["BLACKBOX_EVENTS_TOPIC"])
    for n, caller in enumerate(["new-1", "new-2", "new-3", "new-4", "new-5"]):
        _send(env, caller, {"topic": target, "message": n, "countdown": 3600, "id": "s"})
    for n in range(3):
        _send(env, "listed", {"topic": target, "message": n, "countdown": 3600, "id": f"l{n}"})
    answered = _answers(events.wait_count(8, timeout=30))
    outcomes = sorted((e["caller"], e["outcome"]) for e in answered)
    assert outcomes == sorted([
        ("new-1", "scheduled"), ("new-2", "scheduled"), ("new-3", "scheduled"),
        ("new-4", "dead_lettered"), ("new-5", "dead_lettered"),
        ("listed", "scheduled"), ("listed", "scheduled"), ("listed", "scheduled"),
    ])  # fmt: skip
    refused = [e for e in answered if e["outcome"] == "dead_lettered"]
    assert all("shared quota of 3" in e["detail"] for e in refused)


def test_room_comes_back_when_a_schedule_is_moved_earlier_or_cancelled_by_id(
    start_service: ServiceFactory, reader: ReaderFactory, env: dict[str, str], tmp_path: Path
) -> None:
    """A schedule moved earlier frees its place once it fires, not at its old due time; an
    id-less schedule cancelled by its blackbox id (the HTTP API's DELETE) frees it at once."""
    target = unique("quota-room")
    policy = tmp_path / "policy.yaml"
    policy.write_text('default:\n  topics: ["*"]\ncallers:\n  greedy:\n    max_pending: 2\n')
    service = start_service(BLACKBOX_POLICY_FILE=str(policy))
    events = reader(env["BLACKBOX_EVENTS_TOPIC"])

    _send(env, "greedy", {"topic": target, "message": "a", "countdown": 3600})
    _send(env, "greedy", {"topic": target, "message": "b", "countdown": 3600, "id": "m"})
    first = _answers(events.wait_count(2, timeout=30))
    assert [e["outcome"] for e in first] == ["scheduled", "scheduled"]
    idless = next(e["blackbox_id"] for e in first if e["id"] is None)
    assert service.store.cancel(idless).name == "CANCELLED"
    _send(env, "greedy", {"topic": target, "message": "c", "countdown": 3600, "id": "n"})
    _send(env, "greedy", {"id": "m", "reschedule": True, "countdown": 1})
    reader(target).wait_count(1, timeout=30)  # m, moved, fired
    _send(env, "greedy", {"topic": target, "message": "d", "countdown": 3600, "id": "o"})
    _send(env, "greedy", {"topic": target, "message": "e", "countdown": 3600, "id": "p"})
    answered = _answers(events.wait_count(6, timeout=30))
    assert [(e["id"], e["outcome"]) for e in answered[2:]] == [
        ("n", "scheduled"),
        ("m", "updated"),
        ("o", "scheduled"),
        ("p", "dead_lettered"),
    ]


def test_replays_of_a_signed_record_take_none_of_its_callers_room(
    start_service: ServiceFactory, reader: ReaderFactory, env: dict[str, str], tmp_path: Path
) -> None:
    """Copies of a caller's signed record, refused as replays, are not counted against its
    quota: its own new records after them are scheduled."""
    key = Ed25519PrivateKey.generate()
    target, intake = unique("quota-signed"), env["BLACKBOX_INTAKE_TOPIC"]
    policy = tmp_path / "policy.yaml"
    public = public_text(key.public_key())
    policy.write_text('default:\n  topics: ["*"]\ncallers:\n  signer:\n    max_pending: 3\n'
                      f'    require_signature: true\n    keys: {{k-1: "{public}"}}\n')  # fmt: skip
    start_service(BLACKBOX_POLICY_FILE=str(policy))
    events = reader(env["BLACKBOX_EVENTS_TOPIC"])

    def signed(n: int) -> tuple[bytes, list[Header]]:
        value = orjson.dumps({"topic": target, "message": n, "countdown": 3600})
        headers: list[Header] = [(CALLER_HEADER, b"signer")]
        header = Signer(key, "k-1").header(Parts(intake, None, value, headers), issued_ms=now_ms())
        return value, [*headers, header]

    captured = signed(0)
    produce(env["KAFKA_BOOTSTRAP_SERVERS"], intake, [captured[0]] * 6, captured[1])
    for n in (1, 2):
        value, headers = signed(n)
        produce(env["KAFKA_BOOTSTRAP_SERVERS"], intake, [value], headers)
    answered = _answers(events.wait_count(8, timeout=30))
    outcomes = sorted(str((e["caller"], e["outcome"], e["reason"])) for e in answered)
    assert outcomes == sorted([str(("signer", "scheduled", None))] * 3
                              + [str((None, "dead_lettered", "bad_signature"))] * 5)  # fmt: skip


def test_a_record_read_again_is_judged_as_it_was_the_first_time(
    start_service: ServiceFactory, reader: ReaderFactory, env: dict[str, str],
    tmp_path: Path, redis_client: redis.Redis,
) -> None:  # fmt: skip
    """Records read again past the committed offset (a crash or a rebalance before the
    commit) are not judged against the quota again: one applied is answered `scheduled`
    again, never refused while it stays pending; one refused stays refused, though the
    caller has room by then (its shard's mark moved past it)."""
    target = unique("quota-reread")
    policy = tmp_path / "policy.yaml"
    policy.write_text('default:\n  topics: ["*"]\ncallers:\n  greedy:\n    max_pending: 2\n')
    service = start_service(BLACKBOX_POLICY_FILE=str(policy))
    events = reader(env["BLACKBOX_EVENTS_TOPIC"])
    later = {"topic": target, "message": "x", "countdown": 3600}
    _send(env, "greedy", later)  # w, offset 0: every shard's mark is set
    events.wait_count(1, timeout=30)
    _send(env, "greedy", later, later)  # a scheduled, b refused
    first = _answers(events.wait_count(3, timeout=30))
    assert sorted(e["outcome"] for e in first) == ["dead_lettered", "scheduled", "scheduled"]
    a = next(e for e in first if e["intake"]["offset"] == 1)
    assert service.store.cancel(a["blackbox_id"]).name == "CANCELLED"  # room for one more
    service.stop()
    rewind_intake(env)  # as if the records were handled and the process died before the commit

    again = start_service(BLACKBOX_POLICY_FILE=str(policy))
    _send(env, "greedy", later)  # z, offset 3: read after the three read again
    answered = _answers(events.wait_for(lambda r: _offsets(r).count(3) == 1, timeout=60))
    by_offset = [(e["intake"]["offset"], e["outcome"]) for e in answered[3:]]
    assert sorted(by_offset) == [(0, "scheduled"), (3, "scheduled")]  # w answered again
    pending = {m for k in again.store.layout.shards for m in redis_client.zrange(k.due, 0, -1)}
    assert pending == {first[0]["blackbox_id"].encode(), answered[-1]["blackbox_id"].encode()}


def _offsets(records: list[Received]) -> list[int]:
    return [int(orjson.loads(r.value or b"")["intake"]["offset"]) for r in records]
