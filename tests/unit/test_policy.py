"""Per-caller policy: which topics, how far ahead and how large each CALLER_SERVICE may send."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from blackbox import envelope
from blackbox.envelope import ABSOLUTE_MAX_COUNTDOWN_SECONDS, CALLER_HEADER, Envelope, Limits
from blackbox.errors import DeadLetterReason, InvalidEnvelope, SettingsError
from blackbox.intake import policy
from blackbox.intake.policy import CallerPolicy, Rule
from blackbox.recurrence import Recurrence
from blackbox.schedule import first_occurrence

HOUR = 3600.0
BASE = policy.open_policy(max_horizon_seconds=HOUR, max_message_bytes=100)
BILLING = {
    "default": {"topics": ["public"]},
    "callers": {
        "billing": {"topics": ["invoices", "billing.*"], "max_message_bytes": 10},
        "reports": {"max_horizon_seconds": 60},
    },
}
POLICY_YAML = """\
default:                      # callers not listed, and records without CALLER_SERVICE
  topics: []                  # may schedule nothing
callers:
  billing:
    topics: [invoices, "billing.*"]   # exact names and shell-style patterns
    max_horizon_seconds: 2592000      # 30 days
    max_message_bytes: 65536
"""


def request(topic: str, caller: bytes | None = None, value: bytes = b"v") -> Envelope:
    """A schedule request to `topic` from `caller`, due at once."""
    return Envelope(topic, value, caller, countdown_ms=0)


def reason_of(rules: CallerPolicy, parsed: Envelope, ahead_ms: int = 0) -> DeadLetterReason:
    """The reason the policy refuses `parsed` due `ahead_ms` after receipt (fails if allowed)."""
    with pytest.raises(InvalidEnvelope) as caught:
        rules.check(parsed, 1_000 + ahead_ms, 1_000)
    return caught.value.reason


def settings_error(document: object) -> str:
    """The message of the SettingsError a policy document raises (fails if it is accepted)."""
    with pytest.raises(SettingsError) as caught:
        policy.from_document(document, BASE, "policy.yaml")
    return str(caught.value)


@pytest.mark.parametrize("topic", ["orders", "billing.eu", "x"])
@pytest.mark.parametrize("caller", [None, b"billing", b"anyone"])
def test_open_policy_allows_any_topic(topic: str, caller: bytes | None) -> None:
    """Without a policy file any caller may schedule to any topic within the service limits."""
    BASE.check(request(topic, caller), due_ms=1_000 + 3_600_000, received_ms=1_000)


def test_open_policy_keeps_the_service_limits() -> None:
    """The open policy still refuses what exceeds BLACKBOX_MAX_MESSAGE_BYTES or _COUNTDOWN."""
    assert BASE.default == Rule(("*",), HOUR, 100)
    assert reason_of(BASE, request("orders", value=b"x" * 101)) == DeadLetterReason.OVERSIZED
    assert reason_of(BASE, request("orders"), 3_600_001) == DeadLetterReason.BEYOND_HORIZON


@pytest.mark.parametrize(
    ("topic", "allowed"),
    [
        ("invoices", True),
        ("billing.eu", True),
        ("billing.eu.retry", True),
        ("billing.", True),
        ("billing", False),
        ("invoices2", False),
        ("Invoices", False),
        ("orders", False),
    ],
)
def test_topics_are_exact_names_or_patterns(topic: str, allowed: bool) -> None:
    """`invoices` allows that topic only; `billing.*` any topic starting with `billing.`."""
    rules = policy.from_document(BILLING, BASE)
    assert rules.rule_for(b"billing").allows(topic) is allowed


def test_a_topic_outside_the_rule_is_forbidden_topic() -> None:
    """Guarantee 1: scheduling outside the caller's topics is refused as forbidden_topic."""
    rules = policy.from_document(BILLING, BASE)
    rules.check(request("invoices", b"billing"), 1_000, 1_000)
    with pytest.raises(InvalidEnvelope) as caught:
        rules.check(request("orders", b"billing"), 1_000, 1_000)
    assert caught.value.reason == DeadLetterReason.FORBIDDEN_TOPIC
    assert "'billing'" in caught.value.detail


@pytest.mark.parametrize("caller", [None, b"stranger", b"Billing"])
def test_unknown_and_missing_callers_get_the_default(caller: bytes | None) -> None:
    """A caller not listed, or a record without CALLER_SERVICE, follows the default rule."""
    rules = policy.from_document(BILLING, BASE)
    assert rules.rule_for(caller) == Rule(("public",), HOUR, 100)
    rules.check(request("public", caller), 1_000, 1_000)
    assert reason_of(rules, request("invoices", caller)) == DeadLetterReason.FORBIDDEN_TOPIC


def test_fields_fall_back_to_the_default_then_to_the_base() -> None:
    """A field a caller leaves out comes from the file's default, then the service settings."""
    rules = policy.from_document(BILLING, BASE)
    assert rules.rule_for(b"billing") == Rule(("invoices", "billing.*"), HOUR, 10)
    assert rules.rule_for(b"reports") == Rule(("public",), 60.0, 100)


def test_an_empty_entry_inherits_everything() -> None:
    """`callers: {billing: }` (null in YAML) and an empty document mean the fallbacks apply."""
    rules = policy.from_document({"callers": {"billing": None}}, BASE)
    assert rules.rule_for(b"billing") == BASE.default
    assert policy.from_document({}, BASE) == CallerPolicy(BASE.default, {})


def test_a_message_over_the_callers_size_is_oversized() -> None:
    """A message larger than the caller's max_message_bytes is oversized; equal is allowed."""
    rules = policy.from_document(BILLING, BASE)
    rules.check(request("invoices", b"billing", b"x" * 10), 1_000, 1_000)
    oversized = request("invoices", b"billing", b"x" * 11)
    assert reason_of(rules, oversized) == DeadLetterReason.OVERSIZED


def test_due_beyond_the_callers_horizon_is_beyond_horizon() -> None:
    """Due further ahead than the caller's max_horizon_seconds is beyond_horizon; equal is not."""
    rules = policy.from_document(BILLING, BASE)
    rules.check(request("public", b"reports"), 1_000 + 60_000, 1_000)
    assert (
        reason_of(rules, request("public", b"reports"), 60_001) == DeadLetterReason.BEYOND_HORIZON
    )


def test_a_countdown_the_parser_accepts_may_be_beyond_the_horizon() -> None:
    """The parser takes anything within 1,000 years; the configured horizon is the policy's."""
    limits = Limits(1_048_576, frozenset())
    value = b'{"topic": "orders", "message": 1, "countdown": 631152000}'
    parsed = envelope.parse(value, [(CALLER_HEADER, b"billing")], limits)
    assert isinstance(parsed, Envelope)
    ten_years = policy.open_policy(315_576_000, 1_048_576)
    received = 1_000
    with pytest.raises(InvalidEnvelope) as caught:
        ten_years.check(parsed, parsed.due_ms(received), received)
    assert caught.value.reason == DeadLetterReason.BEYOND_HORIZON


@pytest.mark.parametrize(
    ("document", "where"),
    [
        pytest.param([], "policy.yaml: expected a mapping", id="not-a-mapping"),
        pytest.param({"defaults": {}}, "policy.yaml: expected a mapping", id="unknown-section"),
        pytest.param({"default": {"topic": []}}, "default has unknown fields", id="unknown-field"),
        pytest.param({"default": ["a"]}, "default must be a mapping", id="default-list"),
        pytest.param({"default": []}, "default must be a mapping", id="default-empty-list"),
        pytest.param({"callers": ["billing"]}, "'callers' must map", id="callers-list"),
        pytest.param({"callers": []}, "'callers' must map", id="callers-empty-list"),
        pytest.param({"callers": {"b": []}}, "callers.b must be a mapping", id="entry-empty-list"),
        pytest.param({"callers": {"b": 0}}, "callers.b must be a mapping", id="entry-zero"),
        pytest.param({"callers": {"b": "x"}}, "callers.b must be a mapping", id="entry-text"),
        pytest.param({"callers": {"b": {"topics": "x"}}}, "callers.b.topics", id="topics-text"),
        pytest.param({"callers": {"b": {"topics": [1]}}}, "callers.b.topics", id="topics-number"),
        pytest.param({"callers": {"b": {"topics": [""]}}}, "callers.b.topics", id="topics-empty"),
        pytest.param({"callers": {"b": {"topics": None}}}, "callers.b.topics", id="topics-null"),
        pytest.param({"default": {"max_message_bytes": -1}}, "default.max_message_bytes", id="neg"),
        pytest.param({"default": {"max_message_bytes": 1.5}}, "default.max_message_bytes", id="fr"),
        pytest.param({"default": {"max_message_bytes": True}}, "default.max_message_bytes", id="b"),
        pytest.param({"default": {"max_message_bytes": "1"}}, "default.max_message_bytes", id="s"),
        pytest.param({"default": {"max_pending": -1}}, "default.max_pending", id="neg-q"),
        pytest.param({"default": {"max_pending": 2.5}}, "default.max_pending", id="fr-q"),
        pytest.param({"callers": {"b": {"max_pending": "9"}}}, "callers.b.max_pending", id="s-q"),
        pytest.param({"default": {"max_horizon_seconds": -1}}, "default.max_horizon", id="neg-h"),
        pytest.param({"default": {"max_horizon_seconds": "1d"}}, "default.max_horizon", id="s-h"),
        pytest.param({"default": {"max_horizon_seconds": True}}, "default.max_horizon", id="b-h"),
        pytest.param(
            {"default": {"max_horizon_seconds": float("inf")}}, "default.max_horizon", id="inf"
        ),
        pytest.param(
            {"default": {"max_horizon_seconds": float("nan")}}, "default.max_horizon", id="nan"
        ),
        pytest.param(
            {"default": {"max_horizon_seconds": ABSOLUTE_MAX_COUNTDOWN_SECONDS + 1}},
            "default.max_horizon",
            id="beyond-1000-years",
        ),
    ],
)
def test_a_bad_document_raises_settings_error_naming_where(document: object, where: str) -> None:
    """A malformed policy refuses to load, and the error names the file and the entry."""
    message = settings_error(document)
    assert message.startswith("policy.yaml: ")
    assert where in message


def test_limits_at_their_bounds_are_accepted() -> None:
    """Zero size, zero horizon and the 1,000-year horizon are valid settings."""
    document = {"default": {"max_message_bytes": 0, "max_horizon_seconds": 0}}
    assert policy.from_document(document, BASE).default == Rule(("*",), 0.0, 0)
    longest = {"default": {"max_horizon_seconds": ABSOLUTE_MAX_COUNTDOWN_SECONDS}}
    assert policy.from_document(longest, BASE).default.max_horizon_seconds == (
        ABSOLUTE_MAX_COUNTDOWN_SECONDS
    )


def test_load_reads_yaml(tmp_path: Path) -> None:
    """A YAML policy file (comments and all, as documented) loads into rules per caller."""
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY_YAML, "utf-8")
    loaded = policy.load(str(path), BASE)
    assert loaded == CallerPolicy(
        Rule((), HOUR, 100), {"billing": Rule(("invoices", "billing.*"), 2_592_000.0, 65_536)}
    )


def test_load_reads_json(tmp_path: Path) -> None:
    """A file ending in .json is read as JSON."""
    path = tmp_path / "policy.json"
    path.write_text(json.dumps(BILLING), "utf-8")
    assert policy.load(str(path), BASE) == policy.from_document(BILLING, BASE)


def test_load_an_empty_file_is_the_base(tmp_path: Path) -> None:
    """An empty YAML file has no rules of its own: the base policy's default applies."""
    path = tmp_path / "empty.yaml"
    path.write_text("", "utf-8")
    assert policy.load(str(path), BASE) == CallerPolicy(BASE.default, {})


@pytest.mark.parametrize(
    ("name", "text"),
    [
        pytest.param("policy.yaml", "callers: [unclosed", id="bad-yaml"),
        pytest.param("policy.json", "{'callers': {}}", id="bad-json"),
        pytest.param("policy.yaml", "callers:\n  billing:\n    topic: [x]\n", id="bad-field"),
    ],
)
def test_load_a_bad_file_names_it(tmp_path: Path, name: str, text: str) -> None:
    """An unreadable or malformed policy file raises SettingsError naming the file."""
    path = tmp_path / name
    path.write_text(text, "utf-8")
    with pytest.raises(SettingsError, match=re.escape(str(path))):
        policy.load(str(path), BASE)


def test_load_a_missing_file(tmp_path: Path) -> None:
    """A missing policy file raises SettingsError naming BLACKBOX_POLICY_FILE and the path."""
    path = tmp_path / "absent.yaml"
    with pytest.raises(SettingsError, match="BLACKBOX_POLICY_FILE") as caught:
        policy.load(str(path), BASE)
    assert str(path) in str(caught.value)
    assert isinstance(caught.value.__cause__, FileNotFoundError)


def test_a_refusal_says_who_was_refused_and_the_limit() -> None:
    """Guarantee 4: the dead letter's detail names the caller (or its absence) and the limit."""
    rules = policy.from_document(BILLING, BASE)
    with pytest.raises(InvalidEnvelope) as caught:
        rules.check(request("invoices", b"billing", b"x" * 11), 1_000, 1_000)
    assert caught.value.detail == "message is 11 bytes; 'billing' may send at most 10"
    with pytest.raises(InvalidEnvelope) as caught:
        rules.check(request("public"), 1_000 + 7_200_000, 1_000)
    assert caught.value.detail == "due 7200 s ahead; no caller may schedule at most 3600 s ahead"
    with pytest.raises(InvalidEnvelope) as caught:
        rules.check(request("orders", b"reports"), 1_000, 1_000)
    assert caught.value.detail == "'reports' may not schedule to 'orders' (policy)"


def _series_check(rules: CallerPolicy, caller: bytes | None, **fields: Any) -> None:
    """Check a series starting now (epoch 1,000 ms) as the intake does."""
    series = first_occurrence(Recurrence(**fields), 1_000)
    parsed = Envelope("public", b"v", caller, recurrence=series.rule)
    rules.check(parsed, series.rule.due_of("s", series.occurrence_ms), 1_000, series)


@pytest.mark.parametrize(
    "fields",
    [{"every_ms": 60_001}, {"every_ms": 50_000, "jitter_ms": 10_001},
     {"cron": "0,30 0 * * * *"}, {"every_ms": 1_000, "start_ms": 61_001}],
    ids=["every", "every with jitter", "cron 30 s then an hour", "first beyond"],
)  # fmt: skip
def test_a_series_reaching_beyond_the_horizon_is_beyond_horizon(fields: dict[str, Any]) -> None:
    """Guarantees 4 and 8: a series whose first occurrence, or whose second counted from the
    first (jitter at its largest), lies beyond the caller's horizon is refused at intake as
    `beyond_horizon`, as a one-off due that far ahead is."""
    rules = policy.from_document(BILLING, BASE)  # reports: 60 s
    with pytest.raises(InvalidEnvelope) as caught:
        _series_check(rules, b"reports", **fields)
    assert caught.value.reason is DeadLetterReason.BEYOND_HORIZON


@pytest.mark.parametrize(
    "fields",
    [{"every_ms": 60_000}, {"every_ms": 50_000, "jitter_ms": 10_000},
     {"every_ms": 3_600_000, "limit": 1}, {"cron": "* * * * *"}],
    ids=["every", "every with jitter", "one occurrence", "minutely cron"],
)  # fmt: skip
def test_a_series_within_the_horizon_is_accepted(fields: dict[str, Any]) -> None:
    """Guarantee 8: occurrences exactly the horizon apart (jitter included), or a series of
    one occurrence, are accepted."""
    _series_check(policy.from_document(BILLING, BASE), b"reports", **fields)


def test_the_horizon_of_a_caller_falls_back_to_the_service_limit() -> None:
    """Guarantee 8: firing holds each caller's series to its policy's horizon, else to
    BLACKBOX_MAX_COUNTDOWN (the base)."""
    rules = policy.from_document(BILLING, BASE)
    assert rules.horizon_ms(b"reports") == 60_000
    assert rules.horizon_ms(b"billing") == rules.horizon_ms(None) == HOUR * 1000


def test_a_quota_falls_back_to_the_default_and_zero_sets_none() -> None:
    """`max_pending` of a caller, else of the default; 0 (or none at all) counts nothing."""
    document = {"default": {"max_pending": 10}, "callers": {"big": {"max_pending": 0}, "b": {}}}
    loaded = policy.from_document(document, BASE)
    assert loaded.rule_for(b"b").max_pending == 10
    assert loaded.rule_for(None).max_pending == 10
    assert loaded.rule_for(b"big").max_pending == 0
    assert loaded.counts_pending
    assert not policy.from_document({"callers": {"b": {}}}, BASE).counts_pending
