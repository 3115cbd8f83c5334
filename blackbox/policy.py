"""Per-caller policy: which topics each CALLER_SERVICE may schedule to, how far ahead, how large.

The policy is a YAML or JSON file named by BLACKBOX_POLICY_FILE:

    default:                      # callers not listed, and records without CALLER_SERVICE
      topics: []                  # may schedule nothing
    callers:
      billing:
        topics: [invoices, "billing.*"]   # exact names and shell-style patterns
        max_horizon_seconds: 2592000      # 30 days
        max_message_bytes: 65536

A field left out falls back to the file's `default`, then to the service-wide settings
(BLACKBOX_MAX_COUNTDOWN, BLACKBOX_MAX_MESSAGE_BYTES). Without a file every caller may
schedule to any topic within those settings. The intake, events and dead-letter topics and
internal topics (`__*`) are never targets, whatever the policy says.
"""

from __future__ import annotations

import fnmatch
import functools
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from blackbox.envelope import ABSOLUTE_MAX_COUNTDOWN_SECONDS, Envelope
from blackbox.errors import DeadLetterReason, InvalidEnvelope, SettingsError

_RULE_FIELDS = frozenset({"topics", "max_horizon_seconds", "max_message_bytes"})


@dataclass(frozen=True, slots=True)
class Rule:
    """What one caller may do."""

    topics: tuple[str, ...]
    max_horizon_seconds: float
    max_message_bytes: int

    def allows(self, topic: str) -> bool:
        return _matches(self.topics, topic)


@dataclass(frozen=True, slots=True)
class CallerPolicy:
    """The rule for each caller, and the default for everyone else."""

    default: Rule
    callers: Mapping[str, Rule] = field(default_factory=dict)

    def rule_for(self, caller: bytes | None) -> Rule:
        if caller is None:
            return self.default
        return self.callers.get(caller.decode("utf-8", "replace"), self.default)

    def check(self, envelope: Envelope, due_ms: int, received_ms: int) -> None:
        """Raise InvalidEnvelope if the caller may not schedule this."""
        rule = self.rule_for(envelope.caller)
        who = "no caller" if envelope.caller is None else repr(envelope.caller.decode())
        if not rule.allows(envelope.topic):
            raise InvalidEnvelope(
                DeadLetterReason.FORBIDDEN_TOPIC,
                f"{who} may not schedule to {envelope.topic!r} (policy)",
            )
        if len(envelope.value) > rule.max_message_bytes:
            raise InvalidEnvelope(
                DeadLetterReason.OVERSIZED,
                f"message is {len(envelope.value)} bytes; {who} may send "
                f"at most {rule.max_message_bytes}",
            )
        ahead = (due_ms - received_ms) / 1000
        if ahead > rule.max_horizon_seconds:
            raise InvalidEnvelope(
                DeadLetterReason.BEYOND_HORIZON,
                f"due {ahead:.0f} s ahead; {who} may schedule at most "
                f"{rule.max_horizon_seconds:.0f} s ahead",
            )


@functools.lru_cache(maxsize=4096)
def _matches(patterns: tuple[str, ...], topic: str) -> bool:
    """Whether a topic matches a pattern (cached: intake asks once per record)."""
    return any(fnmatch.fnmatchcase(topic, pattern) for pattern in patterns)


def open_policy(max_horizon_seconds: float, max_message_bytes: int) -> CallerPolicy:
    """The policy without a file: any topic, within the service-wide limits."""
    return CallerPolicy(Rule(("*",), max_horizon_seconds, max_message_bytes))


def load(path: str, base: CallerPolicy) -> CallerPolicy:
    """The policy in a YAML or JSON file, its gaps filled from `base`'s default rule."""
    try:
        text = Path(path).read_text("utf-8")
        document = json.loads(text) if path.endswith(".json") else yaml.safe_load(text)
    except (OSError, ValueError, yaml.YAMLError) as e:
        raise SettingsError(f"BLACKBOX_POLICY_FILE {path!r} cannot be read: {e}") from e
    return from_document(document or {}, base, path)


def from_document(document: object, base: CallerPolicy, source: str = "policy") -> CallerPolicy:
    """Build a CallerPolicy from its parsed document; SettingsError names the faulty entry."""
    if not isinstance(document, dict) or set(document) - {"default", "callers"}:
        raise SettingsError(f"{source}: expected a mapping with 'default' and 'callers'")
    default = _rule(_or_empty(document.get("default")), base.default, f"{source}: default")
    callers = _or_empty(document.get("callers"))
    if not isinstance(callers, dict):
        raise SettingsError(f"{source}: 'callers' must map caller names to rules")
    rules = {
        str(name): _rule(_or_empty(entry), default, f"{source}: callers.{name}")
        for name, entry in callers.items()
    }
    return CallerPolicy(default, rules)


def _or_empty(entry: object) -> object:
    """An entry left empty in YAML (null) inherits everything; `[]`, `0` or `""` are errors."""
    return {} if entry is None else entry


def _rule(entry: object, fallback: Rule, where: str) -> Rule:
    if not isinstance(entry, dict):
        raise SettingsError(f"{where} must be a mapping")
    unknown = set(entry) - _RULE_FIELDS
    if unknown:
        raise SettingsError(f"{where} has unknown fields {sorted(unknown)}")
    rule = fallback
    if "topics" in entry:
        rule = replace(rule, topics=_topics(entry["topics"], where))
    if "max_horizon_seconds" in entry:
        rule = replace(rule, max_horizon_seconds=_horizon(entry["max_horizon_seconds"], where))
    if "max_message_bytes" in entry:
        rule = replace(rule, max_message_bytes=_size(entry["max_message_bytes"], where))
    return rule


def _topics(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(t, str) and t for t in value):
        raise SettingsError(f"{where}.topics must be a list of topic names or patterns")
    return tuple(value)


def _horizon(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise SettingsError(f"{where}.max_horizon_seconds must be a number of seconds")
    if not 0 <= value <= ABSOLUTE_MAX_COUNTDOWN_SECONDS:
        raise SettingsError(f"{where}.max_horizon_seconds must be 0 to 1,000 years")
    return float(value)


def _size(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise SettingsError(f"{where}.max_message_bytes must be a whole number >= 0")
    return value
