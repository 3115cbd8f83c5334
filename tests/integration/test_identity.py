"""Callers proven, on the real stack: signatures required, keys rotated, replays refused,
and callers bound to their own intake topics."""

from __future__ import annotations

import time
from pathlib import Path

import orjson
import redis
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from blackbox.client import Client
from blackbox.clock import now_ms
from blackbox.envelope import CALLER_HEADER, Header
from blackbox.errors import DeadLetterReason
from blackbox.intake.identity import Proof
from blackbox.intake.nonces import Nonces
from blackbox.kafka import clients
from blackbox.kafka.clients import java_partition
from blackbox.signing import Parts, Signer, public_text
from blackbox.storage.keys import Layout
from tests.integration.conftest import ReaderFactory, ServiceFactory, settle
from tests.kafkatools import produce, produce_to, unique, wait_until

KEY, OTHER = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
NEXT = Ed25519PrivateKey.generate()  # billing's next key, listed beside the current one
_R = DeadLetterReason


def _policy_file(tmp_path: Path, payments_topic: str) -> str:
    path = tmp_path / "policy.yaml"
    path.write_text(
        "callers:\n"
        "  billing:\n"
        "    require_signature: true\n"
        f'    keys: {{billing-1: "{public_text(KEY.public_key())}", '
        f'billing-2: "{public_text(NEXT.public_key())}"}}\n'
        "  payments:\n"
        f"    intake_topics: [{payments_topic}]\n"
    )
    return str(path)


def _document(target: str, n: int) -> bytes:
    return orjson.dumps({"topic": target, "message": {"n": n}, "countdown": 0})


def _signed_headers(topic: str, value: bytes, key: Ed25519PrivateKey, issued_ms: int,
                    caller: bytes = b"billing") -> list[Header]:  # fmt: skip
    headers: list[Header] = [(CALLER_HEADER, caller)]
    header = Signer(key, "billing-1").header(Parts(topic, None, value, headers),
                                             issued_ms=issued_ms)  # fmt: skip
    return [*headers, header]


def test_only_records_the_caller_signed_are_scheduled(
    start_service: ServiceFactory, reader: ReaderFactory, env: dict[str, str], tmp_path: Path
) -> None:
    """Guarantee 7: with a signature required, the client's signed records are delivered,
    under either key of a rotation; unsigned, forged, replayed and expired ones are
    dead-lettered with their reason and nothing of them reaches the target."""
    target, payments_topic = unique("signed"), unique("payments")
    clients.ensure_topics({"bootstrap.servers": env["KAFKA_BOOTSTRAP_SERVERS"]}, [payments_topic])
    service = start_service(BLACKBOX_POLICY_FILE=_policy_file(tmp_path, payments_topic))
    bootstrap, intake = env["KAFKA_BOOTSTRAP_SERVERS"], env["BLACKBOX_INTAKE_TOPIC"]
    now = time.time_ns() // 1_000_000
    with Client({"bootstrap.servers": bootstrap}, caller="billing", intake_topic=intake,
                signer=Signer(KEY, "billing-1")) as signed:  # fmt: skip
        signed.send_later(target, {"n": 0}, delay=0)
    with Client({"bootstrap.servers": bootstrap}, caller="billing", intake_topic=intake) as plain:
        plain.send_later(target, {"n": 1}, delay=0)
    forged = _document(target, 2)
    produce(bootstrap, intake, [forged], _signed_headers(intake, forged, OTHER, now))
    replayed = _document(target, 3)
    headers = _signed_headers(intake, replayed, KEY, now)
    produce(bootstrap, intake, [replayed, replayed], headers)
    old = _document(target, 4)
    sent_long_ago = now - 1_000_000  # record and signature alike: older than 900 s
    produce(bootstrap, intake, [old], _signed_headers(intake, old, KEY, sent_long_ago),
            timestamp_ms=sent_long_ago)  # fmt: skip

    with Client({"bootstrap.servers": bootstrap}, caller="billing", intake_topic=intake,
                signer=Signer(NEXT, "billing-2")) as rotated:  # fmt: skip
        rotated.send_later(target, {"n": 6}, delay=0)

    dead = reader(env["BLACKBOX_DLQ_TOPIC"]).wait_count(4)
    delivered = reader(target).wait_count(3)
    settle(service)
    by_offset = {int(d.header("blackbox-dlq-offset")): d for d in dead}
    reasons = {offset: d.header("blackbox-dlq-reason") for offset, d in by_offset.items()}
    assert reasons == {1: _R.BAD_SIGNATURE, 2: _R.BAD_SIGNATURE, 4: _R.BAD_SIGNATURE,
                       5: _R.SIGNATURE_EXPIRED}  # fmt: skip
    assert "must sign" in by_offset[1].header("blackbox-dlq-detail")
    assert "replay" in by_offset[4].header("blackbox-dlq-detail")
    assert "ago" in by_offset[5].header("blackbox-dlq-detail")
    assert sorted(orjson.loads(r.value or b"")["n"] for r in delivered) == [0, 3, 6]
    assert all(r.header(CALLER_HEADER) == "billing" for r in delivered)


def test_a_backlog_older_than_its_max_age_when_read_is_refused_whatever_stamps_the_topic(
    start_service: ServiceFactory, reader: ReaderFactory, env: dict[str, str], tmp_path: Path
) -> None:
    """Guarantees 5 and 7: signed records that waited out an outage longer than their
    maximum age are dead-lettered as signature_expired (never lost silently) on a topic the
    broker stamps (LogAppendTime) as on one the producer stamps: by then a copy's nonce may
    be forgotten, so nothing read that late is taken as the signer's."""
    bootstrap, target = env["KAFKA_BOOTSTRAP_SERVERS"], unique("backlog")
    stamped = _stamped_topic(bootstrap)
    policy = tmp_path / "policy.yaml"
    public = public_text(KEY.public_key())
    policy.write_text("callers:\n  billing:\n    require_signature: true\n"
                      "    signature_max_age_seconds: 2\n"
                      f"    keys: {{billing-1: \"{public}\"}}\n")  # fmt: skip
    for intake in (stamped, env["BLACKBOX_INTAKE_TOPIC"]):
        value = _document(target, 0 if intake == stamped else 1)
        produce(bootstrap, intake, [value],
                _signed_headers(intake, value, KEY, time.time_ns() // 1_000_000))  # fmt: skip
    sent = time.monotonic()
    wait_until(lambda: time.monotonic() - sent > 3, what="the backlog older than its max age")
    start_service(BLACKBOX_POLICY_FILE=str(policy))  # reads the producer-stamped topic
    start_service(BLACKBOX_POLICY_FILE=str(policy), BLACKBOX_INTAKE_TOPIC=stamped,
                  BLACKBOX_GROUP_ID=unique("group"))  # fmt: skip
    refused = reader(env["BLACKBOX_DLQ_TOPIC"]).wait_count(2)
    topics = {r.header("blackbox-dlq-topic") for r in refused}
    assert topics == {stamped, env["BLACKBOX_INTAKE_TOPIC"]}
    assert {r.header("blackbox-dlq-reason") for r in refused} == {_R.SIGNATURE_EXPIRED}
    assert reader(target).read_to_end() == []


def test_a_bound_topic_decides_the_caller(
    start_service: ServiceFactory, reader: ReaderFactory, env: dict[str, str], tmp_path: Path
) -> None:
    """Guarantee 7: the service consumes payments' own intake topic; records on it are
    delivered as payments' whatever CALLER_SERVICE says, and a record naming payments on the
    shared topic is refused as unverified_caller."""
    target, payments_topic = unique("bound"), unique("payments")
    bootstrap = env["KAFKA_BOOTSTRAP_SERVERS"]
    clients.ensure_topics({"bootstrap.servers": bootstrap}, [payments_topic])
    service = start_service(BLACKBOX_POLICY_FILE=_policy_file(tmp_path, payments_topic))
    produce(bootstrap, payments_topic, [_document(target, 0)], [(CALLER_HEADER, b"billing")])
    produce(bootstrap, payments_topic, [_document(target, 1)])
    produce(bootstrap, env["BLACKBOX_INTAKE_TOPIC"], [_document(target, 2)],
            [(CALLER_HEADER, b"payments")])  # fmt: skip
    produce(bootstrap, payments_topic, [_document(payments_topic, 3)])

    dead = reader(env["BLACKBOX_DLQ_TOPIC"]).wait_count(2)
    delivered = reader(target).wait_count(2)
    settle(service)
    by_topic = {d.header("blackbox-dlq-topic"): d.header("blackbox-dlq-reason") for d in dead}
    assert by_topic == {
        env["BLACKBOX_INTAKE_TOPIC"]: _R.UNVERIFIED_CALLER,
        payments_topic: _R.FORBIDDEN_TOPIC,  # a bound intake topic is never a target
    }
    assert sorted(orjson.loads(r.value or b"")["n"] for r in delivered) == [0, 1]
    assert {r.header(CALLER_HEADER) for r in delivered} == {"payments"}


def test_a_nonce_is_the_first_records_own(redis_client: redis.Redis) -> None:
    """Guarantees 2 and 7: the record that used a nonce first passes again when re-read after
    a crash; any other record with that nonce is a replay, also across shards."""
    nonces = Nonces(redis_client, Layout(unique("ns"), 4))
    first = Proof("billing", "k", "n" * 16, 60, now_ms())
    other = Proof("billing", "k", "m" * 16, 60, now_ms())
    assert nonces.first_uses([(first, "t:0:5"), (other, "t:0:6")]) == [None, None]
    assert nonces.first_uses([(first, "t:0:5")]) == [None]
    assert nonces.first_uses([(first, "t:0:9"), (other, "t:1:2")]) == ["t:0:5", "t:0:6"]
    assert 0 < redis_client.ttl(Layout(nonces.layout.namespace, 4).keys_of(first.nonce)
                                .nonce("billing", "k", first.nonce)) <= 60  # fmt: skip


def _stamped_topic(bootstrap: str) -> str:
    """A new intake topic whose records the broker stamps (LogAppendTime)."""
    topic = unique("stamped")
    by_broker = NewTopic(topic, 1, config={"message.timestamp.type": "LogAppendTime"})
    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept: its futures need it alive
    admin.create_topics([by_broker])[topic].result(15)
    return topic


def test_a_copy_appended_during_an_outage_is_never_scheduled_twice(
    start_service: ServiceFactory, reader: ReaderFactory, env: dict[str, str], tmp_path: Path,
    redis_client: redis.Redis,
) -> None:  # fmt: skip
    """Guarantees 5 and 7: on a LogAppendTime intake topic, a copy of a signed record that
    was scheduled, appended within the signature's windows while blackbox is down and read
    after an outage longer than the windows (the original's nonce forgotten by then), is
    refused (expired or a replay), never scheduled a second time."""
    bootstrap, target = env["KAFKA_BOOTSTRAP_SERVERS"], unique("replayed")
    stamped = _stamped_topic(bootstrap)
    policy = tmp_path / "policy.yaml"
    policy.write_text("callers:\n  billing:\n    require_signature: true\n"
                      "    signature_max_age_seconds: 8\n    signature_skew_seconds: 8\n"
                      f'    keys: {{billing-1: "{public_text(KEY.public_key())}"}}\n')  # fmt: skip
    overrides = {"BLACKBOX_POLICY_FILE": str(policy), "BLACKBOX_INTAKE_TOPIC": stamped}
    service = start_service(**overrides)
    value, issued = _document(target, 0), time.time_ns() // 1_000_000
    headers = _signed_headers(stamped, value, KEY, issued)
    produce(bootstrap, stamped, [value], headers)
    delivered = reader(target)
    delivered.wait_count(1)
    nonce = (headers[-1][1] or b"").decode().split(" ")[3]
    remembered = service.store.layout.keys_of(nonce).nonce("billing", "billing-1", nonce)
    assert redis_client.exists(remembered)

    service.stop()  # the outage: a relay appends its copy within the windows meanwhile
    produce(bootstrap, stamped, [value], headers)
    assert time.time_ns() // 1_000_000 - issued < 8_000, "the copy came too late to matter"
    wait_until(lambda: not redis_client.exists(remembered), 60, "the original's nonce forgotten")
    start_service(**overrides)

    (refused,) = reader(env["BLACKBOX_DLQ_TOPIC"]).wait_count(1)
    assert refused.header("blackbox-dlq-reason") in {_R.SIGNATURE_EXPIRED, _R.BAD_SIGNATURE}
    assert int(refused.header("blackbox-dlq-offset")) == 1
    assert len(delivered.read_to_end()) == 1


def test_a_signed_countdown_runs_from_its_issue_time_not_the_record_timestamp(
    start_service: ServiceFactory, reader: ReaderFactory, env: dict[str, str], tmp_path: Path
) -> None:
    """Guarantee 7: a relay that produces a signed `countdown: 290` again with a record
    timestamp 289 s before the signature's issue time (within the skew) cannot make it fire
    earlier than the signer meant: it is due at the issue time plus the countdown."""
    bootstrap, intake = env["KAFKA_BOOTSTRAP_SERVERS"], env["BLACKBOX_INTAKE_TOPIC"]
    target = unique("relayed")
    policy = tmp_path / "policy.yaml"
    policy.write_text("callers:\n  billing:\n    require_signature: true\n"
                      f'    keys: {{billing-1: "{public_text(KEY.public_key())}"}}\n')  # fmt: skip
    start_service(BLACKBOX_POLICY_FILE=str(policy))
    value = orjson.dumps({"topic": target, "message": {"n": 0}, "countdown": 290})
    issued = time.time_ns() // 1_000_000
    produce(bootstrap, intake, [value], _signed_headers(intake, value, KEY, issued),
            timestamp_ms=issued - 289_000)  # fmt: skip

    (answer,) = reader(env["BLACKBOX_EVENTS_TOPIC"]).wait_count(1)
    scheduled = orjson.loads(answer.value or b"")
    assert scheduled["outcome"] == "scheduled", scheduled
    assert scheduled["due_ms"] >= issued + 290_000, scheduled["due_ms"] - issued


def _signed_keyed(topic: str, key: bytes, value: bytes) -> list[Header]:
    """billing's headers for a keyed record, signed now."""
    headers: list[Header] = [(CALLER_HEADER, b"billing")]
    parts = Parts(topic, key, value, headers)
    return [*headers, Signer(KEY, "billing-1").header(parts, issued_ms=now_ms())]


def test_a_signed_record_copied_to_another_partition_cannot_defeat_its_owners_cancel(
    start_service: ServiceFactory, reader: ReaderFactory, env: dict[str, str], tmp_path: Path
) -> None:
    """Guarantee 7: a copy of billing's signed cancel, moved by another producer onto a
    partition its key does not go to and read first (produced first here, so the race always
    goes the attacker's way), is refused as bad_signature for its partition, answered as no
    caller's; billing's own cancel then applies and the schedule it cancels never fires."""
    bootstrap, target = env["KAFKA_BOOTSTRAP_SERVERS"], unique("moved")
    intake = env["BLACKBOX_INTAKE_TOPIC"]
    clients.ensure_topics({"bootstrap.servers": bootstrap}, [intake], partitions=2)
    policy = tmp_path / "policy.yaml"
    policy.write_text("callers:\n  billing:\n    require_signature: true\n"
                      f'    keys: {{billing-1: "{public_text(KEY.public_key())}"}}\n')  # fmt: skip
    key = b"inv-1"
    home = java_partition(key, 2)
    create = orjson.dumps({"topic": target, "message": "x", "countdown": 15, "id": "inv-1"})
    cancel = orjson.dumps({"cancel": True, "id": "inv-1"})
    create_headers = _signed_keyed(intake, key, create)
    cancel_headers = _signed_keyed(intake, key, cancel)
    produce_to(bootstrap, intake, [(1 - home, key, cancel)], cancel_headers)  # the copy
    service = start_service(BLACKBOX_POLICY_FILE=str(policy))
    answers = reader(env["BLACKBOX_EVENTS_TOPIC"])
    answers.wait_count(1)
    produce_to(bootstrap, intake, [(home, key, create)], create_headers)
    produce_to(bootstrap, intake, [(home, key, cancel)], cancel_headers)

    by_place = {(e["intake"]["partition"], e["intake"]["offset"]): e
                for e in (orjson.loads(r.value or b"") for r in answers.wait_count(3))}  # fmt: skip
    copy = by_place[(1 - home, 0)]
    assert (copy["outcome"], copy["reason"]) == ("dead_lettered", _R.BAD_SIGNATURE), copy
    assert copy["detail"] == (f"a signed record sits on partition {1 - home}, "
                              f"its key's partition is {home}: a copy moved")  # fmt: skip
    # Anyone could have written the copy: its refusal is not answered as billing's.
    assert copy["caller"] is None
    assert by_place[(home, 0)]["outcome"] == "scheduled"
    assert by_place[(home, 1)]["outcome"] == "cancelled", by_place[(home, 1)]
    assert by_place[(home, 1)]["caller"] == "billing"
    settle(service)
    assert reader(target).read_to_end() == []
