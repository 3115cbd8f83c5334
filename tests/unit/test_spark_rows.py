"""The schedule job's per-row verdicts (blackbox.spark.rows): pure, no Spark started."""

from __future__ import annotations

import sys

import orjson
import pytest

from blackbox import envelope
from blackbox.cli import main as cli
from blackbox.envelope import Limits
from blackbox.exits import EXIT_USAGE
from blackbox.intake.policy import CallerPolicy, Rule, open_policy
from blackbox.spark.rows import DueKind, Judge, MessageKind, jitter_ms, rfc3339, wall_clock_ms

NOW_MS = 1_800_000_000_000
LIMITS = Limits(max_value_bytes=1000, forbidden_topics=frozenset({"blackbox"}))


def judge(kind: DueKind = DueKind.DELAY, message: MessageKind = MessageKind.TEXT,
          jitter: int = 0, policy: CallerPolicy | None = None) -> Judge:  # fmt: skip
    return Judge("bulk", LIMITS, policy or open_policy(86_400, 1000), message, kind, jitter)


def test_a_good_row_becomes_the_envelope_the_intake_reads() -> None:
    """Bulk rows are judged by the service's own parser: the record sent is what intake takes."""
    verdict = judge().row({"id": "u1", "topic": "t", "message": "hi", "due": 5, "key": 7}, NOW_MS)
    assert verdict.reason is None and verdict.value is not None
    request = envelope.parse(verdict.value, [("CALLER_SERVICE", b"bulk")], LIMITS)
    assert isinstance(request, envelope.Envelope)
    assert (request.topic, request.value, request.key) == ("t", b"hi", b"7")
    assert verdict.blackbox_id == "@bulk/u1"
    assert verdict.due_ms == NOW_MS + 5000


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        ({"id": None, "topic": "t", "message": "m", "due": 1}, "invalid_id"),
        ({"id": "a", "topic": None, "message": "m", "due": 1}, "wrong_type"),
        ({"id": "a", "topic": "blackbox", "message": "m", "due": 1}, "forbidden_topic"),
        ({"id": "a", "topic": "bad topic", "message": "m", "due": 1}, "invalid_topic"),
        ({"id": "a", "topic": "t", "message": "m", "due": -1}, "invalid_countdown"),
        ({"id": "a", "topic": "t", "message": "m", "due": None}, "wrong_type"),
        ({"id": "a", "topic": "t", "message": "m" * 2000, "due": 1}, "oversized"),
        ({"id": "a", "topic": "t", "message": "m", "due": 10**6}, "beyond_horizon"),
        ({"id": "a", "topic": "t", "message": None, "due": 1}, "missing_field"),
    ],
)
def test_bad_rows_are_rejected_with_the_dead_letter_reason(
    row: dict[str, object], reason: str
) -> None:
    """No silent loss in bulk: a bad row gets the reason the intake would dead-letter it for."""
    verdict = judge().row(row, NOW_MS)
    assert verdict.reason == reason and verdict.value is None and verdict.detail


def test_the_callers_policy_applies() -> None:
    """Per-caller policy (topics allowed) is checked with the service's CallerPolicy."""
    policy = CallerPolicy(Rule(("allowed.*",), 86_400, 1000))
    row = {"id": "a", "topic": "other", "message": "m", "due": 1}
    assert judge(policy=policy).row(row, NOW_MS).reason == "forbidden_topic"


def test_struct_json_and_binary_messages_are_delivered_as_given() -> None:
    """A struct (serialised to JSON by Spark) is delivered as that JSON; bytes byte for byte."""
    as_json = judge(message=MessageKind.JSON).row(
        {"id": "a", "topic": "t", "message": '{"user":1}', "due": 0}, NOW_MS)  # fmt: skip
    assert orjson.loads(as_json.value or b"")["message"] == {"user": 1}
    raw = judge(message=MessageKind.BINARY).row(
        {"id": "a", "topic": "t", "message": b"\x00\xff", "due": 0}, NOW_MS)  # fmt: skip
    request = envelope.parse(raw.value or b"", None, LIMITS)
    assert isinstance(request, envelope.Envelope) and request.value == b"\x00\xff"


def test_jitter_is_stable_and_spreads_within_its_window() -> None:
    """The same id gets the same offset on a re-run; 10,000 ids cover the window evenly."""
    offsets = [jitter_ms(f"id-{i}", 1000) for i in range(10_000)]
    assert offsets == [jitter_ms(f"id-{i}", 1000) for i in range(10_000)]
    assert min(offsets) >= 0 and max(offsets) < 1000
    tenths = [sum(1 for o in offsets if o // 100 == t) for t in range(10)]
    assert all(800 < n < 1200 for n in tenths), tenths


def test_an_instant_is_exact_to_the_millisecond() -> None:
    """Epoch ms go out as RFC 3339 text the parser reads back to the same millisecond."""
    row = {"id": "a", "topic": "t", "message": "m", "due": NOW_MS + 123_457}
    verdict = judge(DueKind.AT_MS).row(row, NOW_MS)
    assert verdict.due_ms == NOW_MS + 123_457
    assert rfc3339(1) == "1970-01-01T00:00:00.001+00:00"


def test_wall_clock_time_is_read_in_the_rows_zone() -> None:
    """'9:00 in each user's zone': the same local time is a different instant per zone."""
    paris = wall_clock_ms("2026-11-24 09:00", "Europe/Paris")
    tokyo = wall_clock_ms("2026-11-24 09:00", "Asia/Tokyo")
    assert rfc3339(paris) == "2026-11-24T08:00:00.000+00:00"
    assert paris - tokyo == 8 * 3600 * 1000
    row = {"id": "a", "topic": "t", "message": "m", "due": "2026-11-24 09:00", "zone": "Mars/X"}
    assert judge(DueKind.WALL_CLOCK).row(row, NOW_MS).reason == "invalid_deliver_at"


def test_spark_commands_without_pyspark_say_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The extra is optional: without it `blackbox spark ...` exits 2 naming the install."""
    monkeypatch.setitem(sys.modules, "pyspark", None)
    assert cli.main(["spark", "audit", "--out", "unused"]) == EXIT_USAGE
    assert "pip install 'blackbox[spark]'" in capsys.readouterr().err
