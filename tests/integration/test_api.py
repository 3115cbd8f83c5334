"""The HTTP API against a real Redis and broker: listing, get, cancel, reschedule, create,
stats and the token rules."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from blackbox.api.pending import SCAN_BUDGET
from blackbox.clock import now_ms
from blackbox.dev.servers import KafkaBroker, RedisServer, free_port
from blackbox.kafka import clients
from blackbox.schedule import Schedule
from blackbox.service import Service
from blackbox.settings import Settings
from blackbox.storage.applying import IntakeSlice
from tests.integration.conftest import ReaderFactory, ServiceFactory
from tests.kafkatools import TopicReader, produce, unique, wait_until

TOKEN = "test-token-0123456789abcdef"  # noqa: S105 - a test token
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def fill(service: Service, schedules: list[Schedule]) -> None:
    """Store schedules directly with the store's own intake code (offsets 0..n-1 of a
    watermark of their own, so no call is taken for a re-read of another)."""
    slice_ = IntakeSlice(unique("fill"), 0, len(schedules) - 1, list(enumerate(schedules)))
    service.store.apply([slice_], now_ms())


def api(service: Service) -> httpx.Client:
    assert service.endpoints is not None
    return httpx.Client(base_url=f"http://127.0.0.1:{service.endpoints.port}", timeout=15)


@pytest.fixture
def http(start_service: ServiceFactory) -> Iterator[tuple[Service, httpx.Client]]:
    service = start_service(BLACKBOX_API_TOKEN=TOKEN)
    with api(service) as client:
        yield service, client


def listed(client: httpx.Client, **params: Any) -> list[dict[str, Any]]:
    """Every item, following cursors page by page."""
    items: list[dict[str, Any]] = []
    cursor = None
    while True:
        query = {**params, **({"cursor": cursor} if cursor else {})}
        page = client.get("/api/v1/schedules", params=query, headers=AUTH).json()
        items += page["items"]
        cursor = page["cursor"]
        if cursor is None:
            return items


def test_listing_filters_and_pages_in_due_order(http: tuple[Service, httpx.Client]) -> None:
    """Each filter keeps what it names; paging walks every match once, by due time."""
    service, client = http
    base = now_ms() + 3_600_000
    schedules = [
        Schedule(f"@{'ab'[i % 2]}/s{i}", f"topic-{'xyz'[i % 3]}", b"v%d" % i, base + i * 1000,
                 caller=b"ab"[i % 2 : i % 2 + 1])
        for i in range(30)
    ]  # fmt: skip
    fill(service, schedules)
    everything = listed(client, limit=7)
    assert [i["blackbox_id"] for i in everything] == [s.id for s in schedules]
    assert [i["caller"] for i in listed(client, caller="b", limit=4)] == ["b"] * 15
    assert {i["topic"] for i in listed(client, topic="topic-z")} == {"topic-z"}
    assert len(listed(client, topic="topic-z")) == 10
    window = listed(client, due_from_ms=base + 5000, due_to_ms=base + 9000, limit=2)
    assert [i["due_ms"] for i in window] == [base + t * 1000 for t in range(5, 10)]
    first = everything[0]
    assert (first["id"], first["state"], first["size"], first["preview"]) == (
        "s0",
        "pending",
        2,
        "v0",
    )
    bad = client.get("/api/v1/schedules", params={"cursor": "nonsense!"}, headers=AUTH)
    assert bad.status_code == 400 and bad.json()["error"] == "bad_cursor"


def test_a_rare_filter_answers_a_partial_page_with_a_cursor(
    http: tuple[Service, httpx.Client],
) -> None:
    """A listing reads at most SCAN_BUDGET ids of the listed caller (of any, where it names
    none) per call: a rare match further on takes a second call, reached through the
    cursor, instead of one long scan."""
    service, client = http
    base = now_ms() + 3_600_000
    common = [
        Schedule(f"@c/{i}", "t", b"x", base + i, caller=b"c") for i in range(SCAN_BUDGET + 50)
    ]
    fill(service, [*common, Schedule("@c/rare", "rare", b"x", base + 10**6, caller=b"c")])
    first = client.get("/api/v1/schedules", params={"topic": "rare"}, headers=AUTH).json()
    assert first["items"] == [] and first["cursor"] is not None
    assert first["scanned"] == SCAN_BUDGET
    second = client.get("/api/v1/schedules", params={"topic": "rare", "cursor": first["cursor"]},
                        headers=AUTH).json()  # fmt: skip
    assert [i["blackbox_id"] for i in second["items"]] == ["@c/rare"]


def test_get_shows_the_whole_message_and_headers(http: tuple[Service, httpx.Client]) -> None:
    """One schedule comes with its full message (base64 when binary) and its headers; a
    listing reads only the head of each payload but tells the whole message's size."""
    service, client = http
    binary = bytes(range(256)) * 4
    headers = (("trace", b"abc"), ("raw", b"\xff\x00"), ("none", None))
    due = now_ms() + 60_000
    fill(
        service, [Schedule("@svc/bin", "t", binary, due, caller=b"svc", key=b"k", headers=headers)]
    )
    found = client.get("/api/v1/schedules/@svc/bin", headers=AUTH).json()
    assert found["value"] is None
    assert found["value_base64"] is not None
    import base64  # noqa: PLC0415

    assert base64.b64decode(found["value_base64"]) == binary
    assert found["item"]["key"] == "k"
    assert found["headers"] == [
        {"name": "trace", "value": "abc", "value_base64": None},
        {"name": "raw", "value": None, "value_base64": base64.b64encode(b"\xff\x00").decode()},
        {"name": "none", "value": None, "value_base64": None},
    ]
    big = Schedule("@svc/big", "t", b"y" * 100_000, due + 1, caller=b"svc")
    long_headers = Schedule("@svc/long", "t", b"z" * 3_000, due + 2, caller=b"svc",
                            headers=(("h", b"h" * 5_000),))  # fmt: skip
    fill(service, [big, long_headers])
    sizes = {i["blackbox_id"]: (i["size"], i["preview"][:3]) for i in listed(client, caller="svc")}
    assert sizes["@svc/big"] == (100_000, "yyy")
    assert sizes["@svc/long"] == (3_000, "zzz")  # its head holds no message: read whole
    missing = client.get("/api/v1/schedules/@svc/nothing", headers=AUTH)
    assert missing.status_code == 404 and missing.json()["error"] == "not_found"


def _events(events: TopicReader, blackbox_id: str, count: int) -> list[dict[str, Any]]:
    def about() -> list[dict[str, Any]]:
        found = [orjson.loads(r.value or b"{}") for r in events.records]
        return [e for e in found if e["blackbox_id"] == blackbox_id]

    events.wait_for(lambda _records: len(about()) >= count)
    return about()


def test_cancel_answers_as_an_intake_cancel(
    http: tuple[Service, httpx.Client], reader: ReaderFactory, env: dict[str, str]
) -> None:
    """DELETE answers cancelled, already_fired or not_found, with the same event an intake
    cancel sends on the events topic; a cancelled message never arrives."""
    service, client = http
    target, events = reader(unique("target")), reader(env["BLACKBOX_EVENTS_TOPIC"])
    fill(service, [Schedule("@billing/inv-1", target.topic, b"never", now_ms() + 2_000,
                            caller=b"billing")])  # fmt: skip
    answer = client.delete("/api/v1/schedules/@billing/inv-1", headers=AUTH)
    assert (answer.status_code, answer.json()["outcome"]) == (200, "cancelled")
    event = _events(events, "@billing/inv-1", 1)[0]
    assert (event["outcome"], event["caller"], event["id"]) == ("cancelled", "billing", "inv-1")
    unknown = client.delete("/api/v1/schedules/@billing/unknown", headers=AUTH)
    assert (unknown.status_code, unknown.json()["outcome"]) == (404, "not_found")
    created = client.post("/api/v1/schedules", headers=AUTH, json={
        "caller": "billing", "envelope": {"topic": target.topic, "message": "now", "countdown": 0,
                                          "id": "inv-2"}})  # fmt: skip
    assert created.status_code == 202
    target.wait_count(1)
    fired = client.delete("/api/v1/schedules/@billing/inv-2", headers=AUTH)
    assert (fired.status_code, fired.json()["outcome"]) == (409, "already_fired")
    assert _events(events, "@billing/inv-2", 2)[-1]["outcome"] == "already_fired"
    target.wait_for(lambda _r: now_ms() > event["at_ms"] + 3_000, timeout=10)  # past its due
    assert [r.value for r in target.records] == [b"now"]


def test_reschedule_moves_a_message_earlier_and_later(
    http: tuple[Service, httpx.Client], reader: ReaderFactory, env: dict[str, str]
) -> None:
    """A rescheduled message arrives at its new time, not its old one; each move sends
    `updated`; an unknown id answers not_found."""
    service, client = http
    target, events = reader(unique("target")), reader(env["BLACKBOX_EVENTS_TOPIC"])
    start = now_ms()
    fill(service, [
        Schedule("@ops/early", target.topic, b"early", start + 60_000, caller=b"ops"),
        Schedule("@ops/late", target.topic, b"late", start + 1_000, caller=b"ops"),
    ])  # fmt: skip
    late = client.post(
        "/api/v1/schedules/@ops/late/reschedule", json={"countdown": 5}, headers=AUTH
    )
    early = client.post("/api/v1/schedules/@ops/early/reschedule", json={"countdown": 2},
                        headers=AUTH)  # fmt: skip
    assert late.json()["outcome"] == early.json()["outcome"] == "updated"
    records = target.wait_count(2, timeout=20)
    arrived = {r.value: r.received_ms - start for r in records}
    assert 1_500 < arrived[b"early"] < 10_000
    assert arrived[b"late"] > 4_500
    assert [e["outcome"] for e in _events(events, "@ops/early", 1)] == ["updated"]
    gone = client.post("/api/v1/schedules/@ops/nothing/reschedule", json={"countdown": 1},
                       headers=AUTH)  # fmt: skip
    assert (gone.status_code, gone.json()["outcome"]) == (404, "not_found")
    both = client.post("/api/v1/schedules/@ops/x/reschedule", json={"countdown": 1,
                       "deliver_at": "2030-01-01T00:00:00Z"}, headers=AUTH)  # fmt: skip
    assert both.status_code == 422 and both.json()["error"] == "conflicting_fields"


def test_create_produces_to_the_intake_and_answers_the_id(
    http: tuple[Service, httpx.Client],
) -> None:
    """POST answers 202 with the id the schedule will have, which GET then finds; an
    envelope the intake would refuse for its form is refused 422 with the reason."""
    _service, client = http
    own = client.post("/api/v1/schedules", headers=AUTH, json={
        "caller": "shop", "envelope": {"topic": "orders", "message": {"n": 1}, "countdown": 600,
                                       "id": "o-1"}})  # fmt: skip
    assert own.status_code == 202 and own.json()["blackbox_id"] == "@shop/o-1"
    derived = client.post("/api/v1/schedules", headers=AUTH, json={
        "envelope": {"topic": "orders", "message": "plain", "countdown": 600}})  # fmt: skip
    blackbox_id = derived.json()["blackbox_id"]
    for created in ("@shop/o-1", blackbox_id):
        wait_until(_found(client, created), what=f"{created} stored")
    bad = client.post("/api/v1/schedules", headers=AUTH, json={"envelope": {"topic": "orders"}})
    assert bad.status_code == 422 and bad.json()["error"] == "missing_field"
    wrong = client.post("/api/v1/schedules", headers=AUTH, json={"envelope": "nope"})
    assert wrong.status_code == 422 and wrong.json()["error"] == "invalid_request"


def _found(client: httpx.Client, blackbox_id: str) -> Callable[[], bool]:
    """A condition: the API finds `blackbox_id`."""
    return lambda: client.get(f"/api/v1/schedules/{blackbox_id}", headers=AUTH).status_code == 200


def test_stats_and_gauges_count_what_is_pending(http: tuple[Service, httpx.Client]) -> None:
    """Stats and the Prometheus gauges count pending ids, per bucket ahead and per topic;
    /live, /ready and /metrics still answer on the same port."""
    service, client = http
    now = now_ms()
    fill(service, [Schedule(f"@s/{i}", "a" if i < 3 else "b", b"x", now + 90_000 + i)
                   for i in range(5)])  # fmt: skip
    stats = client.get("/api/v1/stats", headers=AUTH).json()
    assert stats["pending"] == 5 and stats["per_topic"] == {"a": 3, "b": 2}
    assert sum(b["count"] for b in stats["per_minute"]) == 5
    assert stats["per_minute"][1]["count"] == 5
    metrics = client.get("/metrics").text
    assert "blackbox_overdue_messages 0.0" in metrics
    earliest = next(line for line in metrics.splitlines()
                    if line.startswith("blackbox_earliest_due_timestamp_seconds "))  # fmt: skip
    assert abs(float(earliest.split()[1]) - (now + 90_000) / 1000) < 0.01  # 12 digits shown
    assert client.get("/live").json()["live"] is True
    assert client.get("/ready").headers["content-type"] == "application/json"
    nowhere = client.get("/nowhere")
    assert nowhere.status_code == 404 and nowhere.json()["error"] == "not_found"
    assert client.get("/api/v1/dead-letters", headers=AUTH).status_code == 200


def test_token_rules(start_service: ServiceFactory) -> None:
    """With a token, every call without it (or with a wrong one) is 401; without one,
    mutations are refused 403 unless the local-development setting opens them."""
    with api(start_service(BLACKBOX_API_TOKEN=TOKEN)) as client:
        assert client.get("/api/v1/stats").status_code == 401
        assert (
            client.get("/api/v1/stats", headers={"Authorization": "Bearer wrong"}).status_code
            == 401
        )
        assert client.get("/api/v1/stats", headers=AUTH).status_code == 200
        assert client.delete("/api/v1/schedules/@a/b").status_code == 401
        assert client.delete("/api/v1/schedules/@a/b", headers=AUTH).status_code == 404
    with api(start_service(BLACKBOX_API_READS="open")) as client:
        assert client.get("/api/v1/stats").status_code == 200
        refused = client.delete("/api/v1/schedules/@a/b")
        assert refused.status_code == 403 and "BLACKBOX_API_TOKEN" in refused.json()["reason"]
    with api(start_service(BLACKBOX_API_DEV_OPEN="true")) as client:
        assert client.delete("/api/v1/schedules/@a/b").status_code == 404


def test_the_token_is_never_logged(start_service: ServiceFactory) -> None:
    """The service logs its settings at start with the token masked."""
    import structlog  # noqa: PLC0415

    with structlog.testing.capture_logs() as logged:
        start_service(BLACKBOX_API_TOKEN=TOKEN)
    assert logged, "the service logged nothing"
    assert TOKEN not in repr(logged)


def test_recent_dead_letters_are_listed_with_their_reason(
    http: tuple[Service, httpx.Client], env: dict[str, str]
) -> None:
    """A record the intake dead-letters shows in /api/v1/dead-letters with its reason,
    read back from the dead-letter topic."""
    _service, client = http
    produce(env["KAFKA_BOOTSTRAP_SERVERS"], env["BLACKBOX_INTAKE_TOPIC"], [b"not json at all"])
    found: list[Any] = []

    def listed_dead_letter() -> bool:
        found[:] = client.get("/api/v1/dead-letters", headers=AUTH).json()["items"]
        return bool(found)

    wait_until(listed_dead_letter, what="a dead letter listed")
    items = found
    assert items[0]["reason"] == "invalid_json"
    assert items[0]["preview"] == "not json at all"


def test_a_body_too_large_is_refused_413(start_service: ServiceFactory) -> None:
    """A request body over the limit (twice the largest message, plus 64 KiB) is refused
    before it is read, with a JSON reason."""
    service = start_service(BLACKBOX_API_TOKEN=TOKEN, BLACKBOX_MAX_MESSAGE_BYTES="1000")
    with api(service) as client:
        body = b'{"envelope": {"topic": "t", "message": "' + b"x" * 70_000 + b'"}}'
        refused = client.post("/api/v1/schedules", content=body, headers=AUTH)
    assert refused.status_code == 413 and refused.json()["error"] == "too_large"


def test_redis_away_answers_503_not_500(
    broker: KafkaBroker, tmp_path: Path, env: dict[str, str]
) -> None:
    """With its Redis gone, the API answers 503 with a JSON reason, and /metrics still
    answers (without the pending gauges)."""
    server = RedisServer(free_port(), tmp_path)
    server.start()
    settings = Settings.from_env({**env, "REDIS_URL": server.url, "BLACKBOX_API_TOKEN": TOKEN})
    clients.ensure_topics(settings.kafka, settings.own_topics)
    service = Service(settings)
    service.start()
    try:
        with api(service) as client:
            assert client.get("/api/v1/stats", headers=AUTH).status_code == 200
            server.stop()
            away = client.get("/api/v1/stats", headers=AUTH)
            assert away.status_code == 503 and away.json()["error"] == "unavailable"
            metrics = client.get("/metrics")
            assert metrics.status_code == 200 and "blackbox_overdue_messages" not in metrics.text
    finally:
        service.stop()
