"""Per-caller policy: a violation is dead-lettered with an answer and never reaches its target."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from blackbox.envelope import CALLER_HEADER
from blackbox.errors import DeadLetterReason
from tests.integration.conftest import ReaderFactory, ServiceFactory, settle
from tests.kafkatools import produce, unique

POLICY = """
default:
  topics: []
callers:
  billing:
    topics: ["{allowed}", "billing-*"]
    max_horizon_seconds: 3600
    max_message_bytes: 64
"""


def _send(env: dict[str, str], document: dict[str, Any], caller: str | None) -> None:
    headers = [] if caller is None else [(CALLER_HEADER, caller.encode())]
    produce(env["KAFKA_BOOTSTRAP_SERVERS"], env["BLACKBOX_INTAKE_TOPIC"],
            [orjson.dumps(document)], headers)  # fmt: skip


def test_policy_violations_are_dead_lettered_with_an_answer_and_never_delivered(
    start_service: ServiceFactory, reader: ReaderFactory, env: dict[str, str], tmp_path: Path
) -> None:
    """Topics, horizon and size per caller; unknown and anonymous callers follow the default."""
    allowed, forbidden = unique("allowed"), unique("forbidden")
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY.format(allowed=allowed))
    service = start_service(BLACKBOX_POLICY_FILE=str(policy))
    dlq, events = reader(env["BLACKBOX_DLQ_TOPIC"]), reader(env["BLACKBOX_EVENTS_TOPIC"])
    refused = [
        ({"topic": forbidden, "message": "x", "countdown": 0, "id": "r1"}, "billing",
         DeadLetterReason.FORBIDDEN_TOPIC),
        ({"topic": allowed, "message": "x", "countdown": 7200, "id": "r2"}, "billing",
         DeadLetterReason.BEYOND_HORIZON),
        ({"topic": allowed, "message": "x" * 100, "countdown": 0, "id": "r3"}, "billing",
         DeadLetterReason.OVERSIZED),
        ({"topic": allowed, "message": "x", "countdown": 0, "id": "r4"}, "stranger",
         DeadLetterReason.FORBIDDEN_TOPIC),
        ({"topic": allowed, "message": "x", "countdown": 0, "id": "r5"}, None,
         DeadLetterReason.FORBIDDEN_TOPIC),
        ({"topic": env["BLACKBOX_EVENTS_TOPIC"], "message": "x", "countdown": 0, "id": "r6"},
         "billing", DeadLetterReason.FORBIDDEN_TOPIC),
    ]  # fmt: skip
    for document, caller, _ in refused:
        _send(env, document, caller)
    _send(env, {"topic": allowed, "message": "ok", "countdown": 0}, "billing")
    _send(env, {"topic": "billing-invoices", "message": "ok", "countdown": 0}, "billing")

    allowed_reader = reader(allowed)
    allowed_reader.wait_count(1, timeout=30)
    reader("billing-invoices").wait_count(1, timeout=30)
    letters = dlq.wait_count(len(refused), timeout=30)

    settle(service)
    (delivered,) = allowed_reader.read_to_end()
    assert delivered.value == b"ok"
    reasons = [r.header("blackbox-dlq-reason") for r in sorted(letters, key=lambda r: r.offset)]
    assert reasons == [reason.value for _, _, reason in refused]
    answers = events.wait_for(
        lambda records: sum(b'"dead_lettered"' in (r.value or b"") for r in records) == 6
    )
    dead = [orjson.loads(r.value or b"") for r in answers if b'"dead_lettered"' in (r.value or b"")]
    assert sorted((e["id"], e["reason"]) for e in dead) == sorted(
        (d["id"], reason.value) for d, _, reason in refused
    )
    assert reader(forbidden).read_to_end() == []


def test_a_bad_policy_file_stops_the_service_with_a_clear_error(
    env: dict[str, str], tmp_path: Path
) -> None:
    """A policy that cannot be read is a usage error naming the file and the entry."""
    from tests.process import BlackboxProcess  # noqa: PLC0415

    policy = tmp_path / "policy.yaml"
    policy.write_text("callers:\n  billing:\n    topics: orders\n")
    process = BlackboxProcess({**env, "BLACKBOX_POLICY_FILE": str(policy)}, tmp_path / "run.log")

    assert process.wait() == 2
    assert "callers.billing.topics must be a list" in process.output()
