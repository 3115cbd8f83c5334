"""Series through the user-facing paths (HTTP API, client, command line), attacked as a
careless user and an attacker would: each test pins one defect found against a running
service."""

from __future__ import annotations

from pathlib import Path

import httpx
import orjson
import pytest
import redis

from blackbox.client import Repeat, envelope
from blackbox.clock import now_ms
from blackbox.envelope import CALLER_HEADER, Limits, parse
from blackbox.errors import InvalidEnvelope
from blackbox.recurrence import Recurrence
from blackbox.schedule import Schedule, first_occurrence
from blackbox.service import Service
from tests.integration.conftest import ServiceFactory
from tests.integration.test_api import AUTH, TOKEN, api, fill
from tests.kafkatools import unique
from tests.process import BlackboxProcess


def _series(service: Service, *names: str) -> list[str]:
    """Store one hourly series per name (caller `web`), first due in an hour (nothing
    fires while the test runs); return their ids."""
    at = now_ms()
    rule = Recurrence(every_ms=3_600_000, start_ms=at + 3_600_000, limit=5)
    stored = first_occurrence(rule, at)
    ids = [f"@web/{name}" for name in names]
    fill(service, [Schedule(i, "reports", b"run", stored.occurrence_ms + n, caller=b"web",
                            series=stored) for n, i in enumerate(ids)])  # fmt: skip
    return ids


def _overwrite(service: Service, blackbox_id: str, payload: bytes) -> None:
    """Write `payload` in place of a stored schedule's payload, its due entry kept."""
    client = redis.Redis.from_url(service.settings.redis_url)
    try:
        client.set(service.store.layout.keys_of(blackbox_id).payload(blackbox_id), payload)
    finally:
        client.close()


def _listed(client: httpx.Client, path: str) -> tuple[int, list[str]]:
    answer = client.get(path, params={"limit": 100}, headers=AUTH)
    if answer.status_code != 200:
        return answer.status_code, []
    return 200, [i["blackbox_id"] for i in answer.json()["items"]]


def test_a_non_finite_number_in_a_series_is_refused_not_dropped(
    start_service: ServiceFactory,
) -> None:
    """Guarantee 4: `limit: 1e400` (or NaN, Infinity in any series field) is refused 422,
    as the intake refuses those bytes; it is never sent on as null, which made a 202 and a
    series without its limit, end or start."""
    service = start_service(BLACKBOX_API_TOKEN=TOKEN)
    body = ('{"caller": "web", "envelope": {"id": "capped", "topic": "reports", '
            '"message": "run", "every": 3600, "limit": 1e400}}')  # fmt: skip
    with api(service) as client:
        answer = client.post("/api/v1/schedules", content=body.encode(),
                             headers={**AUTH, "Content-Type": "application/json"})  # fmt: skip
    assert answer.status_code == 422, answer.text


def test_the_client_refuses_a_non_finite_start_or_end() -> None:
    """Guarantee 4: `Repeat(start=inf)` or `end=nan` is refused by the client (ValueError),
    as `every=inf` is; it never becomes `"start": null`, a series that starts now and
    never ends (`blackbox send --every 60 --start 1e400` was answered `scheduled`)."""
    for bound in ({"start": float("inf")}, {"end": float("nan")}):
        with pytest.raises(ValueError, match=r"start|end"):
            orjson.dumps(envelope("reports", "run", schedule_id="s",
                                  repeat=Repeat(every=60, **bound)))  # type: ignore[arg-type]  # fmt: skip


def test_a_pause_of_an_id_too_long_is_refused_at_once(start_service: ServiceFactory) -> None:
    """Guarantee 4: pausing an id the intake refuses (over 255 characters, within the API's
    1,024) answers 422 invalid_id as soon as the intake refused it, as an id with a NUL
    does; not 504 `no_answer_yet` (the request will be applied in order) after 2 x
    BLACKBOX_DELIVERY_TIMEOUT."""
    service = start_service(BLACKBOX_API_TOKEN=TOKEN, BLACKBOX_DELIVERY_TIMEOUT="2")
    with api(service) as client:
        answer = client.post(f"/api/v1/schedules/@web/{'y' * 300}/pause", headers=AUTH)
    assert (answer.status_code, answer.json()["error"]) == (422, "invalid_id"), answer.text


def test_a_corrupt_series_payload_over_2_kb_leaves_the_listings_working(
    start_service: ServiceFactory,
) -> None:
    """Guarantee 4: one series whose stored payload is garbage (3,000 bytes) is left out of
    `GET /series` and `GET /schedules`, which list the rest, as a short garbage payload
    is; it did make every listing reaching it answer 422 `unreadable`."""
    service = start_service(BLACKBOX_API_TOKEN=TOKEN)
    broken, kept = _series(service, "broken", "kept")
    _overwrite(service, broken, b"\x02" + b"\xa0" * 3000)
    with api(service) as client:
        assert _listed(client, "/api/v1/series") == (200, [kept])
        assert _listed(client, "/api/v1/schedules") == (200, [kept])


def test_a_series_whose_view_cannot_be_computed_is_no_500(start_service: ServiceFactory) -> None:
    """Guarantee 4: a stored series that decodes but whose occurrences cannot be shown (its
    next occurrence past year 9999) is left out of `GET /series`, which lists the rest,
    and its detail is refused 422 `unreadable`: never a 500."""
    service = start_service(BLACKBOX_API_TOKEN=TOKEN)
    broken, kept = _series(service, "broken", "kept")
    stored = service.store.load(broken)
    assert stored is not None and stored.series is not None
    stored.series = type(stored.series)(stored.series.rule, 253_402_300_799_000)
    _overwrite(service, broken, stored.encode())
    with api(service) as client:
        assert _listed(client, "/api/v1/series") == (200, [kept])
        detail = client.get(f"/api/v1/schedules/{broken}", headers=AUTH)
        assert detail.status_code == 422, detail.text


def test_send_with_a_limit_over_64_bits_exits_2_without_a_traceback(
    env: dict[str, str], tmp_path: Path
) -> None:
    """`blackbox send --every 60 --limit 99999999999999999999999` exits 2 with a message
    naming --limit, as other bad series options do; not 1 with a Python traceback."""
    process = BlackboxProcess(env, tmp_path / "send.log", "send", "--topic", unique("cli"),
                              "--id", "big", "--every", "60", "--limit",
                              "99999999999999999999999", '"x"')  # fmt: skip
    code, output = process.wait(60), process.output()
    assert "Traceback" not in output, output
    assert code == 2 and "limit" in output, output


@pytest.mark.parametrize(
    ("field", "number"),
    [("limit", "1" + "0" * 30), ("limit", str(2**64)), ("limit", str(-(2**63) - 1)),
     ("every", "1" + "0" * 30), ("jitter", "-" + "1" + "0" * 30), ("limit", "1" + "0" * 400)],
    ids=["limit 10**30", "limit 2**64", "limit below -2**63", "every 10**30",
         "jitter -10**30", "limit 10**400"],
)  # fmt: skip
def test_a_number_beyond_64_bits_gets_the_intakes_reason(
    start_service: ServiceFactory, field: str, number: str
) -> None:
    """Guarantee 4: the same bad value gets the same reason on the API and at intake: a
    whole number beyond 64 bits (`limit: 10**30`) is refused 422 with the reason the intake
    gives the same JSON text (it reads such a number as a double), not `invalid_text`."""
    text = ('{"id": "big", "topic": "reports", "message": "run", "every": 3600, '
            f'"{field}": {number}}}')  # fmt: skip
    try:
        parse(text.encode(), [(CALLER_HEADER, b"web")], Limits(1_048_576, frozenset()))
    except InvalidEnvelope as e:
        intake = e.reason.value
    else:
        pytest.fail(f"the intake accepts {text}")
    service = start_service(BLACKBOX_API_TOKEN=TOKEN)
    body = f'{{"caller": "web", "envelope": {text}}}'
    with api(service) as client:
        answer = client.post("/api/v1/schedules", content=body.encode(),
                             headers={**AUTH, "Content-Type": "application/json"})  # fmt: skip
    assert (answer.status_code, answer.json()["error"]) == (422, intake), answer.text
