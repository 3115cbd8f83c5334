"""Series through the HTTP API and the command line, on the real stack: created and checked
as the intake checks them, listed apart with their rule and next occurrences, paused,
resumed and cancelled through the intake topic, each answered as the intake answered."""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import httpx
import orjson
import pytest

from blackbox.clock import now_ms
from tests.integration.conftest import ReaderFactory, ServiceFactory, cli_of
from tests.integration.test_api import AUTH, TOKEN, api
from tests.integration.test_api_callers import BILLING, READER, SHOP, _auth, _tokens_file
from tests.kafkatools import TopicReader, unique, wait_until

pytestmark = pytest.mark.both_store_modes  # the storage-touching tests: both modes

BERLIN = ZoneInfo("Europe/Berlin")


def _create(client: httpx.Client, caller: str, envelope: dict[str, Any],
            headers: dict[str, str] = AUTH) -> httpx.Response:  # fmt: skip
    return client.post("/api/v1/schedules", headers=headers,
                       json={"caller": caller, "envelope": envelope})  # fmt: skip


def _hold(client: httpx.Client, blackbox_id: str, verb: str,
          headers: dict[str, str] = AUTH) -> tuple[int, str]:  # fmt: skip
    answer = client.post(f"/api/v1/schedules/{blackbox_id}/{verb}", headers=headers)
    return answer.status_code, answer.json().get("outcome") or answer.json()["error"]


def _series(client: httpx.Client, headers: dict[str, str] = AUTH) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = client.get("/api/v1/series", headers=headers).json()["items"]
    return items


def _ids(client: httpx.Client, **params: str) -> list[str]:
    page = client.get("/api/v1/schedules", params=params, headers=AUTH).json()
    return [i["blackbox_id"] for i in page["items"]]


def test_a_series_is_created_listed_held_and_ended_through_the_api(
    start_service: ServiceFactory, reader: ReaderFactory, env: dict[str, str]
) -> None:
    """Guarantee 8: a series created through the API is listed apart from one-off schedules
    with its rule and its next occurrences (09:00 on weekdays in Berlin); pause and resume
    answer through the intake and show in the listing; a one-off answers not_recurring, an
    unknown id not_found, a cancelled or completed series 409; a rule the intake would
    refuse is refused 422 with the intake's reason."""
    service = start_service(BLACKBOX_API_TOKEN=TOKEN)
    events = reader(env["BLACKBOX_EVENTS_TOPIC"])
    target = unique("series")
    daily = {"id": "daily", "topic": target, "message": "run", "cron": "0 9 * * 1-5",
             "timezone": "Europe/Berlin", "limit": 5, "missed": "skip"}  # fmt: skip
    with api(service) as client:
        created = _create(client, "ops", daily)
        assert (created.status_code, created.json()["blackbox_id"]) == (202, "@ops/daily")
        once = {"id": "once", "topic": target, "message": "x", "countdown": 3600}
        assert _create(client, "ops", once).status_code == 202
        wait_until(lambda: service.store.counts()[0] == 2, what="both stored")

        listed = _series(client)
        assert [i["blackbox_id"] for i in listed] == ["@ops/daily"]
        view = listed[0]["series"]
        assert view["rule"] == {"cron": "0 9 * * 1-5", "every": None, "timezone": "Europe/Berlin",
                                "start": None, "end": None, "limit": 5, "jitter": 0.0,
                                "missed": "skip", "grace": 60.0}  # fmt: skip
        assert (view["fired"], view["paused"], len(view["next"])) == (0, False, 5)
        _check_weekday_mornings(view["next"])
        assert _ids(client, kind="one_off") == ["@ops/once"]
        assert sorted(_ids(client)) == ["@ops/daily", "@ops/once"]
        detail = client.get("/api/v1/schedules/@ops/daily", headers=AUTH).json()
        assert detail["item"]["series"] == view

        assert _hold(client, "@ops/daily", "pause") == (200, "paused")
        assert _series(client)[0]["series"]["paused"] is True
        assert _hold(client, "@ops/daily", "resume") == (200, "resumed")
        assert _series(client)[0]["series"]["paused"] is False
        assert _hold(client, "@ops/once", "pause") == (409, "not_recurring")
        assert _hold(client, "@ops/nothing", "resume") == (404, "not_found")
        assert client.delete("/api/v1/schedules/@ops/daily", headers=AUTH).status_code == 200
        assert _hold(client, "@ops/daily", "pause") == (409, "cancelled")

        tick = {"id": "tick", "topic": target, "message": "t", "every": 1, "limit": 1}
        assert _create(client, "ops", tick).status_code == 202
        events.wait_for(lambda _: "completed" in _outcomes(events, "@ops/tick"))
        assert _hold(client, "@ops/tick", "pause") == (409, "already_fired")
        _check_refusals(client, target)


def _outcomes(events: TopicReader, blackbox_id: str) -> list[str]:
    found = [orjson.loads(r.value or b"{}") for r in events.records]
    return [e["outcome"] for e in found if e["blackbox_id"] == blackbox_id]


def _check_weekday_mornings(occurrences: list[dict[str, Any]]) -> None:
    """Each listed occurrence is 09:00 in Berlin on a weekday, later than now, in order,
    its RFC 3339 texts (UTC, and Berlin's with its offset) the same instant as its epoch
    ms."""
    instants = [o["occurrence_ms"] for o in occurrences]
    assert instants == sorted(set(instants)) and instants[0] > now_ms()
    for occurrence in occurrences:
        local = datetime.fromtimestamp(occurrence["occurrence_ms"] / 1000, BERLIN)
        assert (local.hour, local.minute, local.weekday() < 5) == (9, 0, True)
        utc = datetime.fromisoformat(occurrence["utc"])
        assert utc.timestamp() * 1000 == occurrence["occurrence_ms"]
        assert occurrence["utc"].endswith("Z")
        assert datetime.fromisoformat(occurrence["local"]) == utc
        _check_berlin_morning(occurrence["local"])
        assert occurrence["due_ms"] == occurrence["occurrence_ms"]  # no jitter asked


def _check_berlin_morning(text: str) -> None:
    """An RFC 3339 time that reads 09:00 in Berlin, with the offset Berlin has then."""
    shown = datetime.fromisoformat(text)
    assert (shown.hour, shown.minute) == (9, 0), text
    assert shown.utcoffset() == shown.astimezone(BERLIN).utcoffset(), text


def _check_refusals(client: httpx.Client, target: str) -> None:
    """Rules the intake would dead-letter are refused 422 with its reason, nothing sent."""
    base = {"id": "bad", "topic": target, "message": "x"}
    refused: list[tuple[dict[str, Any], str]] = [
        ({"cron": "61 * * * *"}, "invalid_recurrence"),
        ({"every": 60, "timezone": "Mars/Olympus"}, "unknown_timezone"),
        ({"every": 60, "end": "2020-01-01T00:00:00Z"}, "invalid_recurrence"),
        ({"every": 60, "countdown": 5}, "conflicting_fields"),
        ({"every": 60, "missed": "sometimes"}, "invalid_recurrence"),
    ]
    for fields, reason in refused:
        answer = _create(client, "ops", {**base, **fields})
        assert (answer.status_code, answer.json()["error"]) == (422, reason), fields


def test_series_are_listed_and_held_only_for_the_tokens_callers(
    start_service: ServiceFactory, tmp_path: Path
) -> None:
    """Guarantee 7: a caller's token lists its own series only, cannot pause another
    caller's (not found for it), and a read-only token cannot pause at all."""
    service = start_service(BLACKBOX_API_TOKENS_FILE=_tokens_file(tmp_path / "tokens.yaml"))
    target = unique("owned")
    with api(service) as client:
        # Starting in an hour: a series firing now would be in flight, not listed as due.
        start = now_ms() // 1000 + 3600
        for token, name in ((BILLING, "bill"), (SHOP, "shop")):
            body = {"envelope": {"id": name, "topic": target, "message": name, "every": 3600,
                                 "start": start}}  # fmt: skip
            assert client.post("/api/v1/schedules", json=body,
                               headers=_auth(token)).status_code == 202  # fmt: skip
        wait_until(lambda: service.store.counts()[0] == 2, what="both stored")
        assert [i["blackbox_id"] for i in _series(client, _auth(BILLING))] == ["@billing/bill"]
        assert _hold(client, "@shop/shop", "pause", _auth(BILLING)) == (404, "not_found")
        assert _hold(client, "@billing/bill", "pause", _auth(READER))[0] == 403
        assert _hold(client, "@billing/bill", "pause", _auth(BILLING)) == (200, "paused")


def test_the_command_line_sends_lists_pauses_and_resumes_a_series(
    start_service: ServiceFactory, env: dict[str, str], tmp_path: Path
) -> None:
    """`blackbox send --every ... --wait` is answered `scheduled`; `blackbox list --series`
    shows each rule under a header naming its columns, a Berlin series' next run at 09:00
    with Berlin's offset; `blackbox pause` and `resume` print the intake's answers."""
    service = start_service(BLACKBOX_API_TOKEN=TOKEN)
    run = cli_of(service, env, TOKEN, tmp_path)

    start = str(now_ms() // 1000 + 3600)  # nothing fires while the test runs
    code, sent = run("send", "send", "--topic", unique("cli"), "--every", "3600", "--limit", "4",
                     "--start", start, "--id", "hourly", "--caller", "cli", "--wait", "30",
                     '"x"')  # fmt: skip
    assert code == 0 and "scheduled" in sent.splitlines(), sent
    code, sent = run("send-berlin", "send", "--topic", unique("cli"), "--cron", "0 9 * * 1-5",
                     "--timezone", "Europe/Berlin", "--id", "report", "--caller", "cli",
                     "--wait", "30", '"x"')  # fmt: skip
    assert code == 0 and "scheduled" in sent.splitlines(), sent
    code, listed = run("list", "list", "--series")
    assert code == 0, listed
    header, *rows = (re.split(r"\s{2,}", line) for line in listed.splitlines())
    assert header == ["NEXT RUN (SERIES' ZONE)", "ID", "RULE", "ZONE", "FIRED", "LIMIT", "STATE"]
    by_id = {row[1]: row for row in rows}
    assert by_id["@cli/hourly"][2:] == ["every 3600 s", "UTC", "0", "4", "active"]
    assert by_id["@cli/report"][2:] == [
        "cron '0 9 * * 1-5'",
        "Europe/Berlin",
        "0",
        "none",
        "active",
    ]
    _check_berlin_morning(by_id["@cli/report"][0])
    for verb in ("pause", "resume"):
        code, answered = run(verb, verb, "hourly", "--caller", "cli", "--wait", "30")
        assert code == 0 and f"{verb}d" in answered.splitlines(), answered
