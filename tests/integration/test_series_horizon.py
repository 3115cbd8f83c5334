"""Series and the horizon (guarantees 4 and 8): no occurrence of a series is stored further
ahead than its caller may schedule (the policy's `max_horizon_seconds`, else
BLACKBOX_MAX_COUNTDOWN), at intake, through the API or when an occurrence fires."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import redis

from blackbox.clock import now_ms
from blackbox.envelope import CALLER_HEADER
from blackbox.errors import DeadLetterReason
from blackbox.recurrence import Recurrence
from blackbox.schedule import Schedule, first_occurrence
from tests.integration.conftest import ReaderFactory, ServiceFactory, settle
from tests.integration.test_api import AUTH, TOKEN, api, fill
from tests.kafkatools import TopicReader, produce, unique, wait_until

_R = DeadLetterReason
TEN_YEARS_S = 315_360_000


def _policy(tmp_path: Path, horizon_s: int) -> str:
    path = tmp_path / "policy.yaml"
    path.write_text(f"callers:\n  billing:\n    max_horizon_seconds: {horizon_s}\n")
    return str(path)


def _events(events: TopicReader, outcome: str) -> dict[str, dict[str, Any]]:
    """The events of one outcome, by blackbox id."""
    found = (orjson.loads(r.value or b"{}") for r in events.records)
    return {e["blackbox_id"]: e for e in found if e["outcome"] == outcome}


def test_a_series_further_apart_than_the_horizon_is_refused_at_intake(
    start_service: ServiceFactory, reader: ReaderFactory, env: dict[str, str], tmp_path: Path
) -> None:
    """Guarantees 4 and 8: with `max_horizon_seconds: 60`, a series `every: 315360000`
    (its first occurrence now, its second ten years on) is dead-lettered `beyond_horizon`
    as a one-off due in ten years is; nothing of it is stored or delivered."""
    service = start_service(BLACKBOX_POLICY_FILE=_policy(tmp_path, 60))
    target = unique("decade")
    document = {"id": "decade", "topic": target, "message": "m", "every": TEN_YEARS_S}
    produce(env["KAFKA_BOOTSTRAP_SERVERS"], env["BLACKBOX_INTAKE_TOPIC"],
            [orjson.dumps(document)], [(CALLER_HEADER, b"billing")])  # fmt: skip

    (refused,) = reader(env["BLACKBOX_DLQ_TOPIC"]).wait_count(1)
    assert refused.header("blackbox-dlq-reason") == _R.BEYOND_HORIZON
    settle(service)
    assert reader(target).read_to_end() == []


def test_a_series_created_through_the_api_keeps_to_the_global_horizon(
    start_service: ServiceFactory, reader: ReaderFactory, env: dict[str, str]
) -> None:
    """Guarantees 4 and 8: without a policy, `every: 31000000000` created through the HTTP
    API is dead-lettered `beyond_horizon` by the intake (BLACKBOX_MAX_COUNTDOWN, ten years,
    is the horizon): no occurrence is stored 982 years ahead with a payload TTL to match."""
    service = start_service(BLACKBOX_API_TOKEN=TOKEN)
    body = {"caller": "web", "envelope": {"id": "ages", "topic": unique("ages"),
                                          "message": "run", "every": 31_000_000_000}}  # fmt: skip
    with api(service) as client:
        answer = client.post("/api/v1/schedules", json=body, headers=AUTH)
    assert answer.status_code == 202, answer.text  # the intake applies the policy

    (refused,) = reader(env["BLACKBOX_DLQ_TOPIC"]).wait_count(1)
    assert refused.header("blackbox-dlq-reason") == _R.BEYOND_HORIZON
    settle(service)


def test_an_occurrence_beyond_the_horizon_ends_its_series_when_the_one_before_fires(
    start_service: ServiceFactory, reader: ReaderFactory, env: dict[str, str], tmp_path: Path,
    redis_client: redis.Redis,
) -> None:  # fmt: skip
    """Guarantee 8: series stored before their callers' horizon shrank (or whose cron rule
    spaces occurrences unevenly) fire the occurrence due, then end with a `completed` event
    of reason `beyond_horizon` where the next one would lie beyond the caller's horizon
    (billing's 60 s) or BLACKBOX_MAX_COUNTDOWN (120 s, for everyone else); a series within
    it goes on, its payload kept no longer than its horizon and the grace."""
    service = start_service(BLACKBOX_POLICY_FILE=_policy(tmp_path, 60),
                            BLACKBOX_MAX_COUNTDOWN="120")  # fmt: skip
    target, events = reader(unique("horizon")), reader(env["BLACKBOX_EVENTS_TOPIC"])
    at = now_ms()
    series = {"@billing/far": (b"billing", 90), "@web/near": (b"web", 90),
              "@web/farther": (b"web", 200)}  # fmt: skip
    fill(service, [
        Schedule(i, target.topic, b"m", at, caller=caller,
                 series=first_occurrence(Recurrence(every_ms=every * 1000), at))
        for i, (caller, every) in series.items()
    ])  # fmt: skip

    target.wait_count(3)
    events.wait_for(lambda _: len(_events(events, "completed")) >= 2)
    completed = _events(events, "completed")
    assert set(completed) == {"@billing/far", "@web/farther"}
    assert {e["reason"] for e in completed.values()} == {_R.BEYOND_HORIZON}
    wait_until(lambda: service.store.counts() == (1, 0), what="only the near series pending")
    near = service.store.layout.keys_of("@web/near").payload("@web/near")
    assert 0 < redis_client.ttl(near) <= 120 + service.store.grace_seconds
