"""The API acts only for the callers a token was given, applies changes in the caller's
order through the intake topic, and never schedules a retried create twice."""

from __future__ import annotations

import base64
import hashlib
import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest
from confluent_kafka.admin import AdminClient, NewPartitions  # type: ignore[attr-defined]
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from prometheus_client.parser import text_string_to_metric_families

from blackbox.api.pending import SCAN_BUDGET, WALK_BUDGET
from blackbox.client import Client
from blackbox.clock import now_ms
from blackbox.kafka import answers
from blackbox.kafka.clients import java_partition
from blackbox.role import Role
from blackbox.schedule import Schedule, intake_id
from blackbox.service import Service
from blackbox.signing import private_pem, public_text
from tests.integration.conftest import ReaderFactory, ServiceFactory, settle
from tests.integration.test_api import fill
from tests.kafkatools import unique, wait_until

BILLING, SHOP, READER = (
    "billing-token-0123456789",
    "shop-token-0123456789ab",
    "read-only-0123456789ab",
)


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _tokens_file(path: Path) -> str:
    def entry(token: str, callers: list[str], scopes: list[str]) -> str:
        digest = hashlib.sha256(token.encode()).hexdigest()
        return f'  - {{sha256: "{digest}", callers: {callers}, scopes: {scopes}}}\n'

    path.write_text("tokens:\n" + entry(BILLING, ["billing"], ["read", "write"])
                    + entry(SHOP, ["shop"], ["read", "write"])
                    + entry(READER, ["billing", "shop"], ["read"]))  # fmt: skip
    return str(path)


def _api(service: Service) -> httpx.Client:
    assert service.endpoints is not None
    return httpx.Client(base_url=f"http://127.0.0.1:{service.endpoints.port}", timeout=30)


@pytest.fixture
def callers_api(
    start_service: ServiceFactory, tmp_path: Path
) -> Iterator[tuple[Service, httpx.Client]]:
    service = start_service(BLACKBOX_API_TOKENS_FILE=_tokens_file(tmp_path / "tokens.yaml"))
    with _api(service) as client:
        yield service, client


def _create(client: httpx.Client, token: str, target: str, schedule_id: str,
            caller: str | None = None) -> httpx.Response:  # fmt: skip
    body = {"envelope": {"topic": target, "message": schedule_id, "countdown": 3600,
                         "id": schedule_id}, **({"caller": caller} if caller else {})}  # fmt: skip
    return client.post("/api/v1/schedules", json=body, headers=_auth(token))


def test_a_token_acts_only_for_its_callers(callers_api: tuple[Service, httpx.Client]) -> None:
    """Guarantee 7: billing's token creates as billing (its caller by default), lists,
    reads, reschedules and cancels billing's ids only; shop's ids are not found for it; a
    read-only token changes nothing; totals across callers need an operator's token."""
    service, client = callers_api
    target = unique("scoped")
    assert _create(client, BILLING, target, "b-1").status_code == 202
    assert _create(client, SHOP, target, "s-1").status_code == 202
    assert _create(client, BILLING, target, "x", caller="shop").status_code == 403
    wait_until(lambda: service.store.counts()[0] == 2, what="both stored")

    listed = client.get("/api/v1/schedules", headers=_auth(BILLING)).json()["items"]
    assert [i["blackbox_id"] for i in listed] == ["@billing/b-1"]
    assert client.get("/api/v1/schedules", params={"caller": "shop"},
                      headers=_auth(BILLING)).status_code == 403  # fmt: skip
    assert client.get("/api/v1/schedules/@shop/s-1", headers=_auth(BILLING)).status_code == 404
    assert client.delete("/api/v1/schedules/@shop/s-1", headers=_auth(BILLING)).status_code == 404
    moved = client.post("/api/v1/schedules/@shop/s-1/reschedule", json={"countdown": 1},
                        headers=_auth(BILLING))  # fmt: skip
    assert moved.status_code == 404
    assert client.get("/api/v1/stats", headers=_auth(BILLING)).status_code == 403
    assert client.get("/api/v1/schedules", headers=_auth(READER)).status_code == 400
    assert client.delete("/api/v1/schedules/@billing/b-1", headers=_auth(READER)).status_code == 403
    assert client.get("/api/v1/schedules/@shop/s-1", headers=_auth(READER)).status_code == 200

    gone = client.delete("/api/v1/schedules/@billing/b-1", headers=_auth(BILLING))
    assert (gone.status_code, gone.json()["outcome"]) == (200, "cancelled")
    assert service.store.counts()[0] == 1  # shop's is still there


def test_an_api_cancel_is_applied_after_an_older_update_of_the_id(
    start_service: ServiceFactory, reader: ReaderFactory, tmp_path: Path
) -> None:
    """Guarantee 7: an update of an id still waiting in the intake topic when the API is
    asked to cancel it is applied first, then the cancel: the message never fires, and the
    API answers `cancelled` (applied directly in Redis, the cancel was overtaken and the
    update fired the message)."""
    tokens = _tokens_file(tmp_path / "tokens.yaml")
    first = start_service(BLACKBOX_API_TOKENS_FILE=tokens)
    settings = first.settings
    bootstrap, target = settings.kafka["bootstrap.servers"], unique("raced")
    intake = settings.intake_topic
    with Client({"bootstrap.servers": bootstrap}, caller="billing", intake_topic=intake) as c:
        c.send_later(target, "v1", delay=5, id="order-1")
    wait_until(lambda: first.store.counts()[0] == 1, what="order-1 stored")
    first.stop()
    api_only = start_service(Role.DISPATCH, BLACKBOX_API_TOKENS_FILE=tokens,
                             BLACKBOX_DELIVERY_TIMEOUT="5")  # fmt: skip
    with Client({"bootstrap.servers": bootstrap}, caller="billing", intake_topic=intake) as c:
        c.send_later(target, "v2", delay=1, id="order-1")  # waits: nobody reads the intake yet
    answers: list[httpx.Response] = []
    with _api(api_only) as client:
        asking = threading.Thread(
            target=lambda: answers.append(
                client.delete("/api/v1/schedules/@billing/order-1", headers=_auth(BILLING))
            )
        )
        asking.start()
        wait_until(lambda: api_only.store.counts()[0] == 1, what="the API asked")  # fmt: skip
        start_service(Role.INTAKE, BLACKBOX_API_TOKENS_FILE=tokens)
        asking.join(30)
    events = reader(settings.events_topic)
    outcomes = events.wait_for(lambda r: len(r) >= 3)
    settle(api_only)
    (answer,) = answers
    assert (answer.status_code, answer.json()["outcome"]) == (200, "cancelled")
    assert [orjson.loads(e.value or b"")["outcome"] for e in outcomes] == [
        "scheduled", "updated", "cancelled"]  # fmt: skip
    assert reader(target).read_to_end() == []


def test_a_create_retried_with_its_idempotency_key_schedules_once(
    callers_api: tuple[Service, httpx.Client], reader: ReaderFactory
) -> None:
    """Guarantee 7: the same Idempotency-Key sent twice (a client retrying after a timeout)
    schedules one message, also when the first had fired already."""
    service, client = callers_api
    target = unique("once")
    later = {"envelope": {"topic": target, "message": "later", "countdown": 3600}}
    pending_key = {"Idempotency-Key": "req-pending", **_auth(BILLING)}
    for _ in range(2):
        assert client.post("/api/v1/schedules", json=later, headers=pending_key).status_code == 202
    body = {"envelope": {"topic": target, "message": "hello", "countdown": 0}}
    key = {"Idempotency-Key": "req-7f3a", **_auth(BILLING)}
    first = client.post("/api/v1/schedules", json=body, headers=key)
    assert first.status_code == 202
    assert first.json()["blackbox_id"] == "@billing/req-7f3a"
    reader(target).wait_count(1)
    wait_until(lambda: service.store.counts() == (1, 0), what="hello fired, later pending")
    again = client.post("/api/v1/schedules", json=body, headers=key)
    assert again.json()["blackbox_id"] == first.json()["blackbox_id"]
    events = reader(service.settings.events_topic).wait_for(lambda r: len(r) >= 4)
    answers = [orjson.loads(e.value or b"") for e in events]
    assert [(a["id"], a["outcome"]) for a in answers] == [
        ("req-pending", "scheduled"), ("req-pending", "already_pending"),
        ("req-7f3a", "scheduled"), ("req-7f3a", "already_fired")]  # fmt: skip
    assert answers[1]["due_ms"] is None  # the retry's own due time is not what is stored
    assert [r.value for r in reader(target).read_to_end()] == [b"hello"]
    assert service.store.counts()[0] == 1  # "later", once


def test_answers_are_found_on_partitions_added_to_the_events_topic(
    callers_api: tuple[Service, httpx.Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Guarantee 7: after the events topic grows from 1 to 4 partitions, the API still reads
    the answers to its cancels, whichever partition their id hashes to."""
    monkeypatch.setattr(answers, "NEW_PARTITIONS_SECONDS", 0.2)
    service, client = callers_api
    target, settings = unique("grown"), service.settings
    ids = [f"g-{n}" for n in range(8)]
    for schedule_id in ids:
        assert _create(client, BILLING, target, schedule_id).status_code == 202
    wait_until(lambda: service.store.counts()[0] == len(ids), what="all stored")
    admin = AdminClient({"bootstrap.servers": settings.kafka["bootstrap.servers"]})
    admin.create_partitions([NewPartitions(settings.events_topic, 4)])[
        settings.events_topic].result(15)  # fmt: skip
    landed = {java_partition(i.encode(), 4) for i in ids}
    assert landed - {0}  # some answers land on the new partitions
    for schedule_id in ids:
        gone = client.delete(f"/api/v1/schedules/@billing/{schedule_id}", headers=_auth(BILLING))
        assert (gone.status_code, gone.json()["outcome"]) == (200, "cancelled"), schedule_id


def test_the_api_signs_for_callers_that_must_sign(
    start_service: ServiceFactory, tmp_path: Path
) -> None:
    """Guarantee 7: for a caller whose policy requires signatures, the API's own key (listed
    in that caller's keys) signs its requests, so the cancel is applied; without that key the
    intake refuses the API's unsigned request and the API answers 422 bad_signature."""
    api_key = Ed25519PrivateKey.generate()
    pem = tmp_path / "api.pem"
    pem.write_bytes(private_pem(api_key))
    policy = tmp_path / "policy.yaml"
    public = public_text(api_key.public_key())
    policy.write_text("callers:\n  billing:\n    require_signature: true\n"
                      f"    keys: {{api-1: \"{public}\"}}\n")  # fmt: skip
    tokens = _tokens_file(tmp_path / "tokens.yaml")
    unsigned = start_service(BLACKBOX_POLICY_FILE=str(policy), BLACKBOX_API_TOKENS_FILE=tokens)
    with _api(unsigned) as client:
        refused = client.delete("/api/v1/schedules/@billing/x", headers=_auth(BILLING))
    assert (refused.status_code, refused.json()["error"]) == (422, "bad_signature")
    unsigned.stop()
    signing = start_service(
        BLACKBOX_POLICY_FILE=str(policy),
        BLACKBOX_API_TOKENS_FILE=tokens,
        BLACKBOX_API_SIGNING_KEY_FILE=str(pem),
        BLACKBOX_API_KEY_ID="api-1",
    )
    with _api(signing) as client:
        created = _create(client, BILLING, unique("signed-by-api"), "b-9")
        assert created.status_code == 202
        wait_until(lambda: signing.store.counts()[0] == 1, what="the signed create stored")
        gone = client.delete("/api/v1/schedules/@billing/b-9", headers=_auth(BILLING))
    assert (gone.status_code, gone.json()["outcome"]) == (200, "cancelled")


def _foreign_and_own(service: Service, target: str, big: bytes) -> list[str]:
    """billing's ids (a caller's own and one derived from an intake record, each with a
    large message) stored beyond the ids a listing walks in one call, then one id of shop's."""
    base = now_ms() + 3_600_000
    billing = [Schedule(f"@billing/customer-{i:04d}-invoice", target, b"x", base + i,
                        caller=b"billing") for i in range(WALK_BUDGET + 10)]  # fmt: skip
    secrets = [Schedule("@billing/secret", target, big, base, caller=b"billing"),
               Schedule(intake_id(target, 0, 7), target, big, base, caller=b"billing")]  # fmt: skip
    fill(service, [*billing, *secrets,
                   Schedule("@shop/own", target, b"x", base + 10**6, caller=b"shop")])  # fmt: skip
    return [s.id for s in secrets]


def _decoded(cursor: str) -> bytes:
    try:
        return base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
    except ValueError:
        return b""


def test_a_scoped_tokens_cursor_names_no_other_callers_id(
    callers_api: tuple[Service, httpx.Client],
) -> None:
    """Guarantee 7: a listing that stops among billing's ids (more than one call walks) hands
    shop's token a cursor that names none of them, as text or decoded, and still reaches
    shop's id."""
    service, client = callers_api
    _foreign_and_own(service, unique("cursor"), b"x")
    first = client.get("/api/v1/schedules", headers=_auth(SHOP)).json()
    cursor = first["cursor"]
    assert (first["items"], first["scanned"]) == ([], 0) and cursor is not None
    for text in (cursor.encode(), _decoded(cursor)):
        assert b"billing" not in text and b"customer-" not in text, text[:120]
    second = client.get("/api/v1/schedules", params={"cursor": cursor}, headers=_auth(SHOP))
    assert [i["blackbox_id"] for i in second.json()["items"]] == ["@shop/own"]


def test_a_scoped_listing_counts_none_of_another_callers_ids(
    callers_api: tuple[Service, httpx.Client],
) -> None:
    """Guarantee 7: what a listing reports it read counts only the ids its token may see:
    shop's token learns neither how many ids billing has nor, through a due window, when
    one of them falls due; billing's own listing counts its own."""
    service, client = callers_api
    target, base = unique("counted"), now_ms() + 3_600_000
    fill(service, [*(Schedule(f"@billing/b-{i}", target, b"x", base + i, caller=b"billing")
                     for i in range(30)),
                   Schedule("@shop/own", target, b"x", base + 10**6, caller=b"shop")])  # fmt: skip

    def scanned(token: str, **window: int) -> int:
        answer = client.get("/api/v1/schedules", params=window, headers=_auth(token)).json()
        count: int = answer["scanned"]
        return count

    assert scanned(SHOP) == 1
    assert scanned(SHOP, due_from_ms=base + 7, due_to_ms=base + 7) == 0
    assert scanned(SHOP, due_from_ms=base, due_to_ms=base + 29) == 0
    assert scanned(BILLING, due_from_ms=base + 7, due_to_ms=base + 7) == 1
    assert scanned(BILLING) == 30


def test_a_scoped_listing_answers_the_same_whatever_other_callers_hold(
    callers_api: tuple[Service, httpx.Client],
) -> None:
    """Guarantee 7: shop's listing of a due window is a function of shop's ids alone: the
    same items, `scanned` and end (no cursor) in a window where billing holds nothing as in
    one where billing holds more ids than a listing's read budget, interleaved with shop's.
    Before, the busy window's page stopped early with a cursor, so a scoped token could
    bisect when another caller's ids fall due."""
    service, client = callers_api
    target, quiet = unique("shape"), now_ms() + 3_600_000
    busy, offsets = quiet + 10**6, [0, 500, 999, 1500]
    fill(service, [*(Schedule(f"@shop/{start}-{o}", target, b"x", start + o, caller=b"shop")
                     for start in (quiet, busy) for o in offsets),
                   *(Schedule(f"@billing/b-{i}", target, b"x", busy + i, caller=b"billing")
                     for i in range(SCAN_BUDGET + 10))])  # fmt: skip

    def shape(start: int) -> tuple[list[int], bool, int]:
        window = {"due_from_ms": start, "due_to_ms": start + 2000, "limit": 10}
        page = client.get("/api/v1/schedules", params=window, headers=_auth(SHOP)).json()
        return [i["due_ms"] - start for i in page["items"]], page["cursor"] is None, page["scanned"]

    assert shape(quiet) == (offsets, True, 4)
    assert shape(busy) == shape(quiet)


def test_metrics_name_no_caller_topic_or_id(callers_api: tuple[Service, httpx.Client]) -> None:
    """Guarantee 7: /metrics, an operator's endpoint answered without a token, counts every
    caller's schedules together: once two callers' schedules are taken, listed and one
    cancelled, no label value names a caller, the target topic or an id."""
    service, client = callers_api
    target = unique("metered")
    for token, own in ((BILLING, "metered-b"), (SHOP, "metered-s")):
        assert _create(client, token, target, own).status_code == 202
    stored = ["@billing/metered-b", "@shop/metered-s"]
    wait_until(lambda: all(service.store.load(i) for i in stored), 30, "both scheduled")
    assert client.get("/api/v1/schedules", headers=_auth(SHOP)).status_code == 200
    cancel = client.delete(f"/api/v1/schedules/{stored[1]}", headers=_auth(SHOP))
    assert cancel.status_code == 200
    text = client.get("/metrics").text
    values = {value for family in text_string_to_metric_families(text)
              for sample in family.samples for value in sample.labels.values()}  # fmt: skip
    named = ("billing", "shop", target, "metered-")
    assert [v for v in values if any(word in v for word in named)] == []
    assert "blackbox_intake_records_total" in text


def _asked(client: httpx.Client, method: str, path: str) -> tuple[int, str]:
    body = {"countdown": 60} if path.endswith("/reschedule") else None
    answer = client.request(method, f"/api/v1/schedules/{path}", json=body, headers=_auth(SHOP))
    return answer.status_code, answer.text


def test_another_callers_id_answers_as_an_id_that_is_not_there(
    callers_api: tuple[Service, httpx.Client],
) -> None:
    """Guarantee 7: for shop's token, billing's pending ids (its own and one derived from an
    intake record) answer GET, DELETE, reschedule, pause and resume exactly as ids that do
    not exist, in text and in time (a 4 MiB message read for a refusal would show)."""
    service, client = callers_api
    target = unique("hidden")
    present = _foreign_and_own(service, target, b"m" * 4 * 1024 * 1024)
    absent = ["@billing/nothing", intake_id(target, 0, 8)]
    calls = [("GET", ""), ("DELETE", ""), ("POST", "/reschedule"), ("POST", "/pause"),
             ("POST", "/resume")]  # fmt: skip
    for there, not_there in zip(present, absent, strict=True):
        for method, verb in calls:
            seen = _asked(client, method, there + verb)
            expected = _asked(client, method, not_there + verb)
            assert seen == (expected[0], expected[1].replace(not_there, there)), (method, verb)
    for method in ("GET", "DELETE"):
        seen_s, expected_s = _median_seconds(client, method, present[1], absent[1])
        assert abs(seen_s - expected_s) < max(0.25 * expected_s, 0.001), (method, seen_s)


def _median_seconds(client: httpx.Client, method: str, *paths: str) -> list[float]:
    """The median time of each path's answer, asked in turns."""
    times: list[list[float]] = [[] for _ in paths]
    for _ in range(25):
        for spent, path in zip(times, paths, strict=True):
            started = time.perf_counter()
            _asked(client, method, path)
            spent.append(time.perf_counter() - started)
    return [statistics.median(spent) for spent in times]
